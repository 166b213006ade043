"""No command runs code from a checkpoint: every reader of a checkpoint or a state dict loads it with
``torch.load(weights_only=True)`` and fairseq's allowlist, and refuses a file that holds other objects in one
line naming it. The file of these tests is a real checkpoint with one more object, whose unpickling would
create a marker file."""

import json
import os
import pathlib
import pickle
import re
import shutil
import subprocess
import zipfile

import pytest
import sentencepiece as spm
import torch
from fairseq import checkpoint_utils
from conftest import REPO, VENV_BIN, test_data

from tupe_plugin.fairseq_fixes.checkpoint_compat import UnsafeCheckpointError, load
from tupe_plugin.squad import prepare as prepare_squad

SQUAD = test_data("squad", "dev-v1.1.head.json")
REFUSAL = f"holds objects a checkpoint does not hold ({os.system.__module__}.system); it was not loaded: "


class RunsShell:
    """Unpickled, it runs a shell that creates the file ``marker`` (``os.system``: a module torch blocks)."""

    def __init__(self, marker):
        self.marker = pathlib.Path(marker)

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


class WritesMarker(RunsShell):
    """Unpickled, it creates the file ``marker`` (a reducer: ``getattr`` of ``pathlib.Path.touch``)."""

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


class UnknownObject(RunsShell):
    """An object of a class torch does not know; unpickled, its ``__setstate__`` creates ``marker``."""

    def __reduce__(self):
        return object.__reduce__(self)

    def __setstate__(self, state):
        pathlib.Path(state["marker"]).touch()


# the payloads a crafted checkpoint holds, with the globals the refusal names
PAYLOADS = {
    "a blocked module": (RunsShell, [f"{os.system.__module__}.system"]),
    "an unknown global": (UnknownObject, [f"{UnknownObject.__module__}.UnknownObject"]),
    "a reducer": (WritesMarker, ["builtins.getattr", "pathlib.Path"]),
}


def crafted(folder, legacy=False, payload=RunsShell):
    """(the crafted checkpoint, the marker its unpickling would create) in ``folder``, beside its
    dict.txt."""
    state = torch.load(test_data("checkpoints", "tupe_r.pt"), weights_only=False)
    marker = folder / "MARKER"
    state["extra_state"] = dict(state.get("extra_state") or {}, note=payload(marker))
    path = folder / "crafted.pt"
    torch.save(state, path, _use_new_zipfile_serialization=not legacy)
    shutil.copy(test_data("checkpoints", "dict.txt"), folder / "dict.txt")
    return path, marker


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_the_loader_refuses_a_crafted_checkpoint_by_name_without_running_it(tmp_path, legacy, payload):
    kind, names = PAYLOADS[payload]
    path, marker = crafted(tmp_path, legacy, kind)
    with pytest.raises(pickle.UnpicklingError):  # the installed torch's own refusal, whatever its wording
        torch.load(path, weights_only=True)
    with pytest.raises(UnsafeCheckpointError) as refusal:
        load(path, "--path")
    message = str(refusal.value)
    held = re.fullmatch(rf"--path {re.escape(str(path))} holds objects a checkpoint does not hold \((.+)\); "
                        r"it was not loaded: pass a checkpoint written by fairseq-train .*", message)
    assert held and set(names) <= set(held.group(1).split(", ")), message
    assert "\n" not in message and "weights_only" not in message
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the payload does what the refusal prevents
    assert marker.exists()


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_a_damaged_pickle_is_not_called_unsafe(tmp_path, legacy):
    path, _ = crafted(tmp_path, legacy)
    data = path.read_bytes()
    start = data.index(b"system")
    path.write_bytes(data[:start] + b"\xff" * 8 + data[start + 8:])
    with pytest.raises(Exception) as error:
        load(path, "--path")
    assert not isinstance(error.value, UnsafeCheckpointError), error.value


