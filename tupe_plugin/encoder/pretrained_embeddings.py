"""Initialising the word embeddings from pre-trained vectors, standardised (Kang et al.).

Kang et al. ("On Initializing Transformers with Pre-trained Embeddings", arXiv 2407.12514) find that
pre-trained vectors with a wide value range train worse than random init, partly because, added to the much
smaller position embeddings, they absorb the position information; rescaling them to a narrow range recovers
the gain. This module reads the vectors (word2vec/GloVe text or a fairseq checkpoint), matches them to the
fairseq dictionary, standardises them and copies them into the embedding matrix; how much of the position
signal then survives in the input is measured by :mod:`.embedding_diagnosis`.
"""

import logging
import math
import os

import numpy
import torch

from ..user_input.path_checks import path_problem

logger = logging.getLogger(__name__)

STANDARDIZE_CHOICES = ("none", "std", "xavier")
PROJECT_CHOICES = ("none", "pca", "random")
# fairseq's init_bert_params draws every nn.Embedding from N(0, 0.02) (checked by the tests).
FAIRSEQ_EMBED_INIT_STD = 0.02
SENTENCEPIECE_WORD_START = "\u2581"
# Where fairseq models keep their token embeddings, in order of preference.
CHECKPOINT_EMBEDDING_KEYS = (
    "encoder.sentence_encoder.embed_tokens.weight",
    "encoder.embed_tokens.weight",
    "decoder.embed_tokens.weight",
)


class PretrainedVectors:
    """Tokens and their vectors (one row per token, file order)."""

    def __init__(self, tokens, vectors):
        self.tokens = tokens
        self.vectors = vectors

    @property
    def dim(self):
        return self.vectors.size(1)


# ---------------------------------------------------------------------------------------------- reading


def read_vectors(path, dictionary_path=None):
    """Read ``--embed-init-path``: a fairseq checkpoint (``*.pt``, or any file torch can load) or text."""
    if problem := path_problem(path):
        raise FileNotFoundError(f"--embed-init-path {path}: {problem}")
    if _is_zip_or_pickle(path):
        return read_checkpoint_vectors(path, dictionary_path)
    return read_text_vectors(path)


def _is_number(field):
    try:
        float(field)
    except ValueError:
        return False
    return True


def _ragged_line_message(path, number, fields, dim, header_rows):
    """A line whose number of values is not the file's vector size (a token with spaces is no number)."""
    values = len(fields) - 1
    if len(fields) > dim + 1:  # the token's last word is a number: more values, not a token with spaces
        values = 0
        while values < len(fields) - 1 and _is_number(fields[-values - 1]):
            values += 1
    if header_rows is not None:
        return (f"--embed-init-path {path}, line {number}: {values} values, but the header (line 1: "
                f"'{header_rows} {dim}') announces vectors of {dim}; correct the header or the line")
    return (f"--embed-init-path {path}, line {number}: {values} values where the file's vectors have {dim} "
            "(as on its first line; every line must be 'token v1 ... vd' with the same d)")


def _is_zip_or_pickle(path):
    with open(path, "rb") as f:
        head = f.read(4)
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def read_text_vectors(path):
    """word2vec / GloVe text: ``token v1 ... vd`` per line, optionally a first line ``N d``.

    A header is recognised as a first line of exactly two integers; its d must then match the rows and
    its N the number of rows. A token may contain spaces (GloVe 840B does): the last d fields of a line
    are the vector, everything before them the token. The file is streamed, one float32 row at a time.
    """
    with open(path, "rb") as f:
        if b"\x00" in f.read(1 << 16):
            raise ValueError(
                f"--embed-init-path {path}: a binary file, neither word2vec/GloVe text nor a fairseq "
                "checkpoint (word2vec's binary format is not read: convert it to text, e.g. gensim's "
                "KeyedVectors.save_word2vec_format(..., binary=False))"
            )
    header_rows, dim, number = None, None, 0
    tokens, rows = [], []
    with open(path, encoding="utf-8") as f:
        try:
            for number, line in enumerate(f, 1):
                fields = line.split()
                if not fields:
                    continue
                if dim is None:
                    if len(fields) == 2 and all(field.isdigit() for field in fields):
                        header_rows, dim = int(fields[0]), int(fields[1])
                        continue
                    dim = len(fields) - 1
                if dim < 1 or len(fields) < dim + 1 or _is_number(fields[-dim - 1]) and len(fields) > dim + 1:
                    raise ValueError(_ragged_line_message(path, number, fields, dim, header_rows))
                try:
                    with numpy.errstate(over="ignore"):  # a value beyond float32 becomes inf, refused below
                        row = numpy.asarray(fields[-dim:], dtype=numpy.float32)
                except ValueError:
                    raise ValueError(
                        f"--embed-init-path {path}, line {number}: a value is not a number "
                        "(expected 'token v1 ... vd')"
                    ) from None
                if not numpy.isfinite(row).all():
                    raise ValueError(
                        f"--embed-init-path {path}, line {number}: the vector of "
                        f"{' '.join(fields[:-dim])!r} holds nan or inf values; fix or drop that line "
                        "(a non-finite vector would make every embedding statistic and the training nan)"
                    )
                rows.append(row)
                tokens.append(" ".join(fields[:-dim]))
        except UnicodeDecodeError:
            raise ValueError(
                f"--embed-init-path {path}: not UTF-8 text after line {number}; expected word2vec/GloVe "
                "text (token v1 ... vd per line) or a fairseq checkpoint"
            ) from None
    if not rows:
        raise ValueError(f"--embed-init-path {path}: no vectors (expected lines 'token v1 ... vd')")
    if header_rows is not None and header_rows != len(rows):
        raise ValueError(
            f"--embed-init-path {path}: the header announces {header_rows} vectors but the file has "
            f"{len(rows)} (truncated file?)"
        )
    return PretrainedVectors(tokens, torch.from_numpy(numpy.stack(rows)))


