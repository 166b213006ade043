"""An interrupted pre-training run resumes from checkpoint_last.pt exactly where the checkpoint was, and
continues with the same per-update losses and the same final parameters as an uninterrupted run.

What makes it exact (fairseq 0.12 behaviour, kept by the plugin, which adds no state outside the model):
the checkpoint holds the model, the optimizer and lr-scheduler state and the position of the data iterator
inside the epoch (``--save-interval-updates`` checkpoints are mid-epoch); masked_lm draws its masks from
``(--seed, epoch, example index)``; the trainer re-seeds torch with ``--seed + num_updates`` before each
update, so dropout too depends only on the update number. ``--num-workers 0`` keeps batches in the main
process; the same command line (same ``--seed``, batch size, ``--update-freq``) is run again.
"""

import os
import re
import signal
import subprocess
import sys

import pytest
import torch
from cli import train_args
from conftest import VENV_BIN

ARCH, UPDATES, SAVE_EVERY = "tupe_r_tiny", 8, 2


def command(data, save_dir):
    extra = ("--save-interval-updates", SAVE_EVERY, "--dropout", 0.1, "--attention-dropout", 0.1)
    return [os.path.join(VENV_BIN, "fairseq-train"),
            *map(str, train_args(data, save_dir, ARCH, UPDATES, *extra))]


def losses_by_update(output):
    """{update: loss as logged} of the train_inner lines (--log-interval 1)."""
    return {int(update): loss for loss, update in
            re.findall(r"train_inner .*?loss=([0-9.]+|inf|nan), .*?num_updates=(\d+),", output)}


def run(cmd, stop_at_update=None, sig=None):
    """Run to the end, or send ``sig`` once the log shows update ``stop_at_update``; return the log."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if stop_at_update is not None and f"num_updates={stop_at_update}," in line:
            proc.send_signal(sig)
            break
    lines.extend(proc.stdout)
    code = proc.wait()
    assert (code != 0) == (sig is not None), "".join(lines)[-3000:]
    return "".join(lines)


def last_saved_update(output):
    saved = re.findall(r"Saved checkpoint \S+ \(epoch \d+ @ (\d+) updates", output)
    return int(saved[-1]) if saved else 0


def checkpoint_update(path):
    return torch.load(path, map_location="cpu")["optimizer_history"][-1]["num_updates"]


def final_parameters(save_dir):
    return torch.load(save_dir / "checkpoint_last.pt", map_location="cpu")["model"]


@pytest.fixture(scope="module")
def uninterrupted(wikitext_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("uninterrupted")
    output = run(command(wikitext_bin, save_dir))
    losses = losses_by_update(output)
    assert sorted(losses) == list(range(1, UPDATES + 1))
    return losses, final_parameters(save_dir)


def assert_resumes_exactly(cmd, save_dir, interrupted_log, uninterrupted):
    reference_losses, reference_parameters = uninterrupted
    checkpointed = checkpoint_update(save_dir / "checkpoint_last.pt")
    assert checkpointed >= last_saved_update(interrupted_log) > 0

    resumed = run(cmd)
    assert f"Loaded checkpoint {save_dir / 'checkpoint_last.pt'}" in resumed
    assert f"@ {checkpointed} updates" in resumed
    losses = losses_by_update(resumed)
    assert sorted(losses) == list(range(checkpointed + 1, UPDATES + 1))
    assert losses == {u: reference_losses[u] for u in losses}
    parameters = final_parameters(save_dir)
    assert parameters.keys() == reference_parameters.keys()
    for name, value in reference_parameters.items():
        assert torch.equal(parameters[name], value), name


@pytest.mark.slow
@pytest.mark.parametrize("sig, stop_at_update", [(signal.SIGTERM, 5), (signal.SIGKILL, 7)])
def test_killed_run_resumes_with_identical_losses_and_parameters(
    sig, stop_at_update, wikitext_bin, tmp_path, uninterrupted
):
    cmd = command(wikitext_bin, tmp_path)
    interrupted = run(cmd, stop_at_update, sig)
    assert_resumes_exactly(cmd, tmp_path, interrupted, uninterrupted)


DIE_DURING_WRITE = """
import io, os, shutil, sys, torch
from fairseq_cli.train import cli_main

target, doomed = sys.argv[1], sys.argv[2]
real_save, real_copy = torch.save, shutil.copyfile

def save(obj, f, *args, **kwargs):
    if target != "torch.save" or doomed not in str(getattr(f, "name", f)):
        return real_save(obj, f, *args, **kwargs)
    buffer = io.BytesIO()
    real_save(obj, buffer)
    f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    f.flush()
    os._exit(137)

def copyfile(src, dst, *args, **kwargs):
    copy = f"{os.path.basename(src)} -> {os.path.basename(dst)}"  # dst may be a temporary DEST.tmp
    if target != "shutil.copyfile" or not copy.startswith(doomed):
        return real_copy(src, dst, *args, **kwargs)
    with open(src, "rb") as f:
        data = f.read()
    with open(dst, "wb") as f:
        f.write(data[: len(data) // 2])
    os._exit(137)

torch.save, shutil.copyfile = save, copyfile
sys.argv = ["fairseq-train", *sys.argv[3:]]
cli_main()
"""


@pytest.mark.parametrize("dies_in, doomed", [
    pytest.param("torch.save", "checkpoint_1_4.pt", marks=pytest.mark.slow),
    pytest.param("shutil.copyfile", "checkpoint_1_4.pt -> checkpoint_best.pt", marks=pytest.mark.slow),
    ("shutil.copyfile", "checkpoint_1_4.pt -> checkpoint_last.pt"),
])
def test_process_dying_while_writing_a_checkpoint_leaves_every_checkpoint_complete(
    dies_in, doomed, wikitext_bin, tmp_path, uninterrupted
):
    """Killed half-way through the second save (update 4, after validation): while fairseq serialises
    checkpoint_1_4.pt, or while it copies that file to checkpoint_best.pt or checkpoint_last.pt."""
    cmd = command(wikitext_bin, tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", DIE_DURING_WRITE, dies_in, doomed, *cmd[1:]],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    assert proc.returncode == 137, proc.stdout[-3000:]
    assert last_saved_update(proc.stdout) == SAVE_EVERY
    for checkpoint in tmp_path.glob("*.pt"):
        assert checkpoint_update(checkpoint) in (SAVE_EVERY, 2 * SAVE_EVERY), checkpoint
    assert_resumes_exactly(cmd, tmp_path, proc.stdout, uninterrupted)
