"""Length extrapolation: a pre-trained model's validation masked-LM loss on inputs longer than trained.

As "On Position Embeddings in BERT" (Wang et al., ICLR 2021, §4.2) and the ALiBi and RoPE papers ask:
``fairseq-validate`` on the study's validation text cut into blocks of ``--length`` tokens across line
ends (``--sample-break-mode none --tokens-per-sample L``: every input but the last is L tokens long),
the model rebuilt for that length (``--model-overrides "{'max_positions': L}"``). A model with a
learned position table (``--abs-pos learned``, TUPE's untied table) keeps its table as trained: a
shorter ``L`` reads its first ``L`` rows, and for a longer ``L`` no number is given, the result saying
why (``table of N positions``) instead of leaving the row out. ``--rotary-scaling linear|ntk
--rotary-scaling-factor F`` validates a RoPE model with that evaluation-time scaling of its angles
(position interpolation, Chen et al. 2023, arXiv 2306.15595; NTK-aware base scaling) as a row of its
own; a model without RoPE gets ``no RoPE to scale`` as the position config words it (and learnable
RoPE, which has no base, its refusal of ntk).

    python -m tupe_plugin.study.extrapolation --path CKPT --data DATA_BIN --length 256 --out FILE.json

writes ``{"length", "max_positions" (the trained model's), "loss" (bits, or null), "reason" (null,
or why there is no loss)}``; ``validate.log`` beside it is fairseq-validate's output.
"""

import argparse
import json
from dataclasses import replace
import os
import subprocess
import sys

from ..cli.child_processes import ended_with_parent
from ..cli.fairseq_logs import valid_lines
from ..cli.fairseq_tools import PLUGIN_DIR, fairseq_tool
from ..encodings.rotary_position import scaling_overrides
from ..user_input.cli_types import finite_float


def trained_model(path):
    """``(max_positions, learned table, its PositionConfig)`` of a plugin checkpoint."""
    from ..checkpoints.checkpoint_config import saved_model_config
    from ..encodings.position_config import PositionConfig

    model = saved_model_config(path)
    config = PositionConfig.from_args(model)
    return model.max_positions, config.learned_tables, config


def scaling_refused(config, overrides):
    """Why the model's position config refuses the RoPE scaling ``overrides`` (its message: no RoPE to
    scale, ntk on learnable frequencies, ...), or None."""
    from ..encodings.position_config import PositionFlagError

    try:
        replace(config, **overrides).check()
    except PositionFlagError as error:
        return str(error).splitlines()[-1].strip()
    return None


def validate(path, data, length, positions, batch_size, cpu, log_path, overrides=None):
    """The validation loss (bits) of fairseq-validate at ``length``, the model rebuilt for ``positions``
    (with the model ``overrides``), its output in ``log_path``."""
    overrides = {"max_positions": positions, **(overrides or {})}
    command = [fairseq_tool("validate"), data, "--user-dir", PLUGIN_DIR, "--path", path,
               "--task", "masked_lm", "--criterion", "masked_lm", "--sample-break-mode", "none",
               "--tokens-per-sample", str(length), "--model-overrides", repr(overrides),
               "--batch-size", str(batch_size), "--num-workers", "0", *(["--cpu"] if cpu else [])]
    with open(log_path, "w", encoding="utf-8") as log:
        returncode = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT,
                                     preexec_fn=ended_with_parent())
    losses = [fields["loss"] for fields in valid_lines(log_path) if "loss" in fields]
    if returncode or not losses:
        raise RuntimeError(f"fairseq-validate at length {length} failed (exit status {returncode}); "
                           f"see {log_path}")
    return losses[-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", required=True, help="the pre-trained plugin checkpoint")
    parser.add_argument("--data", required=True, help="the pre-training data-bin (its valid split is read)")
    parser.add_argument("--length", type=int, required=True, help="longest input, in tokens")
    parser.add_argument("--batch-size", type=int, default=8, help="default 8")
    parser.add_argument("--out", required=True, help="the result, a JSON file")
    parser.add_argument("--rotary-scaling", choices=("linear", "ntk"), help="RoPE's evaluation-time scaling")
    parser.add_argument("--rotary-scaling-factor", type=finite_float, default=None, help="its factor F > 1")
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args(argv)
    if args.length < 8:
        parser.error(f"--length must be at least 8, got {args.length}")
    if (args.rotary_scaling is None) != (args.rotary_scaling_factor is None):
        parser.error("give --rotary-scaling and --rotary-scaling-factor together")
    trained, learned_table, config = trained_model(args.path)
    result = {"length": args.length, "max_positions": trained, "loss": None, "reason": None}
    overrides = {}
    if args.rotary_scaling:
        result["rotary_scaling"] = {"scaling": args.rotary_scaling, "factor": args.rotary_scaling_factor}
        overrides = scaling_overrides(args.rotary_scaling, args.rotary_scaling_factor)
    folder = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(folder, exist_ok=True)
    if learned_table and args.length > trained:
        result["reason"] = f"table of {trained} positions"
    elif args.rotary_scaling and scaling_refused(config, overrides):
        result["reason"] = scaling_refused(config, overrides)
    else:
        log_path = os.path.join(folder, "validate.log")
        positions = trained if learned_table else args.length  # a table validates shorter inputs as trained
        result["loss"] = validate(args.path, args.data, args.length, positions, args.batch_size, args.cpu,
                                  log_path, overrides)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