def read_checkpoint_vectors(path, dictionary_path=None):
    """The token embedding of a fairseq checkpoint and the symbols of its dictionary, row by row.

    The dictionary is ``--embed-init-dict`` when given, else ``dict.txt`` next to the checkpoint, else the
    ``dict.txt`` of the data the checkpoint was trained on (its ``task.data``). Rows past the dictionary
    (the ``<mask>`` that masked_lm / sentence_prediction append) are named ``<mask>`` when there is exactly
    one, and ignored otherwise.
    """
    from fairseq.data import Dictionary

    from ..fairseq_fixes.checkpoint_compat import UnsafeCheckpointError, load, unreadable_reason
    from ..fairseq_fixes.checkpoint_integrity import verify_checkpoint
    from ..fairseq_fixes.unreadable_checkpoints import UnreadableCheckpointError

    verify_checkpoint(path)
    try:
        state = load(path, "--embed-init-path")
    except UnsafeCheckpointError:
        raise
    except Exception:  # torch raises many types for a file that is not a checkpoint
        raise UnreadableCheckpointError(
            f"--embed-init-path {path}: neither word2vec/GloVe text nor a readable fairseq checkpoint "
            f"({unreadable_reason(path)})"
        ) from None
    weights = state.get("model", {})
    key = next((k for k in CHECKPOINT_EMBEDDING_KEYS if k in weights), None)
    if key is None:
        key = next((k for k in weights if k.endswith("embed_tokens.weight")), None)
    if key is None:
        raise ValueError(
            f"--embed-init-path {path}: the checkpoint has no token embedding "
            f"({' / '.join(CHECKPOINT_EMBEDDING_KEYS)} or any '*embed_tokens.weight')"
        )
    vectors = weights[key].float()
    dictionary_path = dictionary_path or _checkpoint_dictionary(path, state)
    symbols = list(Dictionary.load(dictionary_path).symbols)
    if len(symbols) > vectors.size(0):
        raise ValueError(
            f"--embed-init-dict {dictionary_path} has {len(symbols)} symbols but the checkpoint's "
            f"{key} only {vectors.size(0)} rows: it is not the dictionary of {path}"
        )
    if vectors.size(0) == len(symbols) + 1:
        symbols.append("<mask>")
    bad_rows = (~torch.isfinite(vectors[: len(symbols)]).all(dim=1)).nonzero().flatten().tolist()
    if bad_rows:
        raise ValueError(
            f"--embed-init-path {path}: {len(bad_rows)} rows of {key} hold nan or inf values (first: row "
            f"{bad_rows[0]}, {symbols[bad_rows[0]]!r}); the checkpoint's training diverged: take an earlier "
            "checkpoint of the run"
        )
    logger.info(f"embed-init: {key} of {path}, tokens from {dictionary_path}")
    return PretrainedVectors(symbols, vectors[: len(symbols)])


def _checkpoint_dictionary(path, state):
    candidates = [os.path.join(os.path.dirname(os.path.abspath(path)), "dict.txt")]
    task = (state.get("cfg") or {}).get("task") or {}
    data = task.get("data") or getattr(state.get("args"), "data", None)
    if data:
        candidates.append(os.path.join(str(data).split(os.pathsep)[0], "dict.txt"))
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(
        f"--embed-init-path {path}: no dictionary for the checkpoint's embedding (looked for "
        f"{', '.join(candidates)}); pass --embed-init-dict DICT (the dict.txt it was trained with)"
    )


# --------------------------------------------------------------------------------------------- matching


def normal_form(token):
    """The fallback key: lower-cased, without a leading sentencepiece word-start marker ▁."""
    return token.lower().removeprefix(SENTENCEPIECE_WORD_START)


