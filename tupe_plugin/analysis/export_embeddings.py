"""Write the token embedding of a fairseq checkpoint as word2vec text ('N d' header, 'token v1 ... vd').

    tupe-export-embeddings checkpoints/checkpoint_last.pt --out vectors.txt

The dictionary is found as for ``--embed-init-path`` (``--dict``, else dict.txt next to the checkpoint,
else the dict.txt of the data it was trained on). The output is what ``--embed-init-path`` reads.
"""

import argparse
import logging
import os
import sys

from tupe_plugin.encoder.pretrained_embeddings import read_checkpoint_vectors
from tupe_plugin.user_input.cli_types import finite_float
from tupe_plugin.user_input.overwritten_inputs import overwritten_input
from tupe_plugin.user_input.user_errors import UserError


def own_flags(message, checkpoint):
    """The reader's messages name fairseq-train's --embed-init-* flags; this script has CHECKPOINT and
    --dict."""
    return (message.replace(f"--embed-init-path {checkpoint}", checkpoint)
            .replace("--embed-init-path", "CHECKPOINT").replace("--embed-init-dict", "--dict"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("checkpoint", help="a fairseq checkpoint (.pt)")
    parser.add_argument("--out", required=True, help="the text file to write")
    parser.add_argument("--dict", help="the checkpoint's dict.txt (default: found as described above)")
    parser.add_argument("--no-header", action="store_true", help="GloVe style: no 'N d' first line")
    parser.add_argument(
        "--scale", type=finite_float, default=1.0,
        help="multiply every vector by this factor, e.g. 20 to mimic the wide value range of GloVe "
        "vectors (std ~0.4) with a plugin checkpoint (std ~0.02) (default 1: as trained)",
    )
    args = parser.parse_args(argv)
    beside = os.path.join(os.path.dirname(os.path.abspath(args.checkpoint)), "dict.txt")
    overwritten = overwritten_input(args.out, (("CHECKPOINT", args.checkpoint), ("--dict", args.dict),
                                               ("checkpoint's dict.txt", None if args.dict else beside)))
    if overwritten:
        sys.exit(f"tupe-export-embeddings: error: --out {args.out} is {overwritten}, which the vectors would "
                 "overwrite: write them elsewhere (--out vectors.txt)")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        vectors = read_checkpoint_vectors(args.checkpoint, args.dict)
    except (UserError, ValueError, RuntimeError, FileNotFoundError) as error:
        sys.exit(f"tupe-export-embeddings: error: {own_flags(str(error), args.checkpoint)}")
    partial = args.out + ".tmp"
    with open(partial, "w", encoding="utf-8") as f:
        if not args.no_header:
            f.write(f"{len(vectors.tokens)} {vectors.dim}\n")
        for token, row in zip(vectors.tokens, (vectors.vectors * args.scale).tolist()):
            f.write(token + " " + " ".join(f"{value:.8g}" for value in row) + "\n")
    os.replace(partial, args.out)
    print(f"wrote {len(vectors.tokens)} vectors of size {vectors.dim} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
