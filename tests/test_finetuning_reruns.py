"""A rerun of tupe-finetune-glue or tupe-finetune-squad into a --save-dir that holds a run resumes it only for
the same task and settings, and SAVE_DIR/run.json is written once a new run starts training; on folders
built from the tiny checkpoints of tests/data/checkpoints, without fairseq-train."""

import json
import shutil
import sys

import pytest
import torch
from conftest import test_data

from tupe_plugin.downstream.finetuning import train_recorded
from tupe_plugin.downstream.run_record import data_conflict, data_fingerprint, setting_changes
from tupe_plugin.glue import finetune as finetune_glue
from tupe_plugin.squad import finetune as finetune_squad

CHECKPOINT = test_data("checkpoints", "tupe_r.pt")  # a masked_lm run of --arch tupe_r_tiny


@pytest.fixture
def data_bin(tmp_path):
    """A DATA_BIN the tools accept as given (a rerun is judged before its files are read)."""
    folder = tmp_path / "data-bin"
    folder.mkdir()
    (folder / "sentencepiece.bpe.model").write_text("unread")
    (folder / "dict.txt").write_text("unread")
    return folder


def run_folder(tmp_path, record=None, fairseq_task=None):
    """A --save-dir holding a run: CKPT as its checkpoint_last.pt (trained on ``fairseq_task``, default
    masked_lm), and ``record`` as its run.json."""
    folder = tmp_path / "run"
    folder.mkdir()
    if fairseq_task is None:
        shutil.copy(CHECKPOINT, folder / "checkpoint_last.pt")
    else:
        state = torch.load(CHECKPOINT, weights_only=False)
        state["cfg"]["task"]["_name"] = fairseq_task
        torch.save(state, folder / "checkpoint_last.pt")
    if record is not None:
        (folder / "run.json").write_text(json.dumps(record))
    return folder


def glue_argv(task, data_bin, save_dir):
    return [task, CHECKPOINT, data_bin, "--glue-dir", test_data("glue"), "--save-dir", save_dir]


def squad_argv(version, data_bin, save_dir):
    squad = test_data("squad", "dev-v1.1.head.json")
    return [version, CHECKPOINT, data_bin, "--train-file", squad, "--valid-file", squad,
            "--save-dir", save_dir]


