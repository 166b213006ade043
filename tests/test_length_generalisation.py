"""Encodings without a table of positions validate beyond the training length (Wang et al. 2021 §4.2; the
ALiBi, RoPE, KERPLE, Sandwich and FIRE papers): every preset whose model keeps no learned table, trained at
64 tokens, validates at 256; a learned table refuses a longer --max-positions."""

import math

import pytest

from cli import logged_losses, run_fairseq_for_each, run_fairseq_steps, train_args
from conftest import PRESETS, preset_config

TRAIN_LENGTH, VALID_LENGTH = 32, 128


def short_then_long(data, save_dir, arch, train_length=TRAIN_LENGTH, valid_length=VALID_LENGTH):
    """fairseq-train at ``train_length``, then fairseq-validate of its checkpoint at ``valid_length``."""
    return [
        ("train", train_args(data, save_dir, arch, 2, "--tokens-per-sample", train_length)),
        ("validate", [
            data, "--user-dir", "tupe_plugin", "--path", save_dir / "checkpoint_last.pt",
            "--task", "masked_lm", "--tokens-per-sample", valid_length,
            "--model-overrides", f"{{'max_positions': {valid_length}}}",
            "--batch-size", 4, "--cpu",
        ]),
    ]


# every preset whose model keeps no learned table of positions (PositionConfig.learned_tables: an absolute or
# untied table, DeBERTa's Enhanced Mask Decoder's)
WITHOUT_TABLES = [f"{preset}_tiny" for preset in PRESETS if not preset_config(preset).learned_tables]


@pytest.fixture(scope="module")
def validated_long(wikitext_bin, tmp_path_factory):
    """({arch: the validation output}, {arch: the end of its chain's output}) of every arch trained at 64
    tokens and validated at 256, in chains run side by side."""
    root = tmp_path_factory.mktemp("length")
    return run_fairseq_for_each(
        WITHOUT_TABLES, lambda arch: short_then_long(wikitext_bin, root / arch, arch, 64, 256))


@pytest.mark.parametrize("arch", WITHOUT_TABLES)
def test_models_without_a_learned_position_table_trained_at_64_tokens_validate_at_256(arch, validated_long):
    done, ends = validated_long
    assert arch in done, f"{arch} did not train and validate:\n{ends[arch]}"
    (loss,) = logged_losses(done[arch][1], "valid")
    assert math.isfinite(loss)


def test_learned_position_table_refuses_a_longer_max_positions(wikitext_bin, tmp_path):
    outputs, returncode = run_fairseq_steps(*short_then_long(wikitext_bin, tmp_path, "bert_a_tiny"),
                                            check=False)
    assert len(outputs) == 2, f"training failed:\n{outputs[-1][-3000:]}"
    assert returncode != 0
    assert "cannot change length: use --model-overrides \"{'max_positions': 32}\"" in outputs[1]
    assert "--max-positions 32" not in outputs[1]  # fairseq-validate has no such flag
