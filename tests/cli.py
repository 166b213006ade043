"""Helpers to run the fairseq command-line tools of the venv in a subprocess."""

import json
import os
import re
import subprocess
import sys
import tempfile

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
    ((outputs, code, text),) = run_fairseq_chains([steps], cwd=cwd)
    if check and code != 0:
        raise AssertionError(f"fairseq chain exited {code}:\n{text[-4000:]}")
    return outputs if check else (outputs, code)


def run_fairseq_chains(chains, cwd=REPO, threads=None):
    """Run chains of ``(tool, args)`` commands side by side, each chain one process (with ``threads``
    torch threads each, where given): [(the output of each command run, the exit code, the whole
    output)] in the chains' order. Outputs go to files, not pipes, so that no chain waits on another's
    reader."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as folder:
        running = []
        for number, steps in enumerate(chains):
            log = open(os.path.join(folder, f"chain-{number}.log"), "w+", encoding="utf-8")
            argv = json.dumps([(tool, [str(a) for a in args]) for tool, args in steps])
            running.append((subprocess.Popen([sys.executable, "-c", _CHAIN, argv], cwd=cwd, env=env,
                                             stdout=log, stderr=subprocess.STDOUT, text=True), log))
        results = []
        for proc, log in running:
            code = proc.wait()
            log.seek(0)
            text = log.read()
            log.close()
            results.append((text.split(STEP_MARKER + "\n")[1:], code, text))
    return results


# Chains of independent commands run side by side, one torch thread each, on up to this many cores.
SIDE_BY_SIDE = max(1, min(4, os.cpu_count() or 1))


def run_fairseq_for_each(items, steps_of, cwd=REPO):
    """Run the commands ``steps_of(item)`` of every item, the items spread over :data:`SIDE_BY_SIDE` chains
    run side by side: ({item: the outputs of its commands}, {item: the end of its chain's output}); a
    command that fails ends its chain, and its item and the later items of that chain have no outputs."""
    chains = [items[number::SIDE_BY_SIDE] for number in range(SIDE_BY_SIDE)]
    results = run_fairseq_chains([[step for item in chain for step in steps_of(item)] for chain in chains],
                                 cwd=cwd, threads=1)
    done, ends = {}, {}
    for chain, (outputs, code, text) in zip(chains, results):
        complete = len(outputs) if code == 0 else len(outputs) - 1
        start = 0
        for item in chain:
            count = len(steps_of(item))
            if start + count <= complete:
                done[item] = outputs[start:start + count]
            start += count
            ends[item] = text[-3000:]
    return done, ends


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


def validate_args(data, checkpoint, *extra):
    """A fairseq-validate command line for a masked-LM checkpoint of the plugin. Like :func:`train_args`, it
    loads batches in the main process (``--num-workers 0``): a data-loader worker left by a command is
    joined when its loader is collected, which waits 5 s (torch's status interval) in a chain of commands."""
    return [data, "--user-dir", "tupe_plugin", "--path", checkpoint, "--task", "masked_lm", "--batch-size", 8,
            "--cpu", "--num-workers", 0, *extra]
