"""Misuse is refused with a message naming the flag or file and the fix (docs/troubleshooting.md).

Flag combinations, left padding, GLUE files and a learned table validated longer are tested beside the
code they guard (tests/test_architectures.py, test_padding.py, test_glue_finetuning.py,
test_length_generalisation.py); this file holds the rest.
"""

import os
import shutil

import pytest
from cli import run_fairseq, train_args, validate_args
from conftest import build_model, make_dictionary, random_tokens, test_data
from fairseq import checkpoint_utils
from fairseq.data import data_utils

from tupe_plugin.fairseq_fixes.binarized_data_checks import BinarizedDataError
from tupe_plugin.encodings.position_config import PositionFlagError
from tupe_plugin.fairseq_fixes.checkpoint_paths import CheckpointPathError
from tupe_plugin.fairseq_fixes.unreadable_checkpoints import UnreadableCheckpointError
from tupe_plugin.models import TupeRobertaModel


@pytest.mark.parametrize("flags, message", [
    (dict(max_positions=0), "--max-positions must be positive, got 0"),
    (dict(encoder_layers=0), "--encoder-layers must be positive, got 0"),
    (dict(encoder_ffn_embed_dim=-512), "--encoder-ffn-embed-dim must be positive, got -512"),
    (dict(dropout=-0.1), r"--dropout is a probability in \[0, 1\), got -0.1"),
    (dict(attention_dropout=1.5), r"--attention-dropout is a probability in \[0, 1\), got 1.5"),
    (dict(max_positions=16, tokens_per_sample=64),
     "--max-positions 16 is below --tokens-per-sample 64: fairseq would silently drop"),
    (dict(rel_pos="shaw-learned", shaw_max_distance=0), "--shaw-max-distance must be >= 1, got 0"),
    (dict(rel_pos_max_distance=-5), r"--rel-pos-max-distance \(-5\) must exceed"),
    (dict(abs_pos="sinusoidal", untied_pos="none", cls_reset="none", encoder_embed_dim=127,
          encoder_attention_heads=1), "--abs-pos sinusoidal needs an even --encoder-embed-dim, got 127"),
])
def test_numeric_flag_out_of_range_is_refused_naming_it(flags, message, dictionary):
    with pytest.raises(PositionFlagError, match=message):
        build_model("tupe_r_tiny", dictionary, **flags)


@pytest.mark.parametrize("arch, table", [
    ("bert_a_tiny", "learned absolute positions"),
    ("tupe_a_tiny", "learned positions of the untied positional table"),
    ("bert_a_d_tiny", "learned positions of the untied positional table"),
])
def test_input_longer_than_a_learned_table_names_max_positions(arch, table, dictionary):
    model = build_model(arch, dictionary, max_positions=8)
    with pytest.raises(ValueError, match=f"input of 12 tokens is longer than the 8 {table}.*--max-positions"):
        model(random_tokens(dictionary, [12, 3]))


def test_token_ids_outside_the_dictionary_are_refused_clearly(dictionary):
    model = build_model("bert_a_tiny", dictionary)
    tokens = random_tokens(dictionary, [5])
    tokens[0, 2] = len(dictionary) + 3
    with pytest.raises(ValueError, match=f"token id {len(dictionary) + 3} is outside the dictionary "
                                         f"of {len(dictionary)} symbols"):
        model(tokens)


def test_state_dict_of_another_vocabulary_is_refused_naming_the_dictionary():
    saved = build_model("tupe_r_tiny", make_dictionary(40)).state_dict()
    model = build_model("tupe_r_tiny", make_dictionary(60))
    with pytest.raises(ValueError, match=r"vocabulary has 45 symbols but this model's dictionary has 65.*"
                                         r"--srcdict"):
        model.upgrade_state_dict_named(saved, "")


@pytest.fixture
def binarized(wikitext_bin, tmp_path):
    """A private copy of the binarized WikiText slice, to break."""
    return shutil.copytree(wikitext_bin, tmp_path / "bin")


def test_missing_bin_file_is_reported_by_fairseq(binarized):
    (binarized / "train.bin").unlink()
    assert data_utils.load_indexed_dataset(str(binarized / "train"), None) is None  # masked_lm then says
    # "Dataset not found: train (DATA/train)"; see test_misuse_reaches_the_command_line


@pytest.mark.parametrize("suffix, message", [
    (".idx", r"train.idx is truncated \(\d+ of \d+ bytes for 300 sentences\)"),
    (".bin", r"train.bin is truncated \(\d+ of \d+ bytes listed in .*train.idx\)"),
])
def test_truncated_binarized_file_is_refused_naming_it(suffix, message, binarized):
    path = binarized / f"train{suffix}"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    with pytest.raises(BinarizedDataError, match=message):
        data_utils.load_indexed_dataset(str(binarized / "train"), None)


