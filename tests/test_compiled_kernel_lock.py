"""A build of the compiled CPU kernels killed by SIGKILL leaves torch's ``lock`` file in the
extension folder: a later run removes it and loads the kernel instead of waiting forever; a build that a
live process holds for too long is not waited for, their Python twins run."""

import fcntl
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO
from torch.utils import cpp_extension

from tupe_plugin.attention import compiled_kernels

NAME = "tupe_plugin_kernels"
LOAD = ("import logging, sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); "
        "from tupe_plugin.attention import compiled_kernels as kernels; kernels.BUILD_WAIT_SECONDS = {wait}; "
        "sys.exit(0 if kernels.biased_attention_backward() is not None else 3)")


@pytest.fixture
def extensions(tmp_path):
    """A TORCH_EXTENSIONS_DIR holding a finished build of the kernel, copied with its file times (ninja has
    nothing to rebuild)."""
    if compiled_kernels.biased_attention_backward() is None:
        pytest.skip("the kernel cannot be built here (no C++ compiler or ninja)")
    built = cpp_extension._get_build_directory(NAME, verbose=False)
    shutil.copytree(built, tmp_path / NAME, ignore=shutil.ignore_patterns("lock", "tupe_plugin.lock"))
    return tmp_path


def load_in_a_new_process(extensions, wait=300):
    """Load the kernel from ``extensions`` in a child, which the test ends if it hangs."""
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions))
    return subprocess.run([sys.executable, "-c", LOAD.format(wait=wait)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=90)


def test_a_lock_left_by_a_killed_build_is_removed_and_the_kernel_loads(extensions):
    lock = extensions / NAME / "lock"
    lock.touch()
    child = load_in_a_new_process(extensions)
    assert child.returncode == 0, child.stderr[-3000:]
    assert f"{lock} was left by a build of the compiled CPU kernels that was killed" in child.stderr
    assert not lock.exists()


def test_a_build_a_live_process_holds_too_long_is_not_waited_for_and_the_message_names_the_lock(extensions):
    lock = extensions / NAME / "lock"
    lock.touch()
    with open(extensions / NAME / "tupe_plugin.lock", "a") as builder:
        fcntl.flock(builder, fcntl.LOCK_EX)
        child = load_in_a_new_process(extensions, wait=1)
    assert child.returncode == 3, child.stderr[-3000:]
    assert (f"{lock}: another process has been building the compiled CPU kernels for over 1 s"
            in child.stderr)
    assert "their slower Python twins run instead" in child.stderr
    assert lock.exists()
