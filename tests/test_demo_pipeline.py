"""The demo's data commands: tupe-build-corpus and tupe-train-spm."""

import re

import pytest
import sentencepiece as spm

from tupe_plugin.corpus import build as build_corpus
from tupe_plugin.corpus import train_spm

from conftest import test_data

ANIMALS = ["cat", "dog", "bird", "horse", "fox", "owl", "bear", "wolf"]
PLACES = ["garden", "forest", "river", "house", "field", "hill"]


def documents_text(count):
    """``count`` short documents separated by blank lines, each two lines long."""
    documents = []
    for i in range(count):
        animal, place = ANIMALS[i % len(ANIMALS)], PLACES[i % len(PLACES)]
        documents.append(
            f"The {animal} number {i} walks to the {place}.\n"
            f"It sleeps there until the {ANIMALS[(i + 3) % len(ANIMALS)]} comes back."
        )
    return "\n\n".join(documents) + "\n"


def read_documents(path):
    """Documents of a written split, as tuples of lines."""
    text = path.read_text(encoding="utf-8").strip()
    return [tuple(block.splitlines()) for block in text.split("\n\n")] if text else []


def build(tmp_path, text, *flags, name="corpus"):
    source = tmp_path / "input.txt"
    source.write_text(text, encoding="utf-8")
    output = tmp_path / name
    build_corpus.main(["--corpus", str(source), "--output-dir", str(output), *flags])
    return output


@pytest.fixture
def spm_corpus(tmp_path):
    return build(tmp_path, documents_text(60), "--valid-fraction", "0.1", "--test-fraction", "0.1")


def test_every_document_lands_in_exactly_one_split(tmp_path):
    corpus = build(tmp_path, documents_text(50))
    written = [doc for split in build_corpus.SPLITS for doc in read_documents(corpus / f"{split}.txt")]
    expected = [tuple(block.splitlines()) for block in documents_text(50).strip().split("\n\n")]
    assert sorted(written) == sorted(expected)


def test_valid_and_test_get_the_requested_share(tmp_path):
    corpus = build(tmp_path, documents_text(100), "--valid-fraction", "0.1", "--test-fraction", "0.05")
    assert len(read_documents(corpus / "valid.txt")) == 10
    assert len(read_documents(corpus / "test.txt")) == 5
    assert len(read_documents(corpus / "train.txt")) == 85


def test_small_corpus_still_fills_valid_and_test(tmp_path):
    corpus = build(tmp_path, documents_text(3))
    for split in build_corpus.SPLITS:
        assert len(read_documents(corpus / f"{split}.txt")) == 1


def test_split_is_deterministic(tmp_path):
    first = build(tmp_path, documents_text(50), name="first")
    second = build(tmp_path, documents_text(50), name="second")
    for split in build_corpus.SPLITS:
        assert (first / f"{split}.txt").read_bytes() == (second / f"{split}.txt").read_bytes()


def test_seed_changes_the_split(tmp_path):
    first = build(tmp_path, documents_text(50), "--seed", "1", name="first")
    second = build(tmp_path, documents_text(50), "--seed", "2", name="second")
    assert read_documents(first / "valid.txt") != read_documents(second / "valid.txt")


def test_file_without_blank_lines_has_one_document_per_line(tmp_path):
    lines = [f"Line {i} of a file with no blank lines." for i in range(20)]
    corpus = build(tmp_path, "\n".join(lines) + "\n")
    written = [doc for split in build_corpus.SPLITS for doc in read_documents(corpus / f"{split}.txt")]
    assert sorted(written) == sorted((line,) for line in lines)


def test_whitespace_is_normalised(tmp_path):
    corpus = build(tmp_path, "  Tabs\tand   spaces  \n\none\n\ntwo\n")
    written = {doc for split in build_corpus.SPLITS for doc in read_documents(corpus / f"{split}.txt")}
    assert ("Tabs and spaces",) in written


def test_long_paragraph_is_cut_at_sentence_ends():
    paragraph = "One two three four. Five six seven. Eight nine ten eleven twelve."
    assert build_corpus.wrap(paragraph, max_words=7) == [
        "One two three four. Five six seven.",
        "Eight nine ten eleven twelve.",
    ]