def test_empty_corpus_is_refused_naming_the_split(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    run_fairseq("preprocess", "--only-source", "--trainpref", tmp_path / "empty.txt",
                "--destdir", tmp_path / "bin", "--workers", 1)
    with pytest.raises(BinarizedDataError, match="train.idx holds no sentences"):
        data_utils.load_indexed_dataset(str(tmp_path / "bin" / "train"), None)


@pytest.fixture(scope="module")
def trained(wikitext_bin, tmp_path_factory):
    """A bert_a_tiny checkpoint after one update."""
    save_dir = tmp_path_factory.mktemp("trained")
    run_fairseq("train", *train_args(wikitext_bin, save_dir, "bert_a_tiny", 1))
    return save_dir / "checkpoint_last.pt"


@pytest.mark.parametrize("damage", ["truncated", "text file"])
def test_unreadable_checkpoint_is_refused_naming_the_file(damage, trained, tmp_path):
    path = tmp_path / "checkpoint_last.pt"
    if damage == "truncated":
        path.write_bytes(trained.read_bytes()[:100000])
        reason = "it is truncated: a zip archive that ends before its directory"
    else:
        path.write_text("not a checkpoint\n")
        reason = "it is not a file written by torch.save"
    with pytest.raises(UnreadableCheckpointError, match=f"^{path} .* cannot be read as a checkpoint: "
                                                        f"{reason}. Resume .*--restore-file"):
        checkpoint_utils.load_model_ensemble_and_task([str(path)])


def not_a_file(tmp_path, kind):
    """(a path of ``kind`` where a checkpoint file is expected, what the refusal calls it)."""
    path = tmp_path / "given.pt"
    if kind == "folder":
        path.mkdir()
    if kind == "symlink loop":
        path.symlink_to(tmp_path / "other.pt")
        (tmp_path / "other.pt").symlink_to(path)
    return path, {"missing": "no such file", "folder": "a folder, not a file",
                  "symlink loop": "a symlink loop, not a file"}[kind]


def last_line_of_refusal(proc):
    assert proc.returncode != 0 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("kind", ["missing", "folder", "symlink loop"])
def test_validating_a_path_that_is_no_file_is_refused_in_one_line(kind, wikitext_bin, tmp_path):
    path, problem = not_a_file(tmp_path, kind)
    proc = run_fairseq("validate", *validate_args(wikitext_bin, path), check=False)
    assert last_line_of_refusal(proc).startswith(f"error: --path {path}: {problem}: give "), \
        proc.stdout[-3000:]


@pytest.mark.parametrize("kind", ["missing", "folder"])
def test_fine_tuning_from_a_path_that_is_no_file_is_refused_in_one_line(kind, wikitext_bin, tmp_path):
    path, problem = not_a_file(tmp_path, kind)
    proc = run_fairseq("train", *train_args(wikitext_bin, tmp_path / "save", "bert_a_tiny", 1,
                                            "--finetune-from-model", path), check=False)
    assert last_line_of_refusal(proc).startswith(f"error: --finetune-from-model {path}: {problem}: give "), \
        proc.stdout[-3000:]


@pytest.mark.parametrize("kind", ["missing", "folder"])
def test_from_pretrained_without_its_checkpoint_file_names_the_one_the_folder_holds(kind, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(test_data("checkpoints", "tupe_r.pt"), folder / "checkpoint_best.pt")
    path, problem = not_a_file(folder, kind)
    with pytest.raises(CheckpointPathError, match=f"^from_pretrained checkpoint_file='given.pt': {path}: "
                                                  f"{problem}: pass checkpoint_file='checkpoint_best.pt'$"):
        TupeRobertaModel.from_pretrained(str(folder), checkpoint_file=os.path.basename(path),
                                         data_name_or_path=test_data("checkpoints"), bpe=None)


def test_checkpoint_of_another_vocabulary_is_refused_when_validating(trained, tmp_path):
    (tmp_path / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(30)))
    with pytest.raises(ValueError, match="the checkpoint's vocabulary has .* symbols but this model's "
                                         "dictionary has 35"):
        checkpoint_utils.load_model_ensemble_and_task([str(trained)], arg_overrides={"data": str(tmp_path)})


@pytest.mark.slow
@pytest.mark.parametrize("case", ["restore another arch", "max-positions below the data",
                                  "missing .bin", "truncated .bin", "corrupt checkpoint_last.pt"])
def test_misuse_reaches_the_command_line(case, trained, wikitext_bin, tmp_path):
    data, save_dir, extra = shutil.copytree(wikitext_bin, tmp_path / "bin"), tmp_path / "save", []
    if case == "restore another arch":
        extra = ["--restore-file", trained, "--reset-optimizer"]
        arch, message = "tupe_r_tiny", "--arch tupe_r_tiny gives --abs-pos none but the checkpoint"
    else:
        arch = "bert_a_tiny"
    if case == "max-positions below the data":
        extra, message = ["--max-positions", 16], "--max-positions 16 is below --tokens-per-sample 64"
    if case == "missing .bin":
        (data / "train.bin").unlink()
        message = "Dataset not found: train"
    if case == "truncated .bin":
        (data / "train.bin").write_bytes((data / "train.bin").read_bytes()[:1000])
        message = "train.bin is truncated"
    if case == "corrupt checkpoint_last.pt":
        save_dir.mkdir()
        (save_dir / "checkpoint_last.pt").write_bytes(trained.read_bytes()[:100000])
        message = "checkpoint_last.pt (100000 bytes) cannot be read as a checkpoint: it is truncated"
    proc = run_fairseq("train", *train_args(data, save_dir, arch, 1, *extra), check=False)
    assert proc.returncode != 0
    assert message in proc.stdout, proc.stdout[-3000:]
