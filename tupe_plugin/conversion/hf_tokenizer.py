"""The export's standard fast tokenizer: a ``tokenizer.json`` of Hugging Face ``tokenizers`` that gives the
plugin's ids, or the reason it cannot.

fairseq encodes text for a sentencepiece model (Kudo & Richardson, SentencePiece, arXiv 1808.06226; the
unigram model of Kudo, Subword Regularization, arXiv 1804.10959) as: the model's normalisation, its pieces,
each looked up in ``dict.txt`` (a piece that is not there is ``<unk>``), framed as ``<s> A </s>`` or
``<s> A </s></s> B </s>``. The tokenizer.json holds the same steps: sentencepiece's precompiled character
map, its whitespace rules (runs of spaces made one, none at either end, ``▁`` for a space and one in
front), fairseq's split of the pieces at the characters Python reads as whitespace (dropped: the
normalisation may keep some, NEL under nmt_nfkc, tabs under identity), a unigram model whose ids are
fairseq's dictionary order and whose scores are sentencepiece's (a symbol sentencepiece does not hold
never wins), and that framing. As in every Hugging Face tokenizer,
the special tokens ``<s> <pad> </s> <unk> <mask>`` written in a text are read as those tokens (fairseq
spells them out in pieces; its ``fill_mask`` reads ``<mask>`` too). Each step keeps the offsets into the
original text.

It cannot be exact for every model: a piece of the sentencepiece model missing from dict.txt (fairseq
gives it ``<unk>``; tokenizers' ids are its vocabulary's places), a BPE or word model, user-defined
symbols, byte fallback whose byte pieces are not all in dict.txt, whitespace kept as a suffix or not
escaped. :func:`fast_tokenizer` names the reason; the export then keeps the custom sentencepiece tokenizer.
Last, the built tokenizer is compared with fairseq's encoding on :data:`PROBES` and on the dictionary's
symbols that sentencepiece does not hold (fairseq's ``madeupword`` padding); a difference is a reason.
"""

import struct
import sys
from typing import NamedTuple

# fairseq's framing of one sentence and of a pair (RobertaHubInterface.encode, sentence_prediction)
SINGLE = "<s> $A </s>"
PAIR = "<s> $A </s> </s> $B </s>"
SPECIAL = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
# the score of a dictionary symbol sentencepiece does not hold: never the best segmentation
FOREIGN_SCORE = -1e9
NORMAL, USER_DEFINED, BYTE = 1, 4, 6
# The characters at which fairseq's Dictionary splits the pieces (its tokenize_line: regex \s, then
# str.split(), both Python's str.isspace): a normaliser may leave them in the text (NEL, U+0085, under
# nmt_nfkc), and fairseq drops them, where sentencepiece made them a piece (<unk>) or part of one
WHITESPACE = "".join(chr(code) for code in range(sys.maxunicode + 1) if chr(code).isspace())
UNIGRAM = 1
# texts whose encodings the built tokenizer must reproduce before it is written
PROBES = (
    "The game began development in 2010 .",
    "Café déjà vu: 1,234 naïve façades — über 56 % 😀 in 2011!",
    "ℵ₀ ⊂ 𝔘 «тест» 漢字 한국어 العربية",
    "  leading, trailing and   inner   runs of spaces  ",
    "tabs\tand\nnew lines\r\n",
    "ﬁne ｆｕｌｌ-width １２３ and e\u0301 combining",
    "▁ a literal ▁, madeupword0000 and <un k>",
    "",
    "   ",
    "a" + "a".join(WHITESPACE) + "a",  # every character at which fairseq splits, between letters
)


class SentencepieceModel(NamedTuple):
    """What a ``.model`` file holds that the tokenizer.json needs."""

    pieces: list  # (piece, score, type)
    model_type: int
    byte_fallback: bool
    treat_whitespace_as_suffix: bool
    charsmap: bytes
    add_dummy_prefix: bool
    remove_extra_whitespaces: bool
    escape_whitespaces: bool


