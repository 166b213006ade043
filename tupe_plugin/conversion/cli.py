"""Convert the TUPE authors' released TUPE-R checkpoint into a plugin checkpoint.

    tupe-convert-official --checkpoint tupe_ckp/model.pt --dict tupe_ckp/dict.txt \\
        --out tupe_r_release

writes ``OUT/model.pt``, a fairseq checkpoint of the plugin's ``tupe_r_*`` architecture with the
release's semantics (``--cls-reset release --untied-proj-bias``, ``--max-positions`` = table rows - 1,
the embedding LayerNorm when the release has one), and ``OUT/dict.txt``, whose ids are the checkpoint's
embedding rows. fairseq-validate, ``TupeRobertaModel.from_pretrained(OUT)`` and sentence_prediction
fine-tuning (``--restore-file``) load it like any plugin checkpoint. The conversion itself is
:mod:`tupe_plugin.conversion.official_tupe`; the release's format is described in docs/official_tupe.md.

Nothing is overwritten: the files are written beside OUT and moved into place when the conversion
succeeded; a ``model.pt`` or ``dict.txt`` already in OUT stops the conversion unless ``--force`` is given,
and always when it is the ``--checkpoint`` or ``--dict`` being converted.
"""

import argparse
import logging
import sys

from tupe_plugin.conversion.official_tupe import convert
from tupe_plugin.user_input.path_checks import path_problem
from tupe_plugin.user_input.user_errors import UserError


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="the release's model.pt")
    parser.add_argument("--dict", required=True, help="the release's dict.txt")
    parser.add_argument("--out", required=True, help="folder for model.pt and dict.txt")
    parser.add_argument("--force", action="store_true",
                        help="replace model.pt and dict.txt already in --out (only once the conversion "
                        "succeeded)")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="load with torch.load(weights_only=False): only for a file you trust")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    for flag, path in (("--checkpoint", args.checkpoint), ("--dict", args.dict)):
        if problem := path_problem(path):
            parser.error(f"{flag} {path}: {problem}")
    try:
        convert(args.checkpoint, args.dict, args.out, args.allow_pickle, args.force)
    except UserError as error:
        sys.exit(f"tupe-convert-official: error: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
