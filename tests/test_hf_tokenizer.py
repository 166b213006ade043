"""The export's tokenizer.json (tupe_plugin.conversion.hf_tokenizer) against fairseq's own encoding of the
same text (sentencepiece's pieces looked up in the Dictionary, as the hub encodes), for the sentencepiece
models where tokenizers and sentencepiece can differ: byte fallback, normalisation rules, pieces missing
from dict.txt, BPE; a tokenizer that cannot give fairseq's ids is not built."""

import re
import sys

import pytest
import sentencepiece as spm
from conftest import test_data
from fairseq.data import Dictionary
from fairseq.data.encoders.sentencepiece_bpe import SentencepieceBPE, SentencepieceConfig

from tupe_plugin.conversion import hf_tokenizer

TEXTS = [
    "The game began development in 2010 .",
    "Café déjà vu: naïve façades — über 56 % 😀 in 2011!",
    "ℵ₀ ⊂ 𝔘 «тест» 漢字 한국어",
    "  runs   of spaces\tand\t\ttabs  ",
    "ﬁne ｆｕｌｌ-width １２３",
    "",
]


def lines():
    with open(test_data("wikitext-2", "wiki.valid.head.tokens"), encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and "<unk>" not in line][:300]


def sentencepiece_model(folder, **options):
    (folder / "raw.txt").write_text("\n".join(lines()) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(folder / "raw.txt"), model_prefix=str(folder / "spm"),
                                   minloglevel=2, **{"vocab_size": 250, **options})
    return str(folder / "spm.model")


def dictionary(folder, model, drop=()):
    """dict.txt of ``model``'s pieces, as fairseq-preprocess orders them, without ``drop``; its symbols
    with <mask>."""
    processor = spm.SentencePieceProcessor(model_file=model)
    built = Dictionary()
    for i in range(processor.get_piece_size()):
        if not (processor.is_control(i) or processor.is_unknown(i)) and processor.id_to_piece(i) not in drop:
            built.add_symbol(processor.id_to_piece(i), n=1 + i % 5)
    built.finalize(padding_factor=8)
    built.save(str(folder / "dict.txt"))
    built.add_symbol("<mask>")
    return list(built.symbols)


def fairseq_encode(folder, model, text):
    """fairseq's ids of ``text``: its sentencepiece BPE and Dictionary, framed as the hub frames them."""
    words = SentencepieceBPE(SentencepieceConfig(sentencepiece_model=model)).encode(text)
    return [0, *Dictionary.load(str(folder / "dict.txt")).encode_line(words, add_if_not_exist=False).tolist()]


NORMALISATIONS = {"nmt_nfkc": {}, "nmt_nfkc_cf": {"normalization_rule_name": "nmt_nfkc_cf"},
                  "no dummy prefix": {"add_dummy_prefix": False},
                  "identity": {"normalization_rule_name": "identity"},
                  "nfkc": {"normalization_rule_name": "nfkc"}}


@pytest.mark.parametrize("options", NORMALISATIONS.values(), ids=NORMALISATIONS)
def test_the_tokenizer_gives_fairseqs_ids_under_each_normalisation(tmp_path, options):
    model = sentencepiece_model(tmp_path, **options)
    vocabulary = dictionary(tmp_path, model)
    tokenizer, reason = hf_tokenizer.fast_tokenizer(model, vocabulary)
    assert reason is None
    for text in TEXTS + lines()[:100]:
        assert tokenizer.encode(text).ids == fairseq_encode(tmp_path, model, text), text


WHITESPACE_CASES = dict(NORMALISATIONS, **{"byte fallback": {"byte_fallback": True, "vocab_size": 400}})


@pytest.mark.parametrize("options", WHITESPACE_CASES.values(), ids=WHITESPACE_CASES)
def test_every_character_python_reads_as_whitespace_is_encoded_as_fairseq_encodes_it(tmp_path, options):
    """fairseq's Dictionary splits the pieces at str.isspace characters, which a normalisation may keep
    (NEL, U+0085, under nmt_nfkc; tabs and new lines under identity), and drops them: inside a word,
    doubled, alone, at either end, beside a character the model does not hold; with byte fallback they are
    byte pieces, which it keeps."""
    model = sentencepiece_model(tmp_path, **options)
    tokenizer, reason = hf_tokenizer.fast_tokenizer(model, dictionary(tmp_path, model))
    assert reason is None
    spaces = [chr(code) for code in range(sys.maxunicode + 1) if chr(code).isspace()]
    assert "\x85" in spaces and "\x1c" in spaces  # str.isspace's, beyond Unicode's White_Space
    for space in spaces:
        for text in (f"a{space}b", f"the{space}{space}game", space, f"{space}x ", f"漢{space}字",
                     f"é{space}"):
            assert tokenizer.encode(text).ids == fairseq_encode(tmp_path, model, text), (hex(ord(space)),
                                                                                        text)


