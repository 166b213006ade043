"""GLUE fine-tuning: tupe-prepare-glue, tupe-finetune-glue, fairseq-validate and tupe-collect-glue, on the
excerpts of the real GLUE files in tests/data/glue."""

import hashlib
import json
import math
import os
import re
import subprocess

import pytest
import torch
from cli import logged_losses, run_fairseq, train_inner_losses
from conftest import VENV_BIN, test_data

from tupe_plugin.downstream.finetuning import pretrained_architecture
from tupe_plugin.downstream.run_record import data_fingerprint
from tupe_plugin.fairseq_fixes.unreadable_checkpoints import NotAFairseqCheckpointError
from tupe_plugin.cli.fairseq_logs import valid_lines
from tupe_plugin.glue import prepare as prepare_glue
from tupe_plugin.glue import scores as collect_glue_scores
from tupe_plugin.glue.finetune import main as finetune_glue_main
from tupe_plugin.glue.tasks import GLUE_TASKS

GLUE = ("SST-2", "CoLA", "MRPC", "RTE", "STS-B")
FINETUNED = ("SST-2", "STS-B")


def glue_slice(tmp_path, task, split, rows, extra_lines=()):
    """Copy the header (if any) and the first ``rows`` rows of a real GLUE file, then ``extra_lines``."""
    with open(test_data("glue", task, f"{split}.tsv"), encoding="utf-8") as f:
        lines = [next(f) for _ in range(rows + (task != "CoLA"))]
    path = tmp_path / task / f"{split}.tsv"
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(lines) + "".join(f"{line}\n" for line in extra_lines), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("task", GLUE)
def test_every_layout_reads_inputs_and_labels(task, tmp_path):
    layout = GLUE_TASKS[task]
    rows, skipped = prepare_glue.read_tsv(glue_slice(tmp_path, task, "train", 20), layout)
    assert len(rows) == 20 and skipped == 0
    assert all(len(inputs) == (2 if layout.input1 is not None else 1) and all(inputs)
               for _, inputs, _ in rows)
    labels = {label for _, _, label in rows}
    if task == "RTE":
        assert labels <= {"entailment", "not_entailment"}
    elif task != "STS-B":
        assert labels <= {"0", "1"}  # MRPC: the byte-order mark stays out of the header, not in a label


def test_wrong_column_count_names_file_and_line(tmp_path):
    path = glue_slice(tmp_path, "RTE", "train", 5, ["9\tonly two columns"])
    with pytest.raises(prepare_glue.GlueFormatError, match=rf"{path}:7: expected 4 .* found 2"):
        prepare_glue.read_tsv(path, GLUE_TASKS["RTE"])
    rows, skipped = prepare_glue.read_tsv(path, GLUE_TASKS["RTE"], skip_malformed=True)
    assert (len(rows), skipped) == (5, 1)


def test_wrong_column_count_stops_the_command_line(tmp_path):
    glue_slice(tmp_path, "CoLA", "train", 5, ["gj04\t1\tno sentence column"])
    glue_slice(tmp_path, "CoLA", "dev", 5)
    (tmp_path / "spm.model").write_text("unused: the error comes first")
    (tmp_path / "dict.txt").write_text("")
    with pytest.raises(SystemExit, match=r"CoLA/train.tsv:6: expected 4 .* found 3"):
        prepare_glue.main(["--task", "CoLA", "--glue-dir", str(tmp_path), "--out", str(tmp_path / "out"),
                           "--sentencepiece-model", str(tmp_path / "spm.model"),
                           "--dict", str(tmp_path / "dict.txt")])


def test_dev_label_unseen_in_train_is_an_error(tmp_path):
    with open(test_data("glue", "RTE", "train.tsv"), encoding="utf-8") as f:
        lines = list(f)
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "train.tsv").write_text(
        lines[0] + "".join([line for line in lines[1:] if line.endswith("\tentailment\n")][:10]))
    glue_slice(tmp_path, "RTE", "dev", 10)
    (tmp_path / "spm.model").write_text("unused: the error comes first")
    (tmp_path / "dict.txt").write_text("")
    with pytest.raises(prepare_glue.GlueFormatError,
                       match=r"RTE/dev.tsv:\d+: label 'not_entailment' does not occur in train"):
        prepare_glue.prepare("RTE", str(tmp_path), str(tmp_path / "spm.model"), str(tmp_path / "dict.txt"),
                             str(tmp_path / "out"))


def test_a_torch_file_that_is_no_fairseq_checkpoint_is_refused_naming_it(tmp_path):
    path = tmp_path / "state_dict.pt"
    torch.save({"encoder.weight": torch.zeros(2)}, path)
    with pytest.raises(NotAFairseqCheckpointError, match=f"{path} is a torch file but not a fairseq "):
        pretrained_architecture(str(path))


