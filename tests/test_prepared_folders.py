"""Data preparation writes its output folder atomically and reuses a finished, matching preparation:
scripts/prepare_glue.py and scripts/prepare_squad.py run twice into the same --out (the GLUE seeds loop),
with other settings, failing half-way, and into a folder they did not write."""

import json
import os

import pytest
from conftest import test_data

from tupe_plugin.cli.prepared_folder import MANIFEST
from tupe_plugin.glue import prepare as prepare_glue
from tupe_plugin.squad import prepare as prepare_squad


def glue_dir(tmp_path, rows=30):
    with open(test_data("glue", "SST-2", "train.tsv"), encoding="utf-8") as f:
        lines = [next(f) for _ in range(rows + 1)]
    (tmp_path / "glue" / "SST-2").mkdir(parents=True)
    for split in ("train", "dev"):
        (tmp_path / "glue" / "SST-2" / f"{split}.tsv").write_text("".join(lines), encoding="utf-8")
    return str(tmp_path / "glue")


@pytest.fixture
def fast_binarize(monkeypatch, fake_sentencepiece):
    """fairseq-preprocess replaced by a copy of the text (the folder logic is what is tested here)."""
    calls = []

    def binarize(folders, workers=1):
        for destdir, trainpref, validpref, _ in folders:
            calls.append(destdir)
            os.makedirs(destdir)
            for split, source in (("train", trainpref), ("valid", validpref)):
                with open(source, encoding="utf-8") as f:
                    text = f.read()
                with open(os.path.join(destdir, f"{split}.bin"), "w") as g:
                    g.write(text)
    monkeypatch.setattr(prepare_glue, "binarize", binarize)
    return calls


@pytest.fixture
def spm_files(tmp_path):
    (tmp_path / "spm.model").write_bytes(open(test_data("glue", "SST-2", "dev.tsv"), "rb").read()[:10])
    with open(test_data("glue", "SST-2", "train.tsv"), encoding="utf-8") as f:
        words = {word for _, line in zip(range(200), f) for word in line.split("\t")[0].split()}
    (tmp_path / "dict.txt").write_text("".join(f"{word} 1\n" for word in sorted(words)))  # the fake's pieces
    return str(tmp_path / "spm.model"), str(tmp_path / "dict.txt")


@pytest.fixture
def fake_sentencepiece(monkeypatch):
    """sentencepiece replaced by whitespace splitting (no model to train)."""
    import sentencepiece

    class Processor:
        def __init__(self, model_file):
            pass

        def encode(self, texts, out_type=str):
            return [text.split() for text in texts]

        def piece_to_id(self, piece):
            return 1  # every whitespace word is a piece

        def unk_id(self):
            return 0
    monkeypatch.setattr(sentencepiece, "SentencePieceProcessor", Processor)


def prepare(tmp_path, spm_files, out, **options):
    return prepare_glue.prepare("SST-2", glue_dir(tmp_path) if not (tmp_path / "glue").exists()
                                else str(tmp_path / "glue"), *spm_files, str(out), **options)


def siblings(out):
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name))


def test_glue_preparation_is_reused_when_files_and_settings_match(tmp_path, spm_files, fast_binarize):
    out = tmp_path / "SST-2-bin"
    first = prepare(tmp_path, spm_files, out, max_examples=20)
    written = (out / "input0" / "train.bin").stat().st_mtime_ns
    second = prepare(tmp_path, spm_files, out, max_examples=20)
    assert not first["reused"] and second["reused"]
    assert second["train"] == first["train"] == 20
    assert len(fast_binarize) == 2  # the second run binarized nothing
    assert (out / "input0" / "train.bin").stat().st_mtime_ns == written


def test_glue_preparation_is_redone_when_the_settings_differ(tmp_path, spm_files, fast_binarize):
    out = tmp_path / "SST-2-bin"
    prepare(tmp_path, spm_files, out, max_examples=20)
    counts = prepare(tmp_path, spm_files, out, max_examples=25)
    assert not counts["reused"] and counts["train"] == 25
    assert len((out / "raw" / "train.input0").read_text().splitlines()) == 25
    assert siblings(out) == ["SST-2-bin"]


def test_glue_preparation_is_redone_when_an_input_file_changes(tmp_path, spm_files, fast_binarize):
    out = tmp_path / "SST-2-bin"
    prepare(tmp_path, spm_files, out, max_examples=20)
    with open(spm_files[1], "a") as f:
        f.write("b 1\n")
    assert not prepare(tmp_path, spm_files, out, max_examples=20)["reused"]


