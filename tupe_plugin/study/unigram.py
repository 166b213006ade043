"""The context-free baseline: unigram cross-entropy of the validation text, in bits per token.

A masked language model that ignores the context can do no better than predicting every masked
token from the training text's token frequencies. Its loss is the cross-entropy of the validation
tokens under those frequencies::

    H = -(1/M) sum_j log2 p(w_j),   p(w) = (c(w) + 1) / (N + V)

with c(w) the count of w in the training tokens (N of them), V the vocabulary: the symbols of the
dictionary (fairseq's dict.txt) plus ``</s>`` and ``<unk>``. Tokens are counted as
fairseq-preprocess binarizes them: the pieces of each line, then ``</s>``; a piece outside the
dictionary is ``<unk>``. Add-one smoothing keeps a validation token unseen in training finite.
fairseq's masked-LM loss is in bits too, so the two compare directly: the margin between them is
what the model learned from the context.

    python -m tupe_plugin.study.unigram --train spm/train.bpe --valid spm/valid.bpe \\
        --dict data-bin/dict.txt --out unigram.json
"""

import argparse
import json
import math
import os
from collections import Counter

from ..user_input.path_checks import path_problem

EOS, UNK = "</s>", "<unk>"


def read_dictionary(path):
    """The symbols of a fairseq dict.txt (``symbol count`` per line)."""
    symbols = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.rstrip("\n").split(" ")
            if len(fields) < 2 or not fields[1].isdigit():
                raise ValueError(f"{path}:{number}: not a fairseq dictionary line ('symbol count')")
            symbols.append(fields[0])
    return symbols


def tokens(path, vocabulary):
    """The tokens of a text of space-separated pieces, as fairseq-preprocess binarizes them."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            for piece in line.split():
                yield piece if piece in vocabulary else UNK
            yield EOS


def unigram_cross_entropy(train_path, valid_path, symbols):
    """Bits per validation token under the add-one smoothed training frequencies."""
    vocabulary = set(symbols) | {EOS, UNK}
    counts = Counter(tokens(train_path, vocabulary))
    total, size = sum(counts.values()), len(vocabulary)
    bits, count = 0.0, 0
    for token in tokens(valid_path, vocabulary):
        bits -= math.log2((counts[token] + 1) / (total + size))
        count += 1
    if count == 0:
        raise ValueError(f"{valid_path}: no tokens")
    return {"bits_per_token": bits / count, "valid_tokens": count, "train_tokens": total,
            "vocabulary": size}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", required=True, help="training text, space-separated pieces")
    parser.add_argument("--valid", required=True, help="validation text, space-separated pieces")
    parser.add_argument("--dict", required=True, help="fairseq dict.txt of the binarized data")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    for flag, path in (("--train", args.train), ("--valid", args.valid), ("--dict", args.dict)):
        if problem := path_problem(path):
            parser.error(f"{flag} {path}: {problem}")
    try:
        result = unigram_cross_entropy(args.train, args.valid, read_dictionary(args.dict))
    except ValueError as error:
        parser.error(str(error))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"unigram baseline: {result['bits_per_token']:.3f} bits/token over {result['valid_tokens']} "
          f"validation tokens -> {args.out}")


if __name__ == "__main__":
    main()