def test_sts_b_scores_become_float_targets_divided_by_five(tmp_path):
    path = glue_slice(tmp_path, "STS-B", "train", 10)
    rows, _ = prepare_glue.read_tsv(path, GLUE_TASKS["STS-B"])
    with open(path, encoding="utf-8") as f:
        scores = [float(line.rstrip("\n").split("\t")[-1]) for line in list(f)[1:]]
    assert prepare_glue.regression_targets(path, rows) == pytest.approx([s / 5 for s in scores])
    with pytest.raises(prepare_glue.GlueFormatError, match=rf"{path}:2: score 'high' is not a number"):
        prepare_glue.regression_targets(path, [(2, ["a", "b"], "high")])


def test_the_folders_are_binarized_in_one_process_and_a_failure_names_its_folder(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("a b c\nb c\n", encoding="utf-8")
    folders = [(str(tmp_path / "first"), str(text), str(text), None),
               (str(tmp_path / "second"), str(tmp_path / "missing"), str(text), None)]
    with pytest.raises(RuntimeError) as error:
        prepare_glue.binarize(folders)
    assert str(error.value).startswith(f"fairseq-preprocess for {tmp_path / 'second'} failed:\n")
    assert "missing" in str(error.value)
    assert sorted(path.name for path in (tmp_path / "first").iterdir()) == [
        "dict.txt", "preprocess.log", "train.bin", "train.idx", "valid.bin", "valid.idx"]
    assert str(tmp_path / "second") not in (tmp_path / "first" / "preprocess.log").read_text()


def finetune_glue_argv(task, pretrained_dir, root, save_dir=None, checkpoint=None, flags=()):
    """tupe-finetune-glue's arguments for the first 48 examples of ``task``, 3 updates, into ``save_dir``
    (default ``ROOT/runs/TASK``); ``flags`` replace the values of those given."""
    settings = {"--max-examples": "48", "--max-epoch": "1", "--batch-size": "16", **dict(flags)}
    checkpoint = checkpoint or pretrained_dir / "checkpoints" / "checkpoint_last.pt"
    return [str(a) for a in (
        task, checkpoint, pretrained_dir / "data-bin",
        "--glue-dir", test_data("glue"), *[item for pair in settings.items() for item in pair],
        "--cpu", "--bin-dir", root / f"{task}-bin", "--save-dir", save_dir or root / "runs" / task,
        "--max-update", "3", "--log-interval", "1", "--num-workers", "0")]


def finetune_glue(task, pretrained_dir, root):
    """tupe-finetune-glue on the first 48 examples of ``task``, 3 updates; its output."""
    proc = subprocess.run(
        [os.path.join(VENV_BIN, "tupe-finetune-glue"), *finetune_glue_argv(task, pretrained_dir, root)],
        cwd=root, env=dict(os.environ, PYTHONWARNINGS="ignore"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


@pytest.fixture(scope="module")
def finetuned(pretrained_dir, tmp_path_factory):
    """tupe-finetune-glue for SST-2 and STS-B on their first 48 examples, 3 updates each."""
    root = tmp_path_factory.mktemp("glue")
    return {task: (root / f"{task}-bin", root / "runs" / task, finetune_glue(task, pretrained_dir, root))
            for task in FINETUNED}


@pytest.mark.parametrize("task", FINETUNED)
def test_finetuning_logs_finite_losses_and_the_task_metric(finetuned, task):
    _, save_dir, output = finetuned[task]
    assert "Loaded checkpoint" in output and f"{task}: train 48, valid 48" in output
    losses = train_inner_losses(output) + logged_losses(output, "valid")
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    assert f"| {GLUE_TASKS[task].metric} " in output.split("valid on 'valid' subset")[-1]
    assert (save_dir / "checkpoint_best.pt").is_file()


@pytest.mark.parametrize("task", FINETUNED)
def test_finetuning_ends_with_the_best_dev_score_the_checkpoint_and_the_folder(finetuned, task):
    _, save_dir, output = finetuned[task]
    metric = GLUE_TASKS[task].metric
    best = max(fields[metric] for fields in valid_lines(save_dir / "train.log"))
    end = output.splitlines()[-4:]
    assert end[0] == f"tupe-finetune-glue: {task} done"
    shown = "".join(rf", {name} [0-9.]+" for name in GLUE_TASKS[task].shown if name != metric)
    shown = rf" \({shown[2:]}\)" if shown else ""  # STS-B: pearson and spearman beside their mean
    assert re.fullmatch(rf"dev {metric}: +{best:.3f}{shown}, the best of 1 evaluation\(s\), at update 3",
                        end[1])
    assert re.fullmatch(rf"checkpoint: +{re.escape(str(save_dir / 'checkpoint_best.pt'))} .*", end[2])
    assert re.fullmatch(rf"output folder: +{re.escape(str(save_dir))} \(train.log.*", end[3])


@pytest.mark.parametrize("task", FINETUNED)
def test_fairseq_validate_reproduces_the_dev_loss_and_metric(finetuned, task):
    bin_dir, save_dir, output = finetuned[task]
    validated = run_fairseq("validate", bin_dir, "--user-dir", "tupe_plugin", "--path",
                            save_dir / "checkpoint_best.pt", "--task", "sentence_prediction",
                            "--criterion", "sentence_prediction", "--batch-size", 32, "--cpu")
    assert logged_losses(validated, "valid") == logged_losses(output, "valid")[-1:]
    assert f"| {GLUE_TASKS[task].metric} " in validated


def test_collected_scores_table(finetuned, capsys):
    collect_glue_scores.main([str(save_dir) for _, save_dir, _ in finetuned.values()])
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "| arch | SST-2 (accuracy) | STS-B (pearson_and_spearman) |"
    assert table[2].startswith("| tupe_r_tiny | ") and table[2].endswith(" (1) |")


def test_rerunning_a_finished_finetuning_keeps_its_best_checkpoint_and_log(finetuned, pretrained_dir):
    _, save_dir, _ = finetuned["SST-2"]
    best = hashlib.sha256((save_dir / "checkpoint_best.pt").read_bytes()).hexdigest()
    log_before = (save_dir / "train.log").read_text(encoding="utf-8")
    output = finetune_glue("SST-2", pretrained_dir, save_dir.parent.parent)
    assert f"Loaded checkpoint {save_dir / 'checkpoint_last.pt'}" in output
    assert train_inner_losses(output) == []
    assert hashlib.sha256((save_dir / "checkpoint_best.pt").read_bytes()).hexdigest() == best
    log_after = (save_dir / "train.log").read_text(encoding="utf-8")
    assert log_after.startswith(log_before) and len(log_after) > len(log_before)


def folder_contents(folder):
    """{file name: sha256 of its bytes} of ``folder``."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


def refused_rerun(argv, capsys):
    """tupe-finetune-glue ``argv`` in this process, which must stop with an error; the error."""
    with pytest.raises(SystemExit) as exit_info:
        finetune_glue_main(argv)
    assert exit_info.value.code not in (0, None)
    return capsys.readouterr().err


def test_the_run_record_names_the_settings_and_the_data_the_model_was_trained_with(finetuned, pretrained_dir):
    bin_dir, save_dir, _ = finetuned["SST-2"]
    record = json.loads((save_dir / "run.json").read_text(encoding="utf-8"))
    assert record == {
        "task": "SST-2", "arch": "tupe_r_tiny", "seed": 1, "metric": "accuracy", "lr": "2e-5",
        "checkpoint": os.path.realpath(pretrained_dir / "checkpoints" / "checkpoint_last.pt"),
        "batch_size": 16, "max_epoch": 1, "max_examples": 48,
        "fairseq_args": ["--max-update", "3", "--log-interval", "1", "--num-workers", "0"],
        "data": {"fingerprint": data_fingerprint(bin_dir), "source": f"--glue-dir {test_data('glue')}"}}


def test_a_rerun_with_a_checkpoint_of_another_arch_is_refused_and_changes_no_file(finetuned, pretrained_dir,
                                                                                  capsys):
    _, save_dir, _ = finetuned["SST-2"]
    before = folder_contents(save_dir)
    other = test_data("checkpoints", "bert_alibi_asym.pt")
    err = refused_rerun(finetune_glue_argv("SST-2", pretrained_dir, save_dir.parent.parent, checkpoint=other),
                        capsys)
    assert f"--save-dir {save_dir} holds a SST-2 run trained with other settings" in err
    pretrained = os.path.realpath(pretrained_dir / "checkpoints" / "checkpoint_last.pt")
    assert f"CKPT {os.path.realpath(other)} (the run: {pretrained}); arch (of CKPT) bert_alibi_asym_tiny " \
        "(the run: tupe_r_tiny)" in err
    assert folder_contents(save_dir) == before


def test_another_task_into_a_finished_runs_save_dir_is_refused_naming_both(finetuned, pretrained_dir, capsys):
    _, save_dir, _ = finetuned["SST-2"]
    before = folder_contents(save_dir)
    err = refused_rerun(finetune_glue_argv("RTE", pretrained_dir, save_dir.parent.parent, save_dir=save_dir),
                        capsys)
    assert f"--save-dir {save_dir} holds a fine-tuning run of SST-2 (run.json, checkpoint_last.pt), which " \
        "this RTE run would resume and relabel: give another --save-dir" in err
    assert folder_contents(save_dir) == before


def test_a_resume_with_other_training_flags_is_refused_listing_them(finetuned, pretrained_dir, capsys):
    _, save_dir, _ = finetuned["SST-2"]
    before = folder_contents(save_dir)
    err = refused_rerun(finetune_glue_argv("SST-2", pretrained_dir, save_dir.parent.parent, flags={
        "--lr": "1e-5", "--batch-size": "8", "--max-epoch": "2"}), capsys)
    assert "--lr 1e-5 (the run: 2e-5); --batch-size 8 (the run: 16); --max-epoch 2 (the run: 1). A rerun " \
        "resumes the run from its checkpoint_last.pt: rerun with its settings, or give another --save-dir " \
        "to start a new run (the learning rate decays to 0 over the epochs a run is given: more cannot be " \
        "added)" in err
    assert folder_contents(save_dir) == before


def glue_with_flipped_labels(root, task, split):
    """A --glue-dir whose ``task`` holds the first 48 examples of tests/data/glue, with the labels of
    ``split`` ("train" or "dev") flipped."""
    root.mkdir()
    for name in ("train", "dev"):
        path = glue_slice(root, task, name, 48)
        if name == split:
            lines = open(path, encoding="utf-8").read().splitlines()
            flipped = [line[:-1] + {"0": "1", "1": "0"}[line[-1]] for line in lines[1:]]
            open(path, "w", encoding="utf-8").write("\n".join(lines[:1] + flipped) + "\n")
    return root


def tree_contents(folder):
    """{path relative to ``folder``: sha256 of its bytes} of every file under ``folder``."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def prepared_fingerprint(pretrained_dir, glue_dir, out):
    """The data fingerprint of the first 48 examples of SST-2 in ``glue_dir`` prepared into ``out``."""
    data_bin = pretrained_dir / "data-bin"
    prepare_glue.prepare("SST-2", str(glue_dir), str(data_bin / "sentencepiece.bpe.model"),
                         str(data_bin / "dict.txt"), str(out), max_examples=48)
    return data_fingerprint(out)


def test_the_same_data_prepared_into_another_folder_have_the_same_fingerprint(finetuned, pretrained_dir,
                                                                               tmp_path):
    """fairseq-preprocess's log, which names the folder it wrote, is no data."""
    bin_dir, _, _ = finetuned["SST-2"]
    assert prepared_fingerprint(pretrained_dir, test_data("glue"), tmp_path / "again") == \
        data_fingerprint(bin_dir)


@pytest.mark.parametrize("split", ["train", "dev"])
def test_a_resume_on_other_data_is_refused_naming_both_and_changes_no_file(finetuned, pretrained_dir, split,
                                                                          tmp_path, capsys):
    """The run's labels flipped in its training data, or in its dev set (which picks the best checkpoint),
    prepared into the run's --bin-dir: the refusal leaves its encoded data as they were."""
    bin_dir, save_dir, _ = finetuned["SST-2"]
    before, data_before = folder_contents(save_dir), tree_contents(bin_dir)
    other = glue_with_flipped_labels(tmp_path / "glue2", "SST-2", split)
    argv = finetune_glue_argv("SST-2", pretrained_dir, save_dir.parent.parent) + ["--glue-dir", str(other)]
    err = refused_rerun(argv, capsys)
    assert err.splitlines()[-1].endswith(
        f"--save-dir {save_dir} holds a SST-2 run trained on other data than this command's: the run's, from "
        f"--glue-dir {test_data('glue')}, have fingerprint {data_fingerprint(bin_dir)} (run.json); this "
        f"command's, from --glue-dir {other}, "
        f"{prepared_fingerprint(pretrained_dir, other, tmp_path / 'other-bin')}. A rerun resumes the run "
        "from its checkpoint_last.pt: rerun with the run's data, or give another --save-dir to start a new "
        "run")
    assert folder_contents(save_dir) == before
    assert tree_contents(bin_dir) == data_before
    assert sorted(path.name for path in bin_dir.parent.iterdir() if path.name.startswith(bin_dir.name)) == \
        [bin_dir.name]  # the preparation made aside is removed


def test_a_refused_resume_on_other_data_leaves_no_new_bin_dir(finetuned, pretrained_dir, tmp_path, capsys):
    _, save_dir, _ = finetuned["SST-2"]
    other = glue_with_flipped_labels(tmp_path / "glue2", "SST-2", "train")
    argv = finetune_glue_argv("SST-2", pretrained_dir, save_dir.parent.parent) + [
        "--glue-dir", str(other), "--bin-dir", str(tmp_path / "new-bin")]
    assert "trained on other data than this command's" in refused_rerun(argv, capsys)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["glue2"]
