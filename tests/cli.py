"""Helpers to run the fairseq command-line tools of the venv in a subprocess."""

import os
import re
import subprocess

from conftest import REPO, VENV_BIN


def run_fairseq(tool, *args, cwd=REPO, check=True):
    """Run ``fairseq-<tool>``; return its combined output, failing with the output on error."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [os.path.join(VENV_BIN, f"fairseq-{tool}"), *map(str, args)],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"fairseq-{tool} exited {proc.returncode}:\n{proc.stdout[-4000:]}")
    return proc.stdout if check else proc


def logged_losses(output, subset):
    """Losses of the ``| valid |`` (or train_inner) lines fairseq logs."""
    return [float(v) for v in re.findall(rf"\| {subset} .*?\| loss ([0-9.]+|inf|nan)", output)]


def train_inner_losses(output):
    return [float(v) for v in re.findall(r"train_inner .*? loss=([0-9.]+|inf|nan)", output)]


def train_args(data, save_dir, arch, updates, *extra):
    """A short masked-LM fairseq-train command line for the plugin."""
    return [
        data, "--user-dir", "tupe_plugin", "--task", "masked_lm", "--criterion", "masked_lm",
        "--arch", arch, "--tokens-per-sample", 64, "--batch-size", 8, "--max-update", updates,
        "--optimizer", "adam", "--lr", 1e-3, "--save-dir", save_dir, "--cpu", "--seed", 1,
        "--log-format", "simple", "--log-interval", 1, "--num-workers", 0,
        "--no-epoch-checkpoints", *extra,
    ]
