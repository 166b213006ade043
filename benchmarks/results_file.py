"""The results file every benchmark script writes: one run, kept as-is under ``benchmarks/results/``.

A record holds what the run's own tables come from and what is needed to trust them later: the exact
command line, the machine, the git commit (and whether the tree had uncommitted changes), the date, the
settings, and the cost of every contender in every repetition (a round of ``benchmark.py``, a
repetition of ``benchmark_train.py``, a call of ``benchmark_attention.py``) with the ratios paired
within each repetition (``benchmarks/paired.py``). Each script adds its own raw data beside these
fields. ``--results-dir DIR`` saves the record as ``DIR/BENCHMARK-DATE-TAG.json``, the tag naming the
setting; ``benchmarks/report.py`` reads that folder and generates the tables of the docs.
"""

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

import torch

from benchmarks import paired

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMAT = 1
REQUIRED = ("format", "benchmark", "command", "date", "commit", "dirty", "machine", "settings", "rounds")
# The commit of a copy without git's folder (a GPU machine gets the working tree only): gpu_checks.sh's caller
# passes it, e.g. BENCHMARK_COMMIT=$(git rev-parse HEAD).
COMMIT_VARIABLE = "BENCHMARK_COMMIT"


def command(script, argv=None):
    """The command line that ran ``script`` with ``argv`` (``sys.argv[1:]`` when None)."""
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", os.path.relpath(os.path.abspath(script), REPO), *map(str, args)])


def git_state():
    """``{"commit", "dirty"}``: the checked-out commit, and whether tracked files differ from it; without
    git's folder the commit ``BENCHMARK_COMMIT`` names (dirty unknown), else None."""
    def git(*args):
        return subprocess.run(["git", "-C", REPO, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, check=True).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": os.environ.get(COMMIT_VARIABLE) or None, "dirty": None}


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device="cpu"):
    """CPU model and cores, torch and its threads, Python, the GPU on a CUDA device, the load average."""
    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "python": platform.python_version(), "gpu": None,
            "load_average": os.getloadavg()}
    if str(device).startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def record(benchmark, script, argv, settings, device="cpu"):
    """The fields every results file starts with; the script adds ``rounds`` and its own data."""
    return {"format": FORMAT, "benchmark": benchmark, "command": command(script, argv),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **git_state(), "machine": machine(device), "settings": settings}


def precision(settings):
    """fp32, bf16 or fp16: how a run of ``settings`` (its ``--bf16`` / ``--fp16``; a run without them fp32)
    computed."""
    return "bf16" if settings.get("bf16") else "fp16" if settings.get("fp16") else "fp32"


def repetitions(setting, unit, baseline, costs):
    """One setting's costs per contender and repetition, with each contender's ratios to ``baseline``
    paired within the repetitions (an entry of a record's ``rounds``)."""
    return {"setting": setting, "unit": unit, "baseline": baseline, "costs": costs,
            "paired": {name: paired.summary(paired.ratios(values, costs[baseline]))
                       for name, values in costs.items()}}


def file_name(benchmark, date, tag, gpu=None):
    """``BENCHMARK-YYYY-MM-DD-TAG.json``, or ``BENCHMARK-YYYY-MM-DD-GPU-TAG.json`` for a run on ``gpu``
    (its name as torch gives it, ``NVIDIA H100 80GB HBM3``: ``nvidia-h100-80gb-hbm3``); the name made of
    letters, digits, dots and hyphens."""
    tag = tag if gpu is None else f"{gpu.lower()}-{tag}"
    tag = "-".join(part for part in "".join(c if c.isalnum() or c == "." else "-" for c in tag).split("-")
                   if part)
    return f"{benchmark}-{date[:10]}-{tag}.json"


def save(run, results_dir, tag):
    """Write ``run`` into ``results_dir`` under :func:`file_name`, never over an earlier run (a second
    run of the day gets ``-2``, ...); returns the path."""
    os.makedirs(results_dir, exist_ok=True)
    base = file_name(run["benchmark"], run["date"], tag, run["machine"].get("gpu"))[:-len(".json")]
    path, number = os.path.join(results_dir, base + ".json"), 1
    while os.path.exists(path):
        number += 1
        path = os.path.join(results_dir, f"{base}-{number}.json")
    write(run, path)
    return path


def write(run, path):
    """``run`` as indented JSON at ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(run, f, indent=1)
        f.write("\n")


def load(results_dir):
    """Every results file of ``results_dir`` (``file`` added: its name), oldest first; a JSON file that
    lacks a field of :data:`REQUIRED` is refused by name."""
    runs = []
    names = sorted(os.listdir(results_dir)) if os.path.isdir(results_dir) else []
    for name in names:
        if not name.endswith(".json"):
            continue
        with open(os.path.join(results_dir, name), encoding="utf-8") as f:
            run = json.load(f)
        missing = [field for field in REQUIRED if field not in run]
        if missing:
            raise ValueError(f"{os.path.join(results_dir, name)} is no results file: "
                             f"it lacks {', '.join(missing)}")
        runs.append({**run, "file": name})
    return sorted(runs, key=lambda run: (run["date"], run["file"]))