def test_a_complete_legacy_checkpoint_holding_objects_is_not_called_truncated(tmp_path):
    path, marker = crafted(tmp_path, legacy=True)
    with pytest.raises(UnsafeCheckpointError, match=rf"^{re.escape(str(path))} {re.escape(REFUSAL)}"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert not marker.exists()


def test_the_loader_reads_a_checkpoint_of_tensors_and_fairseqs_config(tmp_path):
    state = load(test_data("checkpoints", "tupe_r.pt"))
    assert isinstance(state["model"]["encoder.sentence_encoder.embed_tokens.weight"], torch.Tensor)


def commands(data, path, tmp_path):
    """{reader: its command line on the crafted checkpoint ``path``}."""
    train = [os.path.join(VENV_BIN, "fairseq-train"), data, "--user-dir", "tupe_plugin", "--task",
             "masked_lm", "--criterion", "masked_lm", "--arch", "tupe_r_tiny", "--encoder-layers", "1",
             "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
             "--max-positions", "32", "--tokens-per-sample", "32", "--batch-size", "4", "--max-update", "1",
             "--optimizer", "adam", "--lr", "1e-3", "--save-dir", tmp_path / "save", "--cpu",
             "--num-workers", "0"]
    hf_model = tmp_path / "hf-model"
    hf_model.mkdir()
    shutil.copy(path, hf_model / "pytorch_model.bin")
    (hf_model / "config.json").write_text(json.dumps(dict(
        model_type="bert", vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, type_vocab_size=2)))
    (hf_model / "vocab.txt").write_text("".join(f"{token}\n" for token in (
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(59)))))
    tool = os.path.join(VENV_BIN, "{}").format
    return {
        "fairseq-validate --path": [tool("fairseq-validate"), data, "--user-dir", "tupe_plugin", "--task",
                                    "masked_lm", "--path", path, "--batch-size", "4", "--cpu"],
        "fairseq-train --restore-file": train + ["--restore-file", path],
        "fairseq-train --finetune-from-model": train + ["--finetune-from-model", path],
        "fairseq-train --init-from-checkpoint": train + ["--init-from-checkpoint", path],
        "fairseq-train --embed-init-path": train + ["--embed-init-path", path],
        "tupe-analyze": [tool("tupe-analyze"), "--path", path, "--data", data, "--out",
                         tmp_path / "analysis"],
        "tupe-export-hf": [tool("tupe-export-hf"), path, data, "--out", tmp_path / "export"],
        "tupe-export-embeddings": [tool("tupe-export-embeddings"), path, "--out", tmp_path / "vectors.txt"],
        "tupe-convert-official": [tool("tupe-convert-official"), "--checkpoint", path, "--dict",
                                  path.parent / "dict.txt", "--out", tmp_path / "converted"],
        "tupe-convert-hf": [tool("tupe-convert-hf"), "--hf-model", hf_model, "--out", tmp_path / "converted"],
        "tupe-finetune-glue": [tool("tupe-finetune-glue"), "RTE", path, data, "--glue-dir", test_data("glue"),
                               "--cpu", "--bin-dir", tmp_path / "rte-bin", "--save-dir", tmp_path / "rte"],
        "tupe-finetune-squad": [tool("tupe-finetune-squad"), "1.1", path, data, "--train-file", SQUAD,
                                "--valid-file", SQUAD, "--cpu", "--bin-dir", tmp_path / "squad-bin",
                                "--save-dir", tmp_path / "squad"],
        "tupe-evaluate-squad --path": [tool("tupe-evaluate-squad"), "--path", path, "--data",
                                       tmp_path / "squad-bin", "--gold-file", SQUAD, "--max-articles", "1",
                                       "--output", tmp_path / "predictions.json", "--cpu"],
    }


READERS = ["fairseq-validate --path", "fairseq-train --restore-file", "fairseq-train --finetune-from-model",
           "fairseq-train --init-from-checkpoint",
           "fairseq-train --embed-init-path", "tupe-analyze", "tupe-export-hf", "tupe-export-embeddings",
           "tupe-convert-official", "tupe-convert-hf", "tupe-finetune-glue", "tupe-finetune-squad",
           "tupe-evaluate-squad --path"]


def run_reader(reader, path, wikitext_bin, tmp_path):
    """The finished subprocess of ``reader`` (a key of :func:`commands`) on the checkpoint ``path``, with a
    data folder it can read (dict.txt, a sentencepiece model, a prepared SQuAD folder where it needs one)."""
    data = tmp_path / "data-bin"
    shutil.copytree(wikitext_bin, data)
    shutil.copy(test_data("checkpoints", "dict.txt"), data / "dict.txt")
    spm.SentencePieceTrainer.train(input=test_data("wikitext-2", "wiki.valid.head.tokens"),
                                   model_prefix=str(tmp_path / "spm"), vocab_size=100, minloglevel=2)
    shutil.copy(tmp_path / "spm.model", data / "sentencepiece.bpe.model")
    if reader == "tupe-evaluate-squad --path":  # a prepared SQuAD folder, with the pieces' dictionary
        processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
        (tmp_path / "pieces.txt").write_text("".join(f"{processor.id_to_piece(i)} 1\n"
                                                     for i in range(3, processor.get_piece_size())))
        prepare_squad.main(["--valid-file", SQUAD, "--max-articles", "1", "--sentencepiece-model",
                            str(tmp_path / "spm.model"), "--dict", str(tmp_path / "pieces.txt"),
                            "--out", str(tmp_path / "squad-bin"), "--max-seq-length", "512",
                            "--max-query-length", "200"])
    command = commands(data, path, tmp_path)[reader]
    return subprocess.run(list(map(str, command)), capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))


@pytest.mark.parametrize("reader", READERS)
def test_a_crafted_checkpoint_is_refused_in_one_line(wikitext_bin, tmp_path, reader):
    folder = tmp_path / "files"
    folder.mkdir()
    path, marker = crafted(folder)
    result = run_reader(reader, path, wikitext_bin, tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    read = "pytorch_model.bin" if reader == "tupe-convert-hf" else path.name
    assert REFUSAL in lines[-1] and f"{read} holds" in lines[-1], result.stderr[-3000:]
    assert "weights_only" not in result.stderr, result.stderr[-3000:]
    assert not marker.exists()


def rezipped(folder):
    """The committed checkpoint in ``folder`` (beside its dict.txt), its records copied into a new zip
    archive with the pickle moved under a top folder of its own: torch's reader refuses it."""
    path = folder / "rezipped.pt"
    with zipfile.ZipFile(test_data("checkpoints", "tupe_r.pt")) as source, zipfile.ZipFile(path, "w") as out:
        for name in source.namelist():
            out.writestr("aaa/data.pkl" if name.endswith("/data.pkl") else name, source.read(name))
    shutil.copy(test_data("checkpoints", "dict.txt"), folder / "dict.txt")
    return path


@pytest.mark.parametrize("reader", READERS)
def test_a_zip_whose_records_are_not_under_one_folder_is_refused_in_one_line(wikitext_bin, tmp_path, reader):
    folder = tmp_path / "files"
    folder.mkdir()
    path = rezipped(folder)
    result = run_reader(reader, path, wikitext_bin, tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    read = "pytorch_model.bin" if reader == "tupe-convert-hf" else path.name
    assert read in lines[-1] and "it is a zip archive whose records are under 2 top folders (aaa/, tupe_r/)" \
        in lines[-1], result.stderr[-3000:]