def test_a_normalisation_that_keeps_runs_of_spaces_keeps_the_custom_tokenizer(tmp_path):
    """Without sentencepiece's removal of extra whitespace, tokenizers reads "\r\n" as one character where
    sentencepiece reads two (two "▁" pieces, which fairseq keeps)."""
    model = sentencepiece_model(tmp_path, remove_extra_whitespaces=False)
    vocabulary = dictionary(tmp_path, model)
    text = "tabs\tand\nnew lines\r\n"
    assert hf_tokenizer.fast_tokenizer(model, vocabulary) == (
        None, f"tokenizers encodes {text!r} otherwise than sentencepiece")
    built = hf_tokenizer.build(hf_tokenizer.read_sentencepiece(model), vocabulary)
    assert built.encode(text).ids != fairseq_encode(tmp_path, model, text)


def test_byte_fallback_gives_fairseqs_byte_pieces(tmp_path):
    model = sentencepiece_model(tmp_path, byte_fallback=True, vocab_size=400)
    vocabulary = dictionary(tmp_path, model)
    tokenizer, reason = hf_tokenizer.fast_tokenizer(model, vocabulary)
    assert reason is None
    ids = tokenizer.encode(TEXTS[2]).ids
    assert ids == fairseq_encode(tmp_path, model, TEXTS[2]) and vocabulary.index("<0xE6>") in ids  # 漢


def test_byte_fallback_without_the_byte_pieces_in_the_dictionary_keeps_the_custom_tokenizer(tmp_path):
    model = sentencepiece_model(tmp_path, byte_fallback=True, vocab_size=400)
    vocabulary = dictionary(tmp_path, model, drop={f"<0x{i:02X}>" for i in range(128, 256)})
    assert hf_tokenizer.fast_tokenizer(model, vocabulary) == (
        None, "128 pieces of its sentencepiece model are not in dict.txt (e.g. '<0x80>'); fairseq encodes "
              "them as <unk>, which a tokenizer.json cannot")


def test_a_piece_missing_from_the_dictionary_keeps_the_custom_tokenizer(tmp_path):
    model = sentencepiece_model(tmp_path)
    vocabulary = dictionary(tmp_path, model, drop={"▁the"})
    tokenizer, reason = hf_tokenizer.fast_tokenizer(model, vocabulary)
    assert tokenizer is None and reason.startswith("1 pieces of its sentencepiece model are not in dict.txt "
                                                   "(e.g. '▁the')")


def test_a_bpe_model_keeps_the_custom_tokenizer(tmp_path):
    model = sentencepiece_model(tmp_path, model_type="bpe")
    tokenizer, reason = hf_tokenizer.fast_tokenizer(model, dictionary(tmp_path, model))
    assert tokenizer is None and reason.startswith("its sentencepiece model is not a unigram model")


def test_a_tokenizer_that_encodes_a_probe_otherwise_is_not_built(tmp_path, monkeypatch):
    model = sentencepiece_model(tmp_path)
    build = hf_tokenizer.build

    def without_normaliser(*args):
        tokenizer = build(*args)
        tokenizer.normalizer = None
        return tokenizer

    monkeypatch.setattr(hf_tokenizer, "build", without_normaliser)
    tokenizer, reason = hf_tokenizer.fast_tokenizer(model, dictionary(tmp_path, model))
    assert tokenizer is None and re.fullmatch(r"tokenizers encodes '.*' otherwise than sentencepiece", reason)


def test_the_model_file_is_read_as_sentencepiece_reads_it(tmp_path):
    model = sentencepiece_model(tmp_path, byte_fallback=True, vocab_size=400,
                                normalization_rule_name="identity", add_dummy_prefix=False)
    processor = spm.SentencePieceProcessor(model_file=model)
    read = hf_tokenizer.read_sentencepiece(model)
    assert [piece for piece, _, _ in read.pieces] == [processor.id_to_piece(i)
                                                      for i in range(processor.get_piece_size())]
    assert [score for _, score, _ in read.pieces] == pytest.approx(
        [processor.get_score(i) for i in range(processor.get_piece_size())])
    assert [kind == hf_tokenizer.BYTE for _, _, kind in read.pieces] == [
        processor.is_byte(i) for i in range(processor.get_piece_size())]
    assert read.byte_fallback and not read.add_dummy_prefix and read.model_type == hf_tokenizer.UNIGRAM


def test_user_defined_symbols_keep_the_custom_tokenizer(tmp_path):
    model = sentencepiece_model(tmp_path, user_defined_symbols=["<url>"])
    assert hf_tokenizer.fast_tokenizer(model, dictionary(tmp_path, model)) == (
        None, "its sentencepiece model has user-defined symbols")
