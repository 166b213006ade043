"""Encodings without a table of positions validate beyond the training length (Wang et al. 2021 §4.2;
ALiBi, RoPE, the distance biases made for it: KERPLE, Sandwich, FIRE, and DeBERTa's relative table)."""

import math

import pytest

from cli import logged_losses, run_fairseq_for_each, run_fairseq_steps, train_args

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


WITHOUT_TABLES = ["bert_sin_ape_tiny", "bert_lsin_rpe_tiny", "bert_nope_tiny"]
EXTRAPOLATING = ["bert_alibi_tiny", "bert_alibi_asym_tiny", "bert_rope_tiny", "bert_kerple_tiny",
                 "bert_sandwich_tiny", "bert_fire_tiny", "deberta_tiny"]


@pytest.fixture(scope="module")
def validated_long(wikitext_bin, tmp_path_factory):
    """The validation output of every arch trained short and validated long, in chains run side by side."""
    root = tmp_path_factory.mktemp("length")
    lengths = {arch: (TRAIN_LENGTH, VALID_LENGTH) for arch in WITHOUT_TABLES}
    lengths.update({arch: (64, 256) for arch in EXTRAPOLATING})
    done, ends = run_fairseq_for_each(
        list(lengths), lambda arch: short_then_long(wikitext_bin, root / arch, arch, *lengths[arch]))
    missing = [arch for arch in lengths if arch not in done]
    assert not missing, f"{missing[0]} did not train and validate:\n{ends[missing[0]]}"
    return {arch: outputs[1] for arch, outputs in done.items()}


@pytest.mark.parametrize("arch", WITHOUT_TABLES)
def test_models_without_position_tables_validate_at_4x_the_training_length(arch, validated_long):
    (loss,) = logged_losses(validated_long[arch], "valid")
    assert math.isfinite(loss)


@pytest.mark.parametrize("arch", EXTRAPOLATING)
def test_extrapolating_encodings_trained_at_64_tokens_validate_at_256(arch, validated_long):
    (loss,) = logged_losses(validated_long[arch], "valid")
    assert math.isfinite(loss)


def test_learned_position_table_refuses_a_longer_max_positions(wikitext_bin, tmp_path):
    outputs, returncode = run_fairseq_steps(*short_then_long(wikitext_bin, tmp_path, "bert_a_tiny"),
                                            check=False)
    assert len(outputs) == 2, f"training failed:\n{outputs[-1][-3000:]}"
    assert returncode != 0
    assert "cannot change length: use --model-overrides \"{'max_positions': 32}\"" in outputs[1]
    assert "--max-positions 32" not in outputs[1]  # fairseq-validate has no such flag