def test_a_rebuild_says_what_changed_in_one_line(tmp_path, spm_files, fast_binarize, capsys):
    out = tmp_path / "SST-2-bin"
    prepare(tmp_path, spm_files, out, max_examples=20)
    prepare(tmp_path, spm_files, out, max_examples=20)
    assert capsys.readouterr().err == ""  # reused: nothing to say here
    prepare(tmp_path, spm_files, out, max_examples=25)
    with open(spm_files[1], "a") as f:
        f.write("b 1\n")
    prepare(tmp_path, spm_files, out)
    assert capsys.readouterr().err.splitlines() == [
        f"tupe-prepare-glue: --out {out} holds a preparation of other inputs or settings "
        "(--max-examples 20 -> 25): rebuilding it",
        f"tupe-prepare-glue: --out {out} holds a preparation of other inputs or settings "
        "(--max-examples 25 -> unset; --dict file changed): rebuilding it"]


def test_glue_preparation_failing_half_way_leaves_no_output_folder(tmp_path, spm_files, fast_binarize,
                                                                  monkeypatch):
    out = tmp_path / "SST-2-bin"
    real = prepare_glue.binarize

    def fail_on_labels(folders, workers=1):
        real([folder for folder in folders if not folder[0].endswith("label")], workers)
        raise RuntimeError("fairseq-preprocess for label failed")
    monkeypatch.setattr(prepare_glue, "binarize", fail_on_labels)
    with pytest.raises(RuntimeError, match="label failed"):
        prepare(tmp_path, spm_files, out)
    assert siblings(out) == []


def test_glue_preparation_failing_keeps_the_previous_complete_preparation(tmp_path, spm_files,
                                                                         fast_binarize, monkeypatch):
    out = tmp_path / "SST-2-bin"
    prepare(tmp_path, spm_files, out, max_examples=20)
    monkeypatch.setattr(prepare_glue, "binarize", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(RuntimeError):
        prepare(tmp_path, spm_files, out, max_examples=25)
    assert siblings(out) == ["SST-2-bin"]
    assert len((out / "raw" / "train.input0").read_text().splitlines()) == 20
    assert json.loads((out / MANIFEST).read_text())["summary"]["train"] == 20


class Refused(Exception):
    pass


def refuse(folder):
    """An ``accept`` that refuses every preparation (fine-tuning's check of a resume on other data)."""
    raise Refused(folder)


def test_a_preparation_its_caller_refuses_leaves_the_previous_one_as_it_was(tmp_path, spm_files,
                                                                           fast_binarize):
    out = tmp_path / "SST-2-bin"
    prepare(tmp_path, spm_files, out, max_examples=20)
    before = {path: path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}
    with pytest.raises(Refused) as refused:
        prepare(tmp_path, spm_files, out, max_examples=25, accept=refuse)
    assert refused.value.args[0] != str(out)  # it saw the preparation built aside, complete
    assert {path: path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()} == before
    assert siblings(out) == ["SST-2-bin"]


def test_a_preparation_its_caller_refuses_leaves_no_output_folder(tmp_path, spm_files, fast_binarize):
    out = tmp_path / "SST-2-bin"
    seen = []

    def refuse_after_looking(folder):
        seen.append(sorted(os.listdir(folder)))
        refuse(folder)
    with pytest.raises(Refused):
        prepare(tmp_path, spm_files, out, accept=refuse_after_looking)
    assert seen == [[MANIFEST, "input0", "label", "raw"]] and siblings(out) == []


def test_a_reused_preparation_is_shown_to_its_caller_as_it_is(tmp_path, spm_files, fast_binarize):
    out = tmp_path / "SST-2-bin"
    prepare(tmp_path, spm_files, out)
    seen = []
    assert prepare(tmp_path, spm_files, out, accept=seen.append)["reused"]
    assert seen == [str(out)]


@pytest.mark.parametrize("existing", ["user file", "half-written by an older version", "a file"])
def test_glue_preparation_never_writes_into_a_folder_it_did_not_write(tmp_path, spm_files, fast_binarize,
                                                                     existing, capsys):
    out = tmp_path / "SST-2-bin"
    if existing == "a file":
        out.write_text("mine")
        kept = out
    else:
        (out / "label").mkdir(parents=True)
        kept = out / ("notes.txt" if existing == "user file" else "label/dict.txt")
        kept.write_text("mine")
    glue_dir(tmp_path)
    with pytest.raises(SystemExit, match=r"^tupe-prepare-glue: error: --out .*SST-2-bin exists and was not "
                                         r"written by tupe-prepare-glue .*choose another --out"):
        prepare_glue.main(["--task", "SST-2", "--glue-dir", str(tmp_path / "glue"), "--sentencepiece-model",
                           spm_files[0], "--dict", spm_files[1], "--out", str(out)])
    assert kept.read_text() == "mine" and fast_binarize == []


def test_glue_preparation_into_an_empty_existing_folder(tmp_path, spm_files, fast_binarize):
    out = tmp_path / "SST-2-bin"
    out.mkdir()
    assert prepare(tmp_path, spm_files, out)["train"] == 30


def test_command_line_says_the_preparation_was_reused(tmp_path, spm_files, fast_binarize, capsys):
    argv = ["--task", "SST-2", "--glue-dir", glue_dir(tmp_path), "--sentencepiece-model", spm_files[0],
            "--dict", spm_files[1], "--out", str(tmp_path / "out")]
    prepare_glue.main(argv)
    prepare_glue.main(argv)
    output = capsys.readouterr().out
    assert output.count("reused") == 1 and "train 30, valid 30" in output.splitlines()[-1]


def squad_file(tmp_path, articles=1):
    with open(test_data("squad", "dev-v1.1.head.json"), encoding="utf-8") as f:
        data = json.load(f)["data"][:articles]
    data[0]["paragraphs"] = data[0]["paragraphs"][:2]
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def squad_vocabulary(tmp_path_factory):
    import sentencepiece as spm

    root = tmp_path_factory.mktemp("squad_vocabulary")
    with open(test_data("squad", "dev-v1.1.head.json"), encoding="utf-8") as f:
        contexts = [p["context"] for p in json.load(f)["data"][0]["paragraphs"][:20]]
    (root / "contexts.txt").write_text("\n".join(contexts), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(root / "contexts.txt"), model_prefix=str(root / "spm"),
                                   vocab_size=200, minloglevel=2)
    processor = spm.SentencePieceProcessor(model_file=str(root / "spm.model"))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
              if not (processor.is_control(i) or processor.is_unknown(i))]
    (root / "dict.txt").write_text("".join(f"{piece} 1\n" for piece in pieces))
    return str(root / "spm.model"), str(root / "dict.txt")


