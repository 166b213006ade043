"""Damaged checkpoint bytes and a reordered dictionary are refused by every loader, naming the file."""

import copy
import shutil
import struct
import zipfile

import pytest
from conftest import _Task, build_model, make_dictionary
from fairseq import checkpoint_utils
from fairseq.data import Dictionary

from tupe_plugin.analysis.checkpoint import load_checkpoint as load_for_analysis
from tupe_plugin.fairseq_fixes.checkpoint_integrity import CorruptCheckpointError
from tupe_plugin.models import TupeRobertaModel
from tupe_plugin.models.checkpoint_guards import DictionaryMismatchError
from tupe_plugin.encoder.pretrained_embeddings import read_checkpoint_vectors

RECORDS = {
    "the largest tensor": lambda infos: max(infos, key=lambda i: i.file_size),
    "the smallest tensor": lambda infos: min((i for i in infos if "/data/" in i.filename and i.file_size),
                                             key=lambda i: i.file_size),
    "the pickled structure": lambda infos: next(i for i in infos if i.filename.endswith("data.pkl")),
}


def damaged_copy(source, target, record="the largest tensor"):
    """``source`` copied to ``target`` with 4 bytes inverted in the middle of one zip record."""
    data = bytearray(source.read_bytes())
    with zipfile.ZipFile(source) as archive:
        info = RECORDS[record](archive.infolist())
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26: info.header_offset + 30])
    middle = info.header_offset + 30 + name_length + extra_length + info.compress_size // 2
    data[middle: middle + 4] = bytes(b ^ 0xFF for b in data[middle: middle + 4])
    target.write_bytes(bytes(data))
    return target


@pytest.fixture
def checkpoint(pretrained_dir, tmp_path):
    """A private copy of the tiny pre-trained model's folder (checkpoint, dict.txt, sentencepiece)."""
    root = tmp_path / "run"
    shutil.copytree(pretrained_dir / "checkpoints", root / "checkpoints")
    shutil.copytree(pretrained_dir / "data-bin", root / "data-bin")
    return root / "checkpoints" / "checkpoint_last.pt"


@pytest.mark.parametrize("record", RECORDS)
def test_fairseq_loader_refuses_damaged_checkpoint_bytes_naming_the_file(record, checkpoint):
    damaged_copy(checkpoint, checkpoint, record)
    with pytest.raises(CorruptCheckpointError, match=f"{checkpoint} is corrupted: .* does not match the "
                                                     "checksum torch.save wrote"):
        checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))


def test_hub_refuses_a_damaged_checkpoint(checkpoint):
    damaged_copy(checkpoint, checkpoint)
    with pytest.raises(CorruptCheckpointError, match="checkpoint_last.pt is corrupted"):
        TupeRobertaModel.from_pretrained(str(checkpoint.parent), checkpoint.name,
                                         str(checkpoint.parent.parent / "data-bin"))


def test_analysis_refuses_a_damaged_checkpoint(checkpoint):
    damaged_copy(checkpoint, checkpoint, "the smallest tensor")
    with pytest.raises(CorruptCheckpointError, match="checkpoint_last.pt is corrupted"):
        load_for_analysis(str(checkpoint), str(checkpoint.parent.parent / "data-bin"))


def test_embed_init_path_refuses_a_damaged_checkpoint(checkpoint):
    damaged_copy(checkpoint, checkpoint)
    with pytest.raises(CorruptCheckpointError, match="checkpoint_last.pt is corrupted"):
        read_checkpoint_vectors(str(checkpoint), str(checkpoint.parent.parent / "data-bin" / "dict.txt"))


def reordered(dictionary, change):
    symbols = dictionary.symbols[dictionary.nspecial:]
    if change == "two symbols swapped":
        symbols[0], symbols[5] = symbols[5], symbols[0]
    else:  # "one symbol replaced"
        symbols[3] = "another-word"
    other = Dictionary()
    for symbol in symbols:
        other.add_symbol(symbol)
    return other


@pytest.mark.parametrize("change", ["two symbols swapped", "one symbol replaced"])
def test_a_dictionary_of_the_same_size_in_another_order_is_refused(change):
    dictionary = make_dictionary()
    saved_args = build_model("tupe_r_tiny", dictionary).args
    other = reordered(dictionary, change)
    assert len(other) == len(dictionary)
    with pytest.raises(DictionaryMismatchError,
                       match=r"the data's dictionary \(45 symbols, fingerprint \w+\) "
                             r"is not the one the checkpoint was trained with.*--srcdict"):
        TupeRobertaModel.build_model(copy.copy(saved_args), _Task(other, 32))


def test_the_same_dictionary_loaded_again_is_accepted():
    saved_args = build_model("tupe_r_tiny", make_dictionary()).args
    TupeRobertaModel.build_model(copy.copy(saved_args), _Task(make_dictionary(), 32))


@pytest.mark.parametrize("change", ["two symbols swapped", "one symbol replaced"])
def test_validating_with_a_reordered_dict_txt_is_refused(change, checkpoint):
    data = checkpoint.parent.parent / "data-bin"
    reordered(Dictionary.load(str(data / "dict.txt")), change).save(str(data / "dict.txt"))
    with pytest.raises(DictionaryMismatchError, match="is not the one the checkpoint was trained with"):
        checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides={"data": str(data)})


def test_hub_with_a_reordered_dict_txt_is_refused(checkpoint):
    data = checkpoint.parent.parent / "data-bin"
    reordered(Dictionary.load(str(data / "dict.txt")), "two symbols swapped").save(str(data / "dict.txt"))
    with pytest.raises(DictionaryMismatchError, match="is not the one the checkpoint was trained with"):
        TupeRobertaModel.from_pretrained(str(checkpoint.parent), checkpoint.name, str(data))
