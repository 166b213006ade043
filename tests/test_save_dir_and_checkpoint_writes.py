"""One fairseq-train run per --save-dir, and a failed checkpoint write leaves no partial file behind."""

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from tupe_plugin.fairseq_fixes import atomic_checkpoints
from tupe_plugin.policies import save_dir_lock
from tupe_plugin.fairseq_fixes.partial_checkpoint_cleanup import CheckpointSaveError
from tupe_plugin.policies.save_dir_lock import (FORCE_UNLOCK_VARIABLE, LOCK_NAME, SaveDirLockedError,
                                                acquire, release)


def held_by(save_dir, pid, host=None, command="fairseq-train DATA --save-dir X", **slurm):
    save_dir.mkdir(exist_ok=True)
    holder = {"pid": pid, "host": host or socket.gethostname(), "started": "2026-01-01 10:00:00",
              "command": command, **slurm}
    (save_dir / LOCK_NAME).write_text(json.dumps(holder))


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("holder", ["a live process on this host", "a process on another host"])
def test_a_second_run_in_the_same_save_dir_is_refused_naming_the_first(holder, tmp_path, monkeypatch):
    monkeypatch.delenv(FORCE_UNLOCK_VARIABLE, raising=False)
    if holder == "a live process on this host":
        held_by(tmp_path / "save", os.getppid())
    else:
        held_by(tmp_path / "save", dead_pid(), host="gpu-node-7")
    with pytest.raises(SaveDirLockedError, match=f"--save-dir {tmp_path / 'save'} is in use by another run "
                                                 r"\(pid \d+ on .*, started 2026-01-01 10:00:00: "
                                                 "fairseq-train DATA --save-dir X\\); give this run its own"):
        acquire(str(tmp_path / "save"))


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path):
    held_by(tmp_path / "save", dead_pid())
    path = acquire(str(tmp_path / "save"))
    assert json.loads(Path(path).read_text())["pid"] == os.getpid()


def test_a_lock_held_on_another_host_names_the_takeover(tmp_path, monkeypatch):
    """A SLURM requeue onto another node finds the lock of its own dead run: this node cannot check it."""
    monkeypatch.delenv(FORCE_UNLOCK_VARIABLE, raising=False)
    held_by(tmp_path / "save", 4242, host="gpu-node-7")
    with pytest.raises(SaveDirLockedError, match=r"\(pid 4242 on gpu-node-7, .*\); .*cannot check .*"
                                                 f"{FORCE_UNLOCK_VARIABLE}=1 fairseq-train"):
        acquire(str(tmp_path / "save"))


def test_the_takeover_variable_takes_over_a_lock_held_on_another_host(tmp_path, monkeypatch):
    monkeypatch.setenv(FORCE_UNLOCK_VARIABLE, "1")
    held_by(tmp_path / "save", 4242, host="gpu-node-7")
    path = acquire(str(tmp_path / "save"))
    holder = json.loads(Path(path).read_text())
    assert (holder["pid"], holder["host"]) == (os.getpid(), socket.gethostname())


def test_the_takeover_variable_leaves_a_live_run_on_this_host_alone(tmp_path, monkeypatch):
    monkeypatch.setenv(FORCE_UNLOCK_VARIABLE, "1")
    held_by(tmp_path / "save", os.getppid())
    with pytest.raises(SaveDirLockedError, match="is in use by another run"):
        acquire(str(tmp_path / "save"))


def test_the_takeover_variable_takes_over_a_lock_that_names_no_run(tmp_path, monkeypatch):
    monkeypatch.setenv(FORCE_UNLOCK_VARIABLE, "1")
    (tmp_path / "save").mkdir()
    (tmp_path / "save" / LOCK_NAME).write_text("")   # a write cut short
    path = acquire(str(tmp_path / "save"))
    assert json.loads(Path(path).read_text())["pid"] == os.getpid()


def test_a_lock_of_an_earlier_start_of_the_same_slurm_job_is_taken_over(tmp_path, monkeypatch):
    """SLURM keeps the job id across a requeue and counts the restarts: the lock of restart 0, on the
    node the job left, belongs to a run SLURM ended."""
    monkeypatch.delenv(FORCE_UNLOCK_VARIABLE, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "81234")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    held_by(tmp_path / "save", 4242, host="gpu-node-7", slurm_job="81234", slurm_restart=0)
    path = acquire(str(tmp_path / "save"))
    assert json.loads(Path(path).read_text())["slurm_restart"] == 1
    held_by(tmp_path / "save", 4242, host="gpu-node-7", slurm_job="81234", slurm_restart=1)  # same start
    with pytest.raises(SaveDirLockedError, match="gpu-node-7"):
        acquire(str(tmp_path / "save"))


def test_the_lock_is_released_when_the_run_ends(tmp_path):
    path = acquire(str(tmp_path / "save"))
    release(path)
    assert not os.path.exists(path)
    acquire(str(tmp_path / "save"))  # a new run can take it again


def test_fairseq_train_refuses_a_locked_save_dir_before_training(tmp_path):
    held_by(tmp_path / "save", os.getppid())
    argv = ["DATA", "--task", "masked_lm", "--arch", "tupe_r_tiny", "--batch-size", "2",
            "--save-dir", str(tmp_path / "save")]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(),
                                                                     input_args=argv))
    import fairseq_cli.train

    with pytest.raises(SaveDirLockedError, match="is in use by another run"):
        fairseq_cli.train.main(cfg)
    assert save_dir_lock._holder(str(tmp_path / "save" / LOCK_NAME))["pid"] == os.getppid()


@pytest.mark.parametrize("failure", [
    OSError(errno.ENOSPC, "No space left on device"),
    RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos")])
def test_a_failed_save_removes_the_partial_tmp_and_keeps_the_old_checkpoint(failure, tmp_path, monkeypatch):
    path = tmp_path / "checkpoint_last.pt"
    torch.save({"model": {"w": torch.ones(3)}}, path)
    old = path.read_bytes()

    def full_disk(obj, f):
        f.write(b"partial bytes")
        raise failure

    monkeypatch.setattr(checkpoint_utils.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointSaveError, match=f"writing the checkpoint {path} failed .*the partial "
                                                  f"{path}.tmp was removed"):
        checkpoint_utils.torch_persistent_save({"model": {}}, str(path))
    assert not (tmp_path / "checkpoint_last.pt.tmp").exists()
    assert path.read_bytes() == old


@pytest.mark.parametrize("written", [0, 100])
def test_a_failed_copy_to_checkpoint_last_removes_its_partial_tmp(written, tmp_path, monkeypatch):
    source, target = tmp_path / "checkpoint_1_10.pt", tmp_path / "checkpoint_last.pt"
    source.write_bytes(b"n" * 1000)
    target.write_bytes(b"old")

    def full_disk(src, dst):
        with open(dst, "wb") as f:
            f.write(b"n" * written)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic_checkpoints.shutil, "copyfile", full_disk)
    with pytest.raises(CheckpointSaveError, match=r"No space left on device.*free disk space"):
        atomic_checkpoints.AtomicCopyPathManager.copy(str(source), str(target), overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_1_10.pt", "checkpoint_last.pt"]
    assert target.read_bytes() == b"old"
