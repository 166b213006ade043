"""The plugin's own errors print as one error line; other errors keep their traceback."""

import subprocess
import sys

import pytest
from conftest import REPO
from tupe_plugin.user_input.user_errors import TRACEBACK_VARIABLE, UserError, user_error_in

SCRIPT = """
import tupe_plugin
from tupe_plugin.encodings.position_config import PositionFlagError
kind = {kind!r}
if kind == "other model's run":
    import argparse
    from tupe_plugin.policies.scope import enter_run
    from tupe_plugin.fairseq_fixes.binarized_data_checks import BinarizedDataError
    enter_run(argparse.Namespace(arch="roberta_base"))
    raise BinarizedDataError("data-bin/train.idx is truncated")
if kind == "user":
    raise PositionFlagError("--rel-pos-buckets must be even and >= 4, got 3")
if kind == "wrapped":
    try:
        raise PositionFlagError("--rotary-base must be > 1, got 1.0")
    except ValueError as error:
        raise Exception("Cannot load model parameters from checkpoint") from error
raise KeyError("other")
"""


def run(kind, **env):
    return subprocess.run([sys.executable, "-c", SCRIPT.format(kind=kind)], cwd=REPO, text=True,
                          capture_output=True, env={"PATH": "/usr/bin:/bin", **env})


@pytest.mark.parametrize("kind, message", [
    ("user", "error: --rel-pos-buckets must be even and >= 4, got 3"),
    ("wrapped", "error: --rotary-base must be > 1, got 1.0"),
])
def test_a_user_error_is_one_error_line_and_exit_status_1(kind, message):
    proc = run(kind)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [message]  # one line, as the README says: no hint line after it


def test_the_traceback_is_kept_on_request():
    proc = run("user", **{TRACEBACK_VARIABLE: "1"})
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr


def test_other_errors_keep_their_traceback():
    proc = run("other")
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "KeyError: 'other'" in proc.stderr


def test_a_run_of_another_model_keeps_fairseqs_tracebacks():
    proc = run("other model's run")
    assert proc.returncode == 1 and "Traceback" in proc.stderr
    assert "BinarizedDataError: data-bin/train.idx is truncated" in proc.stderr


def test_the_user_error_is_found_in_the_chain():
    class Wrapped(Exception):
        pass

    cause = UserError("fix this")
    try:
        try:
            raise cause
        except UserError as error:
            raise Wrapped("outer") from error
    except Wrapped as outer:
        assert user_error_in(outer) is cause
    assert user_error_in(KeyError("x")) is None
