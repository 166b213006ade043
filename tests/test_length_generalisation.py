"""Encodings without a table of positions validate beyond the training length (Wang et al. 2021 §4.2; the
ALiBi, RoPE, KERPLE, Sandwich and FIRE papers): every preset whose model keeps no learned table, trained at
64 tokens, validates at 256 (conftest's every_preset_run, shared with test_fairseq_cli); a learned table
refuses a longer --max-positions."""

import math

import pytest

from cli import logged_losses, run_fairseq_steps, train_args, validate_args
from conftest import PRESETS, without_learned_tables

TRAIN_LENGTH, VALID_LENGTH = 32, 128


def short_then_long(data, save_dir, arch, train_length=TRAIN_LENGTH, valid_length=VALID_LENGTH):
    """fairseq-train at ``train_length``, then fairseq-validate of its checkpoint at ``valid_length``."""
    return [
        ("train", train_args(data, save_dir, arch, 2, "--tokens-per-sample", train_length)),
        ("validate", validate_args(data, save_dir / "checkpoint_last.pt", "--tokens-per-sample", valid_length,
                                   "--model-overrides", f"{{'max_positions': {valid_length}}}")),
    ]


@pytest.mark.parametrize("preset", [preset for preset in PRESETS if without_learned_tables(preset)])
def test_models_without_a_learned_position_table_trained_at_64_tokens_validate_at_256(preset,
                                                                                       every_preset_run):
    done, ends = every_preset_run
    assert preset in done, f"{preset}_tiny did not train and validate:\n{ends[preset]}"
    (loss,) = logged_losses(done[preset][2], "valid")
    assert math.isfinite(loss)


def test_learned_position_table_refuses_a_longer_max_positions(wikitext_bin, tmp_path):
    outputs, returncode = run_fairseq_steps(*short_then_long(wikitext_bin, tmp_path, "bert_a_tiny"),
                                            check=False)
    assert len(outputs) == 2, f"training failed:\n{outputs[-1][-3000:]}"
    assert returncode != 0
    assert "cannot change length: use --model-overrides \"{'max_positions': 32}\"" in outputs[1]
    assert "--max-positions 32" not in outputs[1]  # fairseq-validate has no such flag
