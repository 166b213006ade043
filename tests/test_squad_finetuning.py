"""SQuAD v1.1 end to end on slices of the real dev-v1.1.json: tupe-finetune-squad (prepare ->
fairseq-train from a tiny masked-LM checkpoint -> evaluation printing EM/F1), then fairseq-validate."""

import json
import math
import os
import re
import subprocess

import pytest
from cli import logged_losses, run_fairseq, train_inner_losses
from conftest import VENV_BIN, test_data

from tupe_plugin.downstream.run_record import data_fingerprint
from tupe_plugin.squad import prepare as prepare_squad
from tupe_plugin.squad.metric import evaluate

pytestmark = pytest.mark.slow


def squad_slice(path, article, paragraphs):
    with open(test_data("squad", "dev-v1.1.head.json"), encoding="utf-8") as f:
        source = json.load(f)["data"][article]
    data = [dict(source, paragraphs=source["paragraphs"][:paragraphs])]
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return data


def finetune_squad(pretrained_dir, root, train_file):
    """tupe-finetune-squad from the tiny checkpoint on ``root / train_file``, validated on ``root``'s
    dev.json, into ``root``'s squad-bin and run, 3 updates."""
    return subprocess.run(
        [os.path.join(VENV_BIN, "tupe-finetune-squad"), "1.1",
         pretrained_dir / "checkpoints" / "checkpoint_last.pt", pretrained_dir / "data-bin", "--cpu",
         "--batch-size", "16", "--max-seq-length", "64", "--doc-stride", "16", "--max-query-length", "40",
         "--train-file", root / train_file, "--valid-file", root / "dev.json",
         "--bin-dir", root / "squad-bin", "--save-dir", root / "run",
         "--max-update", "3", "--log-interval", "1", "--num-workers", "0"],
        cwd=root, env=dict(os.environ, PYTHONWARNINGS="ignore"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


@pytest.fixture(scope="module")
def finetuned(pretrained_dir, tmp_path_factory):
    """tupe-finetune-squad on 3 paragraphs (train) and 2 paragraphs of another article (valid), 3 updates."""
    root = tmp_path_factory.mktemp("squad")
    squad_slice(root / "train.json", 0, 3)
    valid = squad_slice(root / "dev.json", 1, 2)
    proc = finetune_squad(pretrained_dir, root, "train.json")
    assert proc.returncode == 0, proc.stdout[-4000:]
    return root, valid, proc.stdout


def test_finetuning_logs_finite_losses_and_span_accuracies(finetuned):
    _, _, output = finetuned
    assert "Loaded checkpoint" in output
    losses = train_inner_losses(output) + logged_losses(output, "valid")
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    assert re.search(r"valid on 'valid' subset \| loss [0-9.]+ \| start_accuracy [0-9.]+ \| "
                     r"end_accuracy [0-9.]+ \| span_accuracy [0-9.]+", output)


def test_fairseq_validate_reproduces_the_dev_loss(finetuned):
    root, _, output = finetuned
    validated = run_fairseq("validate", root / "squad-bin", "--user-dir", "tupe_plugin", "--path",
                            root / "run" / "checkpoint_best.pt", "--task", "squad_span",
                            "--criterion", "squad_span", "--batch-size", 32, "--cpu")
    assert logged_losses(validated, "valid") == logged_losses(output, "valid")[-1:]
    assert "| span_accuracy " in validated


def test_evaluation_prints_em_and_f1_of_the_written_predictions(finetuned):
    root, valid, output = finetuned
    printed = json.loads(re.findall(r'^\{"exact_match": .*\}$', output, re.M)[-1])
    with open(root / "run" / "predictions.json", encoding="utf-8") as f:
        predictions = json.load(f)
    skipped = int(re.search(r"valid: \d+ questions .* skipped: (\d+) questions longer", output).group(1))
    questions = [qa for p in valid[0]["paragraphs"] for qa in p["qas"]]
    assert len(predictions) == len(questions) - skipped and all(predictions.values())
    scores = evaluate(valid, predictions)
    assert printed == {"exact_match": round(scores["exact_match"], 2), "f1": round(scores["f1"], 2)}
    assert 0 <= printed["exact_match"] <= printed["f1"] <= 100


def test_restore_file_of_another_arch_stops_with_the_checkpoint_and_arch(finetuned, pretrained_dir):
    root, _, _ = finetuned
    checkpoint = pretrained_dir / "checkpoints" / "checkpoint_last.pt"
    proc = run_fairseq("train", root / "squad-bin", "--user-dir", "tupe_plugin", "--task", "squad_span",
                       "--criterion", "squad_span", "--arch", "bert_a_tiny", "--restore-file", checkpoint,
                       "--reset-optimizer", "--max-positions", 64, "--batch-size", 16, "--max-update", 1,
                       "--optimizer", "adam", "--lr", 1e-5, "--save-dir", root / "wrong", "--cpu",
                       check=False)
    assert proc.returncode != 0
    assert f"{checkpoint} does not fit this command" in proc.stdout
    assert "--arch bert_a_tiny gives --abs-pos learned but the checkpoint (--arch tupe_r_tiny)" in proc.stdout


def test_the_run_record_names_the_version_and_the_window_settings(finetuned):
    root, _, _ = finetuned
    record = json.loads((root / "run" / "run.json").read_text(encoding="utf-8"))
    assert record["task"] == "SQuAD v1.1" and record["arch"] == "tupe_r_tiny"
    assert {key: record[key] for key in ("batch_size", "max_epoch", "max_seq_length", "doc_stride",
                                         "max_query_length")} == {
        "batch_size": 16, "max_epoch": 3, "max_seq_length": 64, "doc_stride": 16, "max_query_length": 40}


def tree_contents(folder):
    """{path relative to ``folder``: its bytes} of every file under ``folder``."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file()}


def test_a_resume_with_another_train_file_is_refused_naming_both_and_changes_no_file(finetuned,
                                                                                      pretrained_dir):
    """The other questions are prepared aside: the run's --bin-dir keeps its encoded data."""
    root, _, _ = finetuned
    before, data_before = tree_contents(root / "run"), tree_contents(root / "squad-bin")
    squad_slice(root / "other-train.json", 0, 2)
    prepare_squad.prepare({"train": str(root / "other-train.json"), "valid": str(root / "dev.json")},
                          str(pretrained_dir / "data-bin" / "sentencepiece.bpe.model"),
                          str(pretrained_dir / "data-bin" / "dict.txt"), str(root / "other-bin"),
                          max_seq_length=64, doc_stride=16, max_query_length=40)
    proc = finetune_squad(pretrained_dir, root, "other-train.json")
    assert proc.returncode == 2
    assert proc.stdout.splitlines()[-1].endswith(
        f"holds a SQuAD v1.1 run trained on other data than this command's: the run's, from --train-file "
        f"{root / 'train.json'} --valid-file {root / 'dev.json'}, have fingerprint "
        f"{data_fingerprint(root / 'squad-bin')} (run.json); this command's, from --train-file "
        f"{root / 'other-train.json'} --valid-file {root / 'dev.json'}, "
        f"{data_fingerprint(root / 'other-bin')}. "
        "A rerun resumes the run from its checkpoint_last.pt: rerun with the run's data, or give another "
        "--save-dir to start a new run")
    assert tree_contents(root / "run") == before
    assert tree_contents(root / "squad-bin") == data_before
    assert not [path for path in root.iterdir() if path.name.startswith("squad-bin.")]
