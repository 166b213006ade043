"""The plugin is a guest in every fairseq run: fairseq's entry points stay its own (spawn, hydra), other
models train exactly as without ``--user-dir``, and the plugin's policies hold for its architectures only."""

import json
import os
import pickle
import re
import socket
import subprocess
import sys

import fairseq_cli.train
import pytest
from cli import run_fairseq
from conftest import REPO, VENV_BIN
from tupe_plugin.encodings import registry
from tupe_plugin.encodings.encoding import flag_name

PLUGIN = os.path.join(REPO, "tupe_plugin")

TINY_ROBERTA = ["--task", "masked_lm", "--criterion", "masked_lm", "--arch", "roberta", "--encoder-layers", 1,
                "--encoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64, "--encoder-attention-heads", 2,
                "--max-positions", 64, "--tokens-per-sample", 64, "--batch-size", 8]
TINY_TRANSFORMER = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
                    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", 0.1,
                    "--arch", "transformer", "--encoder-layers", 1, "--decoder-layers", 1,
                    "--encoder-embed-dim", 32, "--decoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
                    "--decoder-ffn-embed-dim", 64, "--encoder-attention-heads", 2,
                    "--decoder-attention-heads", 2, "--max-tokens", 512]
# --required-batch-size-multiple 1: no remainder batch, which the fix of fairseq's dropped remainder
# (fairseq_fixes.remainder_batch, tested on its own) adds to every model's run
COMMON = ["--max-update", 3, "--optimizer", "adam", "--lr", 1e-3, "--cpu", "--seed", 1,
          "--log-format", "simple", "--log-interval", 1, "--num-workers", 0, "--no-epoch-checkpoints",
          "--required-batch-size-multiple", 1]