def test_sentence_longer_than_max_words_is_cut_between_words():
    assert build_corpus.wrap("a b c d e f g", max_words=3) == ["a b c", "d e f", "g"]


def test_doctests_and_code_are_not_prose():
    assert not build_corpus.is_prose(">>> print(1)")
    assert not build_corpus.is_prose("Example: >>> x = f(1, 2)")
    assert not build_corpus.is_prose("{'a': 1, 'b': [2, 3], 'c': (4, 5)}")
    assert build_corpus.is_prose("Return the number of items in the container.")


def test_docstrings_of_module_class_and_function_are_collected(tmp_path):
    source = tmp_path / "module.py"
    source.write_text(
        '"""Module doc."""\n'
        "class A:\n"
        '    """Class doc."""\n'
        "    def f(self):\n"
        '        """Method doc."""\n'
        "def g():\n"
        "    pass\n",
        encoding="utf-8",
    )
    assert build_corpus.docstrings(source) == ["Module doc.", "Class doc.", "Method doc."]


def test_stdlib_skip_list_leaves_out_tests_and_idle():
    files = build_corpus.stdlib_files(build_corpus.sysconfig.get_paths()["stdlib"])
    parts = {part for path in files for part in path.parts}
    assert files and not parts & {"test", "idlelib", "site-packages"}


def test_stdlib_corpus_is_short_unique_prose_lines():
    documents = build_corpus.stdlib_documents(max_words=48)
    lines = [line for document in documents for line in document]
    assert len(documents) > 1000
    assert len(lines) == len(set(lines))
    assert max(len(line.split()) for line in lines) <= 48
    assert not any(">>>" in line for line in lines)