def _varint(data, i):
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _fields(data):
    """(field number, value) of a protocol buffer message: ints for varints, bytes otherwise."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        wire = key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i:i + size], i + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = data[i:i + size], i + size
        else:
            raise ValueError(f"protocol buffer wire type {wire}")
        yield key >> 3, value


def read_sentencepiece(path):
    """The :class:`SentencepieceModel` of the sentencepiece ``.model`` file ``path`` (its ModelProto)."""
    with open(path, "rb") as f:
        data = f.read()
    pieces, trainer, normalizer = [], {}, {}
    for number, value in _fields(data):
        if number == 1:
            piece = dict(_fields(value))
            pieces.append((piece.get(1, b"").decode("utf-8"),
                           struct.unpack("<f", piece[2])[0] if 2 in piece else 0.0, piece.get(3, NORMAL)))
        elif number == 2:
            trainer = dict(_fields(value))
        elif number == 3:
            normalizer = dict(_fields(value))
    return SentencepieceModel(
        pieces=pieces, model_type=trainer.get(3, UNIGRAM), byte_fallback=bool(trainer.get(35, 0)),
        treat_whitespace_as_suffix=bool(trainer.get(24, 0)), charsmap=normalizer.get(2, b""),
        add_dummy_prefix=bool(normalizer.get(3, 1)), remove_extra_whitespaces=bool(normalizer.get(4, 1)),
        escape_whitespaces=bool(normalizer.get(5, 1)))


def unsupported(model, vocabulary):
    """Why tokenizers cannot give fairseq's ids for ``model`` and the dictionary ``vocabulary`` (fairseq's
    symbols in id order), or None."""
    if model.model_type != UNIGRAM:
        return "its sentencepiece model is not a unigram model (tokenizers segments BPE and word models " \
               "otherwise)"
    if any(kind == USER_DEFINED for _, _, kind in model.pieces):
        return "its sentencepiece model has user-defined symbols"
    if model.treat_whitespace_as_suffix or not model.escape_whitespaces:
        return "its sentencepiece model keeps whitespace as a suffix or unescaped"
    held = set(vocabulary)
    needed = (NORMAL, BYTE) if model.byte_fallback else (NORMAL,)
    missing = [piece for piece, _, kind in model.pieces if kind in needed and piece not in held]
    if missing:
        return (f"{len(missing)} pieces of its sentencepiece model are not in dict.txt (e.g. "
                f"{missing[0]!r}); fairseq encodes them as <unk>, which a tokenizer.json cannot")
    return None


def build(model, vocabulary):
    """The ``tokenizers.Tokenizer`` of ``model`` with fairseq's ids for ``vocabulary``."""
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            processors)

    scores = {piece: score for piece, score, kind in model.pieces if kind in (NORMAL, BYTE)}
    pieces = [(symbol, scores.get(symbol, FOREIGN_SCORE)) for symbol in vocabulary]
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=vocabulary.index("<unk>"),
                                         byte_fallback=model.byte_fallback))
    steps = [normalizers.Precompiled(model.charsmap)] if model.charsmap else []
    if model.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex(r"\A | \z"), "")]
    steps.append(normalizers.Replace(" ", "▁"))
    if model.add_dummy_prefix:
        steps.append(normalizers.Prepend("▁"))
    tokenizer.normalizer = normalizers.Sequence(steps)
    if not model.byte_fallback:
        # fairseq's split of the pieces at whitespace, before the segmentation: a character the model does
        # not hold is a piece of its own (with the unknown characters next to it), so no piece spans it, and
        # the text on each side is segmented as sentencepiece segments it. With byte fallback that character
        # is byte pieces, which fairseq keeps, as tokenizers' byte fallback makes them.
        separators = "".join(f"\\x{{{ord(character):x}}}" for character in WHITESPACE)
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(f"[{separators}]+"), behavior="removed")
    # <mask> takes the space before it (lstrip, as fairseq's hub encodes ' <mask>'): decoding gives it back
    # ('of <mask>', not 'of<mask>'), the Metaspace decoder dropping it at the start of the text
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("<mask>", "▁<mask>"),
        decoders.Metaspace(replacement="▁",
                           prepend_scheme="always" if model.add_dummy_prefix else "never")])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=SINGLE, pair=PAIR, special_tokens=[("<s>", vocabulary.index("<s>")),
                                                  ("</s>", vocabulary.index("</s>"))])
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False, lstrip=token == "<mask>")
                                  for token in SPECIAL])
    return tokenizer


def fairseq_ids(processor, index, text):
    """fairseq's ids of ``text``: sentencepiece's pieces joined by spaces and split at whitespace (a piece
    of whitespace alone is dropped), looked up in the dictionary ``index``, framed."""
    words = " ".join(processor.encode(text, out_type=str)).split()
    return [index["<s>"], *(index.get(word, index["<unk>"]) for word in words), index["</s>"]]


def first_difference(tokenizer, model_path, vocabulary, texts=PROBES):
    """The first of ``texts``, and of the dictionary's symbols that sentencepiece does not hold, whose ids
    from ``tokenizer`` differ from fairseq's, or None."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=model_path)
    index = {symbol: i for i, symbol in enumerate(vocabulary)}  # a repeated symbol: its last id, as fairseq
    foreign = [symbol for symbol in vocabulary
               if symbol not in SPECIAL and processor.piece_to_id(symbol) == processor.unk_id()]
    return next((text for text in (*texts, *foreign)
                 if tokenizer.encode(text).ids != fairseq_ids(processor, index, text)), None)


def fast_tokenizer(model_path, vocabulary):
    """(``tokenizers.Tokenizer``, None) giving fairseq's ids for the sentencepiece model ``model_path`` and
    ``vocabulary``, or (None, why it cannot)."""
    model = read_sentencepiece(model_path)
    reason = unsupported(model, vocabulary)
    if reason:
        return None, reason
    tokenizer = build(model, vocabulary)
    differing = first_difference(tokenizer, model_path, vocabulary)
    if differing is not None:
        return None, f"tokenizers encodes {differing!r} otherwise than sentencepiece"
    return tokenizer, None


def tokenizer_config(max_positions):
    """tokenizer_config.json of a fast export: transformers' standard class, fairseq's special tokens."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_positions,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>",
        "cls_token": "<s>", "pad_token": "<pad>", "mask_token": "<mask>",
        "model_input_names": ["input_ids", "attention_mask"],
        "clean_up_tokenization_spaces": False,
    }
