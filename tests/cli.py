"""Helpers to run the fairseq command-line tools of the venv in a subprocess."""

import json
import os
import re
import subprocess
import sys

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


STEP_MARKER = "=== tupe-plugin test: next command ==="

# Runs each (tool, argv) pair through fairseq_cli.<tool>.cli_main, the function behind the
# fairseq-<tool> console script, in one interpreter: fairseq's import costs seconds per process.
_CHAIN = f"""
import importlib, json, sys
for tool, args in json.loads(sys.argv[1]):
    print({STEP_MARKER!r}, flush=True)
    sys.argv = ["fairseq-" + tool, *args]
    importlib.import_module("fairseq_cli." + tool).cli_main()
"""


def run_fairseq_steps(*steps, cwd=REPO, check=True):
    """Run several ``(tool, args)`` fairseq commands one after the other in one process.

    Returns the output of each command; a failing command fails the test with the output
    (or, with ``check=False``, ends the chain and returns the outputs so far and the exit code).
    """
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    argv = json.dumps([(tool, [str(a) for a in args]) for tool, args in steps])
    proc = subprocess.run(
        [sys.executable, "-c", _CHAIN, argv],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    outputs = proc.stdout.split(STEP_MARKER + "\n")[1:]
    if check and proc.returncode != 0:
        raise AssertionError(f"fairseq chain exited {proc.returncode}:\n{proc.stdout[-4000:]}")
    return outputs if check else (outputs, proc.returncode)


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