def test_squad_preparation_is_reused_then_redone_for_other_settings(tmp_path, squad_vocabulary):
    out = tmp_path / "squad-bin"
    files = {"valid": squad_file(tmp_path)}
    short, longer = dict(max_seq_length=64, max_query_length=32), dict(max_seq_length=96, max_query_length=32)
    first, reused_first = prepare_squad.prepare(files, *squad_vocabulary, str(out), **short)
    second, reused_second = prepare_squad.prepare(files, *squad_vocabulary, str(out), **short)
    third, reused_third = prepare_squad.prepare(files, *squad_vocabulary, str(out), **longer)
    assert (reused_first, reused_second, reused_third) == (False, True, False)
    assert second == first and third["valid"]["features"] < first["valid"]["features"]
    assert siblings(out) == ["squad-bin"]


def test_squad_preparation_failing_half_way_leaves_no_output_folder(tmp_path, squad_vocabulary,
                                                                   monkeypatch):
    out = tmp_path / "squad-bin"
    monkeypatch.setattr(prepare_squad, "write_split", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        prepare_squad.prepare({"valid": squad_file(tmp_path)}, *squad_vocabulary, str(out))
    assert siblings(out) == []


def test_squad_preparation_never_writes_into_a_folder_it_did_not_write(tmp_path, squad_vocabulary):
    out = tmp_path / "squad-bin"
    out.mkdir()
    (out / "dict.txt").write_text("mine")
    with pytest.raises(SystemExit,
                       match="--out .*squad-bin exists and was not written by tupe-prepare-squad"):
        prepare_squad.main(["--valid-file", squad_file(tmp_path), "--sentencepiece-model",
                            squad_vocabulary[0], "--dict", squad_vocabulary[1], "--out", str(out)])
    assert (out / "dict.txt").read_text() == "mine"
