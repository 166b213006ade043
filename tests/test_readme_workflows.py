"""The documented workflows, run as a user runs them (slow): the GLUE seeds loop of docs/finetuning.md after
tupe-prepare-glue, with the tools of .venv called by path, and the README's `make demo` for two
architectures in the same WORKDIR. Each test first checks that the page still documents what it runs."""

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, VENV_BIN, test_data

from tupe_plugin.corpus import build as build_corpus

pytestmark = pytest.mark.slow


def bash_blocks(page):
    """The text of the bash blocks of a page of the repository (README.md, docs/NAME.md)."""
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        return "\n".join(re.findall(r"^```bash\n(.*?)^```", f.read(), flags=re.S | re.M))


def user_environment(**extra):
    """A shell where .venv is not activated and PYTHON is not set."""
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if os.path.abspath(p) != os.path.abspath(VENV_BIN))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV")}
    return dict(env, PATH=path, PYTHONWARNINGS="ignore", **extra)


def test_glue_seeds_loop_runs_after_prepare_glue(pretrained_dir, tmp_path):
    documented = bash_blocks(os.path.join("docs", "finetuning.md"))
    assert "tupe-prepare-glue --task RTE --glue-dir glue_data" in documented
    assert "--out glue-bin/RTE-bin" in documented
    assert "tupe-finetune-glue RTE checkpoints/tupe_r_base/checkpoint_best.pt data-bin --seed $seed" in documented
    data = pretrained_dir / "data-bin"
    glue = test_data("glue")
    prepare = [os.path.join(VENV_BIN, "tupe-prepare-glue"), "--task", "RTE",
               "--glue-dir", glue, "--sentencepiece-model", data / "sentencepiece.bpe.model",
               "--dict", data / "dict.txt", "--out", "glue-bin/RTE-bin", "--max-examples", "48"]
    subprocess.run([str(a) for a in prepare], cwd=tmp_path, check=True, stdout=subprocess.PIPE)
    outputs = []
    for seed in (1, 2):
        proc = subprocess.run(
            [os.path.join(VENV_BIN, "tupe-finetune-glue"), "RTE",
             str(pretrained_dir / "checkpoints" / "checkpoint_last.pt"), str(data), "--seed", str(seed),
             "--glue-dir", glue, "--cpu", "--max-examples", "48", "--max-epoch", "1", "--batch-size", "16",
             "--max-update", "2", "--num-workers", "0"],
            cwd=tmp_path, env=user_environment(),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.returncode == 0, proc.stdout[-3000:]
        outputs.append(proc.stdout)
    assert all("glue-bin/RTE-bin already holds this preparation" in out for out in outputs)
    for seed in (1, 2):
        run = tmp_path / "checkpoints" / "glue" / "RTE" / "tupe_r_tiny" / f"seed{seed}"
        assert (run / "run.json").is_file()


def test_demo_of_a_second_architecture_keeps_the_first_ones_run(tmp_path):
    assert "make demo" in bash_blocks("README.md")
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert "`CORPUS=path/to/text.txt make demo`" in readme and "`ARCH=bert_a_tiny make demo`" in readme
    # a user's CORPUS file: the text of the demo's embedded corpus (standard-library docstrings)
    build_corpus.main(["--output-dir", str(tmp_path / "docstrings")])
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join((tmp_path / "docstrings" / f"{split}.txt").read_text(encoding="utf-8")
                              for split in build_corpus.SPLITS), encoding="utf-8")
    workdir = tmp_path / "demo"
    for arch in ("tupe_r_tiny", "bert_a_tiny"):
        proc = subprocess.run(["bash", os.path.join(REPO, "examples", "demo.sh")], cwd=tmp_path,
                              env=dict(os.environ, CORPUS=str(corpus), ARCH=arch, UPDATES="10",
                                       WORKDIR=str(workdir), PYTHON=sys.executable),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.returncode == 0, proc.stdout[-3000:]
    assert "[train] update 10/10 (100%)" in proc.stdout
    first, second = workdir / "tupe_r_tiny", workdir / "bert_a_tiny"
    assert (first / "checkpoints" / "checkpoint_last.pt").is_file()
    assert (second / "checkpoints" / "checkpoint_last.pt").is_file()
    assert (first / "analysis" / "content_free_term.png").is_file()
    assert not (second / "analysis" / "content_free_term.png").exists()  # bert_a has no untied term