# What differs between two identical runs: times, speeds, the run's own folders.
VOLATILE = [
    (re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| "), ""),
    (re.compile(r"\b(wps|ups|wall|train_wall)([ =])[0-9.]+"), r"\1\2T"),
    (re.compile(r"[0-9.e-]+ seconds"), "T seconds"),
]


def normalised_log(output, save_dir):
    """The run's log lines without times and folders; the configuration dump line counted apart."""
    lines = []
    for line in output.replace(str(save_dir), "SAVE_DIR").splitlines():
        for pattern, replacement in VOLATILE:
            line = pattern.sub(replacement, line)
        lines.append("CONFIGURATION DUMP" if "fairseq_cli.train | {'_name'" in line else line)
    return lines


def train(data, save_dir, model_flags, *extra):
    return run_fairseq("train", data, *model_flags, *COMMON, "--save-dir", save_dir, *extra)


@pytest.fixture(scope="module")
def parallel_bin(wikitext_bin, tmp_path_factory):
    """A translation corpus: each WikiText line as the source, its words reversed as the target."""
    root = tmp_path_factory.mktemp("parallel")
    lines = [line for line in (wikitext_bin.parent / "train.txt").read_text(encoding="utf-8").splitlines()
             if 0 < len(line.split()) <= 60]
    cut = len(lines) * 4 // 5
    for split, rows in (("train", lines[:cut]), ("valid", lines[cut:])):
        (root / f"{split}.src").write_text("\n".join(rows) + "\n", encoding="utf-8")
        (root / f"{split}.tgt").write_text("\n".join(" ".join(reversed(r.split())) for r in rows) + "\n",
                                           encoding="utf-8")
    run_fairseq("preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", root / "train",
                "--validpref", root / "valid", "--destdir", root / "bin", "--workers", 1)
    return root / "bin"


def test_fairseq_train_main_stays_fairseqs_picklable_function():
    main = fairseq_cli.train.main
    assert (main.__module__, main.__qualname__) == ("fairseq_cli.train", "main")
    assert pickle.loads(pickle.dumps(main)) is main



def test_fairseq_train_help_describes_the_plugins_flags():
    from fairseq import options

    parser = options.get_training_parser()
    options.parse_args_and_arch(parser, ["data", "--task", "masked_lm", "--arch", "tupe_r_tiny"],
                                parse_known=True)
    described = re.findall(r"^  (--[\w-]+)", parser.format_help(), flags=re.M)
    families = [flag_name(family) for family in registry.FAMILIES]  # --abs-pos, --rel-pos, ...
    for flag in (*families, "--no-layernorm-embedding", "--embed-init-path", "--init-from-checkpoint"):
        assert flag in described


TRANSLATION = pytest.param("translation transformer", marks=pytest.mark.slow)


@pytest.mark.parametrize("model", ["roberta", TRANSLATION])
def test_another_model_with_the_plugin_logs_the_same_run_and_writes_the_same_files(model, request, tmp_path):
    data, flags = ((request.getfixturevalue("wikitext_bin"), TINY_ROBERTA) if model == "roberta"
                   else (request.getfixturevalue("parallel_bin"), TINY_TRANSFORMER))
    plain = train(data, tmp_path / "plain", flags)
    guest = train(data, tmp_path / "guest", flags, "--user-dir", PLUGIN)
    assert normalised_log(guest, tmp_path / "guest") == normalised_log(plain, tmp_path / "plain")
    assert normalised_log(plain, tmp_path / "plain").count("CONFIGURATION DUMP") == 1
    assert re.search(r"train_inner .* loss=[0-9.]+", guest)
    assert sorted(os.listdir(tmp_path / "guest")) == sorted(os.listdir(tmp_path / "plain"))


def test_another_model_is_not_held_to_the_plugins_policies(wikitext_bin, tmp_path):
    """No save-dir lock, no skipped-data refusal, no refusal of a missing --restore-file: fairseq's ways."""
    save_dir = tmp_path / "save"
    save_dir.mkdir()
    lock = {"pid": os.getpid(), "host": socket.gethostname(), "started": "now", "command": "another run"}
    (save_dir / "tupe_plugin.lock").write_text(json.dumps(lock))
    output = train(wikitext_bin, save_dir, TINY_ROBERTA, "--user-dir", PLUGIN, "--tokens-per-sample", 16,
                   "--sample-break-mode", "complete", "--skip-invalid-size-inputs-valid-test",
                   "--restore-file", tmp_path / "no-such-checkpoint.pt")
    assert re.search(r"\d+ samples have invalid sizes and will be skipped", output)
    assert f"No existing checkpoint found {tmp_path / 'no-such-checkpoint.pt'}" in output
    assert (save_dir / "checkpoint_last.pt").exists()
    assert json.loads((save_dir / "tupe_plugin.lock").read_text()) == lock


SPAWN = """
import sys
import torch

torch.cuda.device_count = lambda: 2  # fairseq spawns one worker per GPU; the workers themselves run on CPU
from fairseq_cli.train import cli_main

if __name__ == "__main__":
    sys.argv = ["fairseq-train", *sys.argv[1:]]
    cli_main()
"""


def test_fairseq_spawn_trains_a_plugin_architecture_on_two_workers(wikitext_bin, tmp_path):
    script = tmp_path / "spawn_train.py"
    script.write_text(SPAWN)
    save_dir = tmp_path / "save"
    args = [wikitext_bin, "--user-dir", PLUGIN, "--task", "masked_lm", "--criterion", "masked_lm",
            "--arch", "tupe_r_tiny", "--tokens-per-sample", 64, "--batch-size", 8, *COMMON,
            "--save-dir", save_dir,  # the rendezvous is a file: a free port may be taken before it is bound
            "--distributed-world-size", 2, "--distributed-init-method", f"file://{tmp_path / 'rendezvous'}",
            "--distributed-backend", "gloo"]
    proc = subprocess.run([sys.executable, str(script), *map(str, args)], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env=dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "distributed init (rank 0)" in proc.stdout and "distributed init (rank 1)" in proc.stdout
    assert "training on 2 devices" in proc.stdout
    assert re.findall(r"train_inner .* bsz=(\d+)", proc.stdout) == ["16"] * 3  # 8 sentences per worker
    assert sorted(os.listdir(save_dir)) == ["checkpoint_best.pt", "checkpoint_last.pt"]  # lock released


TEARDOWN = """
import atexit
import sys

import torch.distributed

atexit.register(lambda: print("process group at interpreter shutdown:", torch.distributed.is_initialized()))
sys.path.insert(0, sys.argv[1])
import tupe_plugin  # registered after the line above, so its handler runs before it

torch.distributed.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
torch.distributed.barrier()
"""


def test_a_workers_process_group_is_destroyed_before_the_interpreter_shuts_down(tmp_path):
    """fairseq ends a worker without destroy_process_group(); gloo's teardown during interpreter
    finalisation now and then aborts a worker that has finished its run."""
    script = tmp_path / "teardown.py"
    script.write_text(TEARDOWN)
    proc = subprocess.run([sys.executable, str(script), REPO, str(tmp_path / "store")], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "process group at interpreter shutdown: False" in proc.stdout


HYDRA_CONFIG = """
common: {{user_dir: {plugin}, cpu: true, seed: 1, log_format: simple, log_interval: 1}}
task: {{_name: masked_lm, data: {data}, tokens_per_sample: 64, mask_prob: {mask_prob}}}
criterion: masked_lm
model: {{_name: tupe_r_tiny}}
optimizer: {{_name: adam}}
lr_scheduler: fixed
dataset: {{batch_size: 8, num_workers: 0}}
optimization: {{max_update: 2, lr: [0.001]}}
checkpoint: {{save_dir: {save_dir}, no_epoch_checkpoints: true}}
"""


@pytest.mark.parametrize("mask_prob", [0.0, pytest.param(0.15, marks=pytest.mark.slow)])
def test_fairseq_hydra_train_runs_the_plugins_checks(mask_prob, wikitext_bin, tmp_path):
    (tmp_path / "tiny.yaml").write_text(HYDRA_CONFIG.format(
        plugin=PLUGIN, data=wikitext_bin, mask_prob=mask_prob, save_dir=tmp_path / "save"))
    proc = subprocess.run([os.path.join(VENV_BIN, "fairseq-hydra-train"), "--config-dir", str(tmp_path),
                           "--config-name", "tiny"], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if mask_prob == 0.0:
        assert proc.returncode != 0
        assert "--mask-prob is the fraction of tokens to predict, in (0, 1), got 0.0" in proc.stdout
        assert not (tmp_path / "save" / "checkpoint_last.pt").exists()
    else:
        assert proc.returncode == 0, proc.stdout[-4000:]
        assert "configuration: arch tupe_r_tiny" in proc.stdout
        assert sorted(os.listdir(tmp_path / "save")) == ["checkpoint_best.pt", "checkpoint_last.pt"]
