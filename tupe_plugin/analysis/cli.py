"""What did the position encodings learn? Pictures and property metrics of any plugin checkpoint.

    tupe-analyze --path checkpoints/checkpoint_last.pt --out analysis/

Writes the figures of each section that applies to the architecture (PNG, with a PDF beside it),
``positions.json`` with every number (sections that do not apply say why), ``positions.npz`` with the
figures' arrays (a study draws its comparisons from them), and prints a short table. ``--out`` is a
new or empty folder, or one an earlier analysis wrote: its figures and report are replaced, other files
are kept. The sections, the matrices and the metrics are defined in docs/analysis.md.
"""

import argparse
import logging
import os
import sys

import torch

from tupe_plugin.analysis.checkpoint import CheckpointError, load_checkpoint
from tupe_plugin.analysis.embedding_section import embeddings_vs_positions
from tupe_plugin.analysis.figures import VECTOR_FORMAT
from tupe_plugin.analysis.position_matrices import has_learned_table
from tupe_plugin.analysis.position_sections import POSITION_SECTIONS
from tupe_plugin.analysis.report import (AnalysisContext, OutputFolderError, arrays_path,
                                         claim_output_folder, format_table, run_sections, write_json)
from tupe_plugin.cli.extras import MissingExtraError, require
from tupe_plugin.fairseq_fixes.checkpoint_integrity import CorruptCheckpointError
from tupe_plugin.fairseq_fixes.unreadable_checkpoints import UnreadableCheckpointError
from tupe_plugin.models.checkpoint_guards import DictionaryMismatchError

# The report's sections, in order; further diagnoses are appended here as functions
# section(context) -> SectionResult (see tupe_plugin/analysis/report.py).
SECTIONS = (*POSITION_SECTIONS, embeddings_vs_positions)

DEFAULT_POSITIONS = 128  # Wang et al. 2021 shows the first 128 positions (its footnote 10)
REPORT_NAME = "positions.json"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", required=True, help="a plugin checkpoint (.pt)")
    parser.add_argument("--data", help="data-bin directory holding dict.txt (default: the one "
                        "stored in the checkpoint)")
    parser.add_argument("--out", required=True, help="folder for the PNGs and " + REPORT_NAME)
    parser.add_argument("--max-positions", type=int, metavar="N",
                        help=f"analyse positions 0..N-1 (default: min({DEFAULT_POSITIONS}, the "
                        "model's --max-positions))")
    parser.add_argument("--probe-samples", type=int, default=100, metavar="N",
                        help="random words averaged by identical-word probing (default 100)")
    parser.add_argument("--window", type=int, default=20, metavar="W",
                        help="offsets 1..W counted by the monotonicity fractions (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the probing words")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="torch device (default: cuda when available, else cpu)")
    args = parser.parse_args(argv)
    for flag, value, least in (("--probe-samples", args.probe_samples, 1),
                               ("--window", args.window, 1),
                               ("--max-positions", args.max_positions, 3)):
        if value is not None and value < least:
            parser.error(f"{flag} must be at least {least}, got {value}")
    check_device_and_out(parser, args)
    return parser, args


def check_device_and_out(parser, args):
    """One line for a device torch cannot use here and an --out that is a file, before the model loads."""
    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        parser.error(f"--device {args.device}: {error}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch finds no CUDA device on this machine; use --device cpu")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out {args.out} is a file; give a folder "
                     f"(it will hold the figures and {REPORT_NAME})")


def positions_to_analyse(model, requested):
    """T: the requested count, checked against a learned table's length."""
    limit = model.max_positions()
    if requested is None:
        return min(DEFAULT_POSITIONS, limit)
    if requested > limit and has_learned_table(model):
        raise CheckpointError(
            f"--max-positions {requested} exceeds the {limit} positions of the checkpoint's "
            f"learned table; use --max-positions {limit} or less"
        )
    return requested


def main(argv=None):
    parser, args = parse_args(argv)
    logging.getLogger().setLevel(logging.INFO)  # importing fairseq leaves the root logger at DEBUG
    try:
        require("matplotlib", "analysis", "tupe-analyze")
        model, dictionary, arch = load_checkpoint(args.path, args.data)
        seq_len = positions_to_analyse(model, args.max_positions)
        claim_output_folder(args.out, REPORT_NAME)
    except (CheckpointError, OutputFolderError, CorruptCheckpointError, UnreadableCheckpointError,
            DictionaryMismatchError, MissingExtraError) as error:
        parser.error(str(error))
    model.to(args.device)
    context = AnalysisContext(
        model=model, dictionary=dictionary, arch=arch, seq_len=seq_len, out_dir=args.out,
        window=args.window, probe_samples=args.probe_samples, seed=args.seed,
    )
    results = run_sections(context, SECTIONS)
    report = write_json(context, results, os.path.join(args.out, REPORT_NAME), args.path)
    print(f"{arch}, positions 0..{seq_len - 1}, {args.path}")
    print(format_table(results))
    print(f"\nfigures (PNG, each with a {VECTOR_FORMAT.upper()} beside it) and {REPORT_NAME} in "
          f"{os.path.abspath(args.out)}:")
    for result in results:
        for figure, caption in zip(result.figures, result.captions):
            print(f"  {figure}\n    {caption}")
    print(f"  {report}\n  {arrays_path(report)} (the figures' numbers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