def test_missing_corpus_file_error_names_the_file(tmp_path, capsys):
    missing = tmp_path / "nowhere.txt"
    with pytest.raises(SystemExit):
        build_corpus.main(["--corpus", str(missing), "--output-dir", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert "--corpus" in error and str(missing) in error


def test_empty_corpus_file_error_names_the_file(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(SystemExit):
        build_corpus.main(["--corpus", str(empty), "--output-dir", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert str(empty) in error and "no text" in error
    assert not (tmp_path / "out").exists()


def test_corpus_too_small_to_split_is_an_error(tmp_path, capsys):
    source = tmp_path / "two.txt"
    source.write_text("first line\nsecond line\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        build_corpus.main(["--corpus", str(source), "--output-dir", str(tmp_path / "out")])
    assert "need at least 3" in capsys.readouterr().err


def test_a_vocab_size_below_the_corpus_characters_is_one_line_naming_the_size_it_needs(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    with open(test_data("wikitext-2", "wiki.valid.head.tokens"), encoding="utf-8") as f:
        (corpus / "train.txt").write_text("".join(f.readlines()[:50]), encoding="utf-8")
    with pytest.raises(train_spm.VocabularyTooSmallError) as error:
        train_small_spm(corpus, tmp_path / "spm", "--vocab-size", "20")
    assert re.fullmatch(rf"--vocab-size 20 is smaller than the (\d+) pieces sentencepiece needs for "
                        rf"{re.escape(str(corpus / 'train.txt'))}: each of its characters and the special "
                        r"pieces \(character coverage 1.0\): give --vocab-size \1 or more", str(error.value))


def train_small_spm(corpus, output, *flags):
    train_spm.main(
        ["--corpus-dir", str(corpus), "--output-dir", str(output), "--vocab-size", "60", *flags]
    )
    return output


def test_spm_pieces_decode_back_to_the_text(spm_corpus, tmp_path):
    output = train_small_spm(spm_corpus, tmp_path / "spm")
    processor = spm.SentencePieceProcessor(model_file=str(output / "spm.model"))
    for split in train_spm.SPLITS:
        text_lines = (spm_corpus / f"{split}.txt").read_text(encoding="utf-8").splitlines()
        piece_lines = (output / f"{split}.bpe").read_text(encoding="utf-8").splitlines()
        decoded = [processor.decode_pieces(line.split()) for line in piece_lines]
        assert decoded == text_lines


def test_spm_says_how_many_lines_it_split_at_max_pieces_and_why(spm_corpus, tmp_path, capsys):
    train_small_spm(spm_corpus, tmp_path / "spm", "--max-pieces", "3")
    lines = (spm_corpus / "train.txt").read_text(encoding="utf-8").splitlines()
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm" / "spm.model"))
    longer = sum(len(pieces) > 3 for pieces in processor.encode(lines, out_type=str))
    said = next(line for line in capsys.readouterr().err.splitlines()
                if line.startswith(f"train_spm: {tmp_path / 'spm' / 'train.bpe'}: "))
    assert longer > 1 and said.endswith(
        f" pieces; {longer} lines longer than --max-pieces 3 split into lines of at most 3 pieces (a block "
        "of --tokens-per-sample 5 holds a whole line with <s> and </s>)")


def test_spm_says_in_one_line_when_it_trains_fewer_pieces_than_asked(spm_corpus, tmp_path, capsys):
    train_small_spm(spm_corpus, tmp_path / "spm", "--vocab-size", "5000")
    got = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm" / "spm.model")).get_piece_size()
    notices = [line for line in capsys.readouterr().err.splitlines() if "--vocab-size" in line]
    assert notices == [f"train_spm: {tmp_path / 'spm' / 'spm.model'} has {got} pieces, not the 5000 of "
                       f"--vocab-size: sentencepiece finds no more in {spm_corpus / 'train.txt'} (0.00 MB) "
                       "and takes --vocab-size as an upper bound; more text gives more pieces"]
    train_small_spm(spm_corpus, tmp_path / "spm")  # 60 pieces, as asked
    assert "--vocab-size" not in capsys.readouterr().err


def test_spm_dictionary_holds_every_piece_and_every_token_of_train(spm_corpus, tmp_path):
    """fairseq-preprocess --srcdict spm/dict.txt: no piece of the model becomes <unk> in fine-tuning text."""
    output = train_small_spm(spm_corpus, tmp_path / "spm")
    processor = spm.SentencePieceProcessor(model_file=str(output / "spm.model"))
    entries = [line.split(" ") for line in (output / "dict.txt").read_text(encoding="utf-8").splitlines()]
    tokens = [token for token, _ in entries]
    pieces = {processor.id_to_piece(i) for i in range(processor.get_piece_size())
              if not (processor.is_control(i) or processor.is_unknown(i))}
    assert pieces <= set(tokens) and "<unk>" not in tokens and len(tokens) == len(set(tokens))
    assert set((output / "train.bpe").read_text(encoding="utf-8").split()) <= set(tokens)
    counts = [int(count) for _, count in entries]
    assert counts == sorted(counts, reverse=True) and 0 in counts  # pieces train.bpe never uses alone


def test_spm_keeps_blank_lines_between_documents(spm_corpus, tmp_path):
    output = train_small_spm(spm_corpus, tmp_path / "spm")
    text_lines = (spm_corpus / "train.txt").read_text(encoding="utf-8").splitlines()
    piece_lines = (output / "train.bpe").read_text(encoding="utf-8").splitlines()
    assert [i for i, line in enumerate(piece_lines) if not line] == [
        i for i, line in enumerate(text_lines) if not line
    ]


def test_spm_training_is_deterministic(spm_corpus, tmp_path):
    first = train_small_spm(spm_corpus, tmp_path / "first")
    second = train_small_spm(spm_corpus, tmp_path / "second")
    assert (first / "spm.vocab").read_bytes() == (second / "spm.vocab").read_bytes()
    assert (first / "train.bpe").read_bytes() == (second / "train.bpe").read_bytes()


def test_spm_cuts_lines_longer_than_max_pieces(spm_corpus, tmp_path):
    output = train_small_spm(spm_corpus, tmp_path / "spm", "--max-pieces", "5")
    lines = (output / "train.bpe").read_text(encoding="utf-8").splitlines()
    assert max(len(line.split()) for line in lines) == 5


def test_spm_missing_train_file_error_names_it(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train_spm.main(["--corpus-dir", str(tmp_path), "--output-dir", str(tmp_path / "spm")])
    error = capsys.readouterr().err
    assert "--corpus-dir" in error and str(tmp_path / "train.txt") in error
