"""fairseq-preprocess -> fairseq-train -> fairseq-validate through the real command-line tools."""

import math
import os

import pytest
from cli import logged_losses, run_fairseq, train_args, train_inner_losses, validate_args
from conftest import PRESETS


@pytest.mark.smoke  # make check's one fairseq-train
def test_train_validate_and_resume_tupe_r(wikitext_bin, tmp_path):
    save_dir = tmp_path / "checkpoints"
    tensorboard = tmp_path / "tensorboard"
    first = run_fairseq(
        "train", *train_args(wikitext_bin, save_dir, "tupe_r_tiny", 4,
                             "--save-interval-updates", 2, "--tensorboard-logdir", tensorboard)
    )
    assert len(train_inner_losses(first)) == 4
    assert (save_dir / "checkpoint_last.pt").is_file()
    assert list(tensorboard.rglob("events.out.tfevents.*"))

    validated = run_fairseq("validate", *validate_args(wikitext_bin, save_dir / "checkpoint_last.pt"))
    (loss,) = logged_losses(validated, "valid")
    assert math.isfinite(loss)

    resumed = run_fairseq("train", *train_args(wikitext_bin, save_dir, "tupe_r_tiny", 6))
    assert "Loaded checkpoint" in resumed and "@ 4 updates" in resumed
    assert len(train_inner_losses(resumed)) == 2


def test_user_dir_may_be_the_installed_package_path(wikitext_bin, tmp_path):
    import tupe_plugin

    package_dir = os.path.dirname(tupe_plugin.__file__)
    out = run_fairseq(
        "train", *train_args(wikitext_bin, tmp_path, "bert_a_tiny", 1)[:-1],
        "--user-dir", package_dir, "--no-epoch-checkpoints", cwd=tmp_path,
    )
    assert len(train_inner_losses(out)) == 1


@pytest.mark.parametrize("preset", PRESETS)
def test_every_architecture_trains_and_validates(preset, every_preset_run):
    runs, last_outputs = every_preset_run
    assert preset in runs, f"the chain stopped before {preset} validated:\n{last_outputs[preset]}"
    out, validated = runs[preset][:2]
    losses = train_inner_losses(out) + logged_losses(out, "valid")
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert logged_losses(validated, "valid") == logged_losses(out, "valid")