def refused(main, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    assert exit_info.value.code not in (0, None)
    return capsys.readouterr().err


def contents(folder):
    return {path.name: path.read_bytes() for path in folder.iterdir()}


@pytest.mark.parametrize("tool, argv, first, saved, wanted", [
    (finetune_squad, squad_argv, "1.1", "RTE", "SQuAD v1.1"),
    (finetune_glue, glue_argv, "RTE", "SQuAD v1.1", "RTE"),
    (finetune_squad, squad_argv, "1.1", "SQuAD v2.0", "SQuAD v1.1"),
])
def test_a_run_of_another_task_in_save_dir_is_refused_naming_both(tool, argv, first, saved, wanted, tmp_path,
                                                                   data_bin, capsys):
    folder = run_folder(tmp_path, {"task": saved, "arch": "tupe_r_tiny", "seed": 1})
    before = contents(folder)
    err = refused(tool.main, argv(first, data_bin, folder), capsys)
    assert f"--save-dir {folder} holds a fine-tuning run of {saved} (run.json, checkpoint_last.pt), " \
        f"which this {wanted} run would resume and relabel: give another --save-dir" in err
    assert contents(folder) == before


@pytest.mark.parametrize("fairseq_task", ["squad_span", None])
def test_a_folder_without_a_record_is_judged_by_the_fairseq_task_of_its_checkpoint(fairseq_task, tmp_path,
                                                                                   data_bin, capsys):
    """A SQuAD run of a version without run.json, or a pre-training run's folder (masked_lm)."""
    folder = run_folder(tmp_path, fairseq_task=fairseq_task)
    err = refused(finetune_glue.main, glue_argv("RTE", data_bin, folder), capsys)
    assert f"--save-dir {folder} holds a run of fairseq's {fairseq_task or 'masked_lm'} task (its " \
        "checkpoint_last.pt; no run.json), which this RTE run (sentence_prediction) would resume: give " \
        "another --save-dir" in err
    assert sorted(path.name for path in folder.iterdir()) == ["checkpoint_last.pt"]


def test_a_squad_resume_with_other_window_settings_is_refused_listing_them(tmp_path, data_bin, capsys):
    folder = run_folder(tmp_path, {"task": "SQuAD v1.1", "arch": "tupe_r_tiny", "max_seq_length": 32,
                                   "doc_stride": 10, "max_query_length": 16})
    err = refused(finetune_squad.main, squad_argv("1.1", data_bin, folder) + ["--doc-stride", "8"], capsys)
    assert err.splitlines()[-1].endswith(
        " holds a SQuAD v1.1 run trained with other settings than this command's: --doc-stride 8 (the run: "
        "10). A rerun resumes the run from its checkpoint_last.pt: rerun with its settings, or give another "
        "--save-dir to start a new run")


def test_an_older_record_is_compared_on_the_settings_it_holds():
    saved = {"task": "RTE", "arch": "tupe_r_tiny", "seed": 1, "lr": "2e-5"}
    assert setting_changes(saved, dict(saved, lr="2e-05", batch_size=8)) == []
    assert setting_changes(saved, dict(saved, seed=2)) == ["--seed 2 (the run: 1)"]


def test_changed_fairseq_train_flags_are_listed_but_not_logging_ones():
    saved = {"task": "RTE", "fairseq_args": ["--max-update", "3", "--num-workers", "0"]}
    record = dict(saved, fairseq_args=["--num-workers", "2", "--update-freq", "2"])
    assert setting_changes(saved, record) == ["fairseq-train --max-update not given (the run: 3)",
                                              "fairseq-train --update-freq 2 (the run: not given)"]


def fake_fairseq_train(*lines, status=0):
    return [sys.executable, "-c", f"import sys; print(*{list(lines)!r}, sep='\\n'); sys.exit({status})"]


def test_a_new_run_is_recorded_once_training_starts(tmp_path):
    record = {"task": "RTE", "arch": "tupe_r_tiny"}
    assert train_recorded(fake_fairseq_train("loaded", "Start iterating over samples"), tmp_path, record) == 0
    assert json.loads((tmp_path / "run.json").read_text()) == record


def test_a_new_run_refused_before_training_writes_no_record(tmp_path):
    refused = fake_fairseq_train("error: --arch x does not fit", status=1)
    assert train_recorded(refused, tmp_path, {"task": "RTE"}) == 1
    assert not (tmp_path / "run.json").exists()


def test_a_resumed_run_keeps_its_record(tmp_path):
    folder = run_folder(tmp_path, {"task": "RTE", "arch": "tupe_r_tiny"})
    before = (folder / "run.json").read_text()
    resumed = fake_fairseq_train("Start iterating over samples")
    assert train_recorded(resumed, folder, {"task": "RTE", "arch": "other"}) == 0
    assert (folder / "run.json").read_text() == before


def test_the_data_fingerprint_changes_with_any_encoded_file_but_not_with_the_manifest(tmp_path):
    (tmp_path / "label").mkdir()
    (tmp_path / "label" / "train.bin").write_bytes(b"\x00\x01")
    (tmp_path / ".prepared.json").write_text("{}")
    first = data_fingerprint(tmp_path)
    (tmp_path / ".prepared.json").write_text('{"summary": 1}')
    assert data_fingerprint(tmp_path) == first
    (tmp_path / "label" / "train.bin").write_bytes(b"\x01\x00")
    assert data_fingerprint(tmp_path) != first


def test_a_record_without_data_is_not_compared_on_its_data(tmp_path):
    """A record older than the fingerprint, or this command's before its data are prepared."""
    data = {"fingerprint": "0123", "source": "--glue-dir glue"}
    assert data_conflict(tmp_path, {"task": "RTE"}, {"task": "RTE", "data": data}) is None
    assert data_conflict(tmp_path, {"task": "RTE", "data": data}, {"task": "RTE"}) is None
    assert data_conflict(tmp_path, {"task": "RTE", "data": data}, {"task": "RTE", "data": dict(data)}) is None