def match_tokens(symbols, tokens, skip=()):
    """Pair dictionary rows with file rows: exact match first, then by :func:`normal_form`.

    ``symbols`` is the dictionary (row i = symbol i); indices in ``skip`` (the padding row) are never
    matched. When several file tokens share a key the first in the file wins. Returns
    ``(dictionary_rows, file_rows, counts)`` with counts ``exact``, ``fallback``, ``unmatched``.
    """
    exact, fallback = {}, {}
    for row, token in enumerate(tokens):
        exact.setdefault(token, row)
        key = normal_form(token)
        if key:
            fallback.setdefault(key, row)
    dictionary_rows, file_rows = [], []
    counts = {"exact": 0, "fallback": 0, "unmatched": 0}
    for index, symbol in enumerate(symbols):
        if index in skip:
            continue
        if symbol in exact:
            row, kind = exact[symbol], "exact"
        elif normal_form(symbol) in fallback:
            row, kind = fallback[normal_form(symbol)], "fallback"
        else:
            counts["unmatched"] += 1
            continue
        counts[kind] += 1
        dictionary_rows.append(index)
        file_rows.append(row)
    return dictionary_rows, file_rows, counts


# ----------------------------------------------------------------------------- projection, standardising


def project(vectors, dim, method, seed=1):
    """Map (n, d_in) vectors to (n, dim): ``pca`` (top principal components, d_in >= dim) or ``random``.

    pca: x -> (x - mean) V_dim, V_dim the top ``dim`` eigenvectors of the covariance of all the file's
    vectors. random: x -> x R with R ~ N(0, 1/dim) entries (norms preserved in expectation), seeded.
    """
    d_in = vectors.size(1)
    if method == "pca":
        if d_in < dim:
            raise ValueError(
                f"--embed-init-project pca cannot raise {d_in}-dimensional vectors to {dim}; "
                "use --embed-init-project random"
            )
        centred = vectors.double() - vectors.double().mean(0)
        _, eigenvectors = torch.linalg.eigh(centred.T @ centred)
        return (centred @ eigenvectors[:, -dim:].flip(-1)).float()
    generator = torch.Generator().manual_seed(seed)
    matrix = torch.randn(d_in, dim, generator=generator) / math.sqrt(dim)
    return vectors @ matrix


def standardize(rows, method, embedding_shape, init_std=FAIRSEQ_EMBED_INIT_STD):
    """Rescale the matched rows (Kang et al. §4); statistics are over all their entries together.

    * ``none``: unchanged.
    * ``std``: (x - mean) / std * init_std — zero mean and the model's own init std (population std).
    * ``xavier``: -a + 2a (x - min) / (max - min) with a = sqrt(6 / (fan_in + fan_out)) of the
      (vocabulary, dim) embedding matrix (fan_in = dim, fan_out = vocabulary, as torch counts them), so
      the values span exactly the Xavier-uniform range [-a, a].
    """
    if method == "none":
        return rows
    if method == "std":
        spread = rows.std(unbiased=False)
        if rows.numel() < 2 or spread == 0:
            raise ValueError("--embed-init-standardize std: the matched vectors are constant")
        return (rows - rows.mean()) / spread * init_std
    low, high = rows.min(), rows.max()
    if high == low:
        raise ValueError("--embed-init-standardize xavier: the matched vectors are constant")
    vocabulary, dim = embedding_shape
    bound = math.sqrt(6.0 / (dim + vocabulary))
    return (rows - low) / (high - low) * (2 * bound) - bound


def initialize_embeddings(embedding, dictionary, args):
    """Copy the flags' pre-trained vectors into ``embedding`` (nn.Embedding over ``dictionary``).

    Unmatched rows and the padding row keep their random init. Returns the coverage counts.
    """
    path = args.embed_init_path
    vectors = read_vectors(path, getattr(args, "embed_init_dict", None))
    weight = embedding.weight
    method = getattr(args, "embed_init_project", "none")
    if vectors.dim != weight.size(1):
        if method == "none":
            raise ValueError(
                f"--embed-init-path {path} has {vectors.dim}-dimensional vectors but the model's "
                f"embeddings are {weight.size(1)}-dimensional (--encoder-embed-dim); use vectors of "
                "that size or map them with --embed-init-project pca|random"
            )
        vectors.vectors = project(vectors.vectors, weight.size(1), method, getattr(args, "seed", 1))
    dictionary_rows, file_rows, counts = match_tokens(
        dictionary.symbols, vectors.tokens, skip={dictionary.pad()}
    )
    if not dictionary_rows:
        raise ValueError(
            f"--embed-init-path {path}: none of its {len(vectors.tokens)} tokens matches the "
            f"{len(dictionary)} dictionary symbols, even lower-cased and without '▁': is it the "
            "vocabulary of this data?"
        )
    rows = standardize(
        vectors.vectors[file_rows], args.embed_init_standardize, tuple(weight.shape)
    )
    with torch.no_grad():
        weight[torch.tensor(dictionary_rows)] = rows.to(weight.dtype)
    total = sum(counts.values())
    logger.info(
        f"embed-init: {path} -> {len(dictionary_rows)}/{total} dictionary rows (exact "
        f"{counts['exact']}, fallback {counts['fallback']}, unmatched {counts['unmatched']} keep the "
        f"random init), standardize={args.embed_init_standardize}"
    )
    return counts
