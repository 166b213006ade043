"""The documented workflows, run as a user runs them (slow): the GLUE seeds loop of docs/finetuning.md after
tupe-prepare-glue, with the tools of .venv called by path, the README's `make demo` for two
architectures in the same WORKDIR, and the README's tiny CPU lines, every section's in order. Each test
first checks that the page still documents what it runs."""

import os
import re
import shutil
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
    assert ("tupe-finetune-glue RTE checkpoints/tupe_r_base/checkpoint_best.pt data-bin --seed $seed"
            in documented)
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


TINY_CPU = re.compile(r"(^|\s)# tiny CPU\b", flags=re.M)
# Each README section's tiny CPU line, by a piece of its command: the walk-through fails if one disappears.
TINY_CPU_SECTIONS = {
    "pre-training": '"${TINY[@]}" --arch tupe_r_tiny --save-dir checkpoints/tupe_r_tiny',
    "validating": "fairseq-validate data-bin --user-dir tupe_plugin --path checkpoints/tupe_r_tiny/",
    "analysis": "tupe-analyze --path checkpoints/tupe_r_tiny/",
    "embeddings initialisation": "--embed-init-path checkpoints/tupe_r_tiny/",
    "GLUE": "tupe-finetune-glue RTE checkpoints/tupe_r_tiny/",
    "SQuAD": "tupe-finetune-squad 1.1 checkpoints/tupe_r_tiny/",
    "study": "tupe-study examples/study-quick.yaml --out study-quick",
}


def tiny_cpu_script():
    """The README's bash blocks that hold a `# tiny CPU` comment, in the page's order, as one script."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        blocks = re.findall(r"^```bash\n(.*?)^```", f.read(), flags=re.S | re.M)
    return "".join(block for block in blocks if TINY_CPU.search(block))


def test_readme_tiny_cpu_walkthrough_runs_as_written(tmp_path):
    """Every tiny CPU line of the README, in order, in one shell with .venv activated, in a folder laid out
    as a checkout with the user's data beside it: tests/data's WikiText-2 excerpt as my_text.txt, its GLUE
    excerpts as glue_data/ and its SQuAD dev excerpt as squad/train-v1.1.json and squad/dev-v1.1.json."""
    script = tiny_cpu_script()
    missing = [section for section, command in TINY_CPU_SECTIONS.items() if command not in script]
    assert not missing, f"README.md has no tiny CPU line for {', '.join(missing)}"
    work = tmp_path / "checkout"
    work.mkdir()
    for name in ("tupe_plugin", "examples"):  # what the lines name in the repository (--user-dir, a config)
        (work / name).symlink_to(os.path.join(REPO, name))
    shutil.copy(test_data("wikitext-2", "wiki.valid.head.tokens"), work / "my_text.txt")
    shutil.copytree(test_data("glue"), work / "glue_data")
    (work / "squad").mkdir()
    for split in ("train", "dev"):
        shutil.copy(test_data("squad", "dev-v1.1.head.json"), work / "squad" / f"{split}-v1.1.json")
    env = user_environment()
    env.pop("PYTHONWARNINGS")
    env.update(PATH=os.pathsep.join([VENV_BIN, env["PATH"]]), VIRTUAL_ENV=os.path.dirname(VENV_BIN),
               OMP_NUM_THREADS="1")  # `source .venv/bin/activate`, and one thread on a shared CPU
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=work, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert "Traceback" not in proc.stdout, proc.stdout[-5000:]
    for path in ("checkpoints/tupe_r_tiny/checkpoint_last.pt", "analysis/tupe_r_tiny/positions.json",
                 "checkpoints/bert_a_init/checkpoint_last.pt",
                 "checkpoints/glue/RTE/tupe_r_tiny/seed1/run.json",
                 "checkpoints/squad/v1.1/tupe_r_tiny/seed1/predictions.json", "study-quick/report.md"):
        assert (work / path).is_file(), f"{path} is missing after the walk-through"
    assert "embed-init: checkpoints/tupe_r_tiny/checkpoint_last.pt -> " in proc.stdout
    assert '"exact_match"' in proc.stdout and "## GLUE" in (work / "study-quick" / "report.md").read_text()
