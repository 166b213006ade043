"""Length extrapolation of a pre-trained model: fairseq-validate at a longer length, or why not."""

import json

import pytest

from tupe_plugin.study import extrapolation


def run(pretrained_dir, tmp_path, length):
    out = tmp_path / f"len{length}" / "extrapolation.json"
    assert extrapolation.main(["--path", str(pretrained_dir / "checkpoints" / "checkpoint_last.pt"),
                               "--data", str(pretrained_dir / "data-bin"), "--length", str(length),
                               "--batch-size", "4", "--out", str(out), "--cpu"]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


def test_a_learned_table_has_no_loss_beyond_its_positions_and_says_why(pretrained_dir, tmp_path):
    checkpoint = pretrained_dir / "checkpoints" / "checkpoint_last.pt"
    max_positions, learned, _ = extrapolation.trained_model(checkpoint)
    assert learned  # TUPE-R's untied table
    result = run(pretrained_dir, tmp_path, 2 * max_positions)
    assert result == {"length": 2 * max_positions, "max_positions": max_positions, "loss": None,
                      "reason": f"table of {max_positions} positions"}


def test_a_learned_table_validates_a_shorter_length_with_the_table_as_trained(pretrained_dir, tmp_path):
    max_positions, learned, _ = extrapolation.trained_model(
        pretrained_dir / "checkpoints" / "checkpoint_last.pt")
    assert learned and max_positions >= 16
    result = run(pretrained_dir, tmp_path, max_positions // 2)
    assert result["reason"] is None and 0 < result["loss"] < 20


@pytest.mark.slow
def test_a_length_the_model_reaches_gets_fairseq_validates_loss(pretrained_dir, tmp_path):
    max_positions, _, _ = extrapolation.trained_model(pretrained_dir / "checkpoints" / "checkpoint_last.pt")
    result = run(pretrained_dir, tmp_path, max_positions)
    assert result["reason"] is None and 0 < result["loss"] < 20
    assert "valid on 'valid' subset" in (tmp_path / f"len{max_positions}" / "validate.log").read_text()
