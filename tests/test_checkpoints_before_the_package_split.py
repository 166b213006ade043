"""Checkpoints saved before tupe_plugin/modules was split into packages load with the same keys and give
the same features (tests/data/checkpoints, made by its make_checkpoints.sh)."""

import pytest
import torch
from conftest import test_data
from fairseq import checkpoint_utils

FIXTURE = test_data("checkpoints")
SAVED = torch.load(f"{FIXTURE}/features.pt")


@pytest.mark.parametrize("arch", sorted(SAVED["features"]))
def test_a_checkpoint_saved_before_the_split_loads_strictly_and_gives_its_saved_features(arch):
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [f"{FIXTURE}/{arch}.pt"], arg_overrides={"data": FIXTURE}, strict=True)
    with torch.no_grad():
        features = models[0].eval()(SAVED["tokens"])[0]
    torch.testing.assert_close(features, SAVED["features"][arch], rtol=1e-5, atol=1e-5)
