"""scripts/train_distributed_cpu.sh: two CPU processes (torchrun, gloo, fairseq's default pytorch_ddp)
reach the same parameters as one process with --update-freq 2.

Same effective batch: fairseq gives rank r the batches r, r + 2, ... of the epoch, so update u sees
batches 2u and 2u + 1 in both runs; masks depend on (seed, epoch, example) only. Dropout is off because
each rank re-seeds torch with --seed + num_updates, so the two ranks would draw the same dropout masks
where one process draws two different ones. What remains is the summation order of the gradients
(gloo's all-reduce of per-process sums, divided by the world size, against one accumulated sum), so
the parameters are compared to 1e-6 absolute: with 2 processes they come out bitwise equal here, but
neither torch nor gloo promises the order of a reduction.
"""

import os
import pathlib
import subprocess

import pytest
import torch
from cli import run_fairseq, train_args, train_inner_losses
from conftest import REPO, VENV_BIN

UPDATES = 3
NO_DROPOUT = ("--dropout", 0, "--attention-dropout", 0)


def parameters(save_dir):
    return torch.load(save_dir / "checkpoint_last.pt", map_location="cpu")["model"]


@pytest.mark.slow
def test_two_processes_equal_one_process_with_update_freq_2(wikitext_bin, tmp_path):
    one_dir, two_dir = tmp_path / "one", tmp_path / "two"
    single = run_fairseq("train", *train_args(wikitext_bin, one_dir, "tupe_r_tiny", UPDATES,
                                              *NO_DROPOUT, "--update-freq", 2))
    args = [a for a in train_args(wikitext_bin, two_dir, "tupe_r_tiny", UPDATES, *NO_DROPOUT) if a != "--cpu"]
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", NPROC="2",
               OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([os.path.join(REPO, "scripts", "train_distributed_cpu.sh"), *map(str, args)],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "distributed init (rank 1)" in proc.stdout
    assert "bsz=16" in proc.stdout  # each logged update sums both processes' 8 sentences

    assert train_inner_losses(proc.stdout) == train_inner_losses(single)
    one, two = parameters(one_dir), parameters(two_dir)
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], atol=1e-6, rtol=0, msg=name)


def launched_threads(tmp_path, cores, nproc, **env):
    """The OMP_NUM_THREADS the script gives torchrun on a machine of ``cores`` cores: a copy of the
    script outside the repository (no .venv) with stand-ins for nproc and torchrun on PATH."""
    scripts, tools = tmp_path / "scripts", tmp_path / "bin"
    scripts.mkdir()
    tools.mkdir()
    script = scripts / "train_distributed_cpu.sh"
    script.write_text((pathlib.Path(REPO) / "scripts" / "train_distributed_cpu.sh").read_text())
    (tools / "nproc").write_text(f"#!/bin/sh\necho {cores}\n")
    (tools / "torchrun").write_text('#!/bin/sh\necho "$OMP_NUM_THREADS"\n')
    for tool in ("nproc", "torchrun"):
        (tools / tool).chmod(0o755)
    environment = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    environment.update(PATH=f"{tools}{os.pathsep}{os.environ['PATH']}", NPROC=str(nproc), **env)
    proc = subprocess.run(["bash", str(script), "data-bin"], env=environment, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout
    return proc.stdout.strip()


@pytest.mark.parametrize("cores, nproc, threads", [(2, 2, "1"), (16, 4, "4"), (8, 3, "2"), (2, 4, "1"),
                                                   (8, 1, "8")])
def test_processes_share_the_cores(tmp_path, cores, nproc, threads):
    assert launched_threads(tmp_path, cores, nproc) == threads


def test_omp_num_threads_set_by_the_user_is_kept(tmp_path):
    assert launched_threads(tmp_path, 2, 2, OMP_NUM_THREADS="3") == "3"
