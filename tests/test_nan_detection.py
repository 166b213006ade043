"""fairseq's NaN detector walks every module's output: the shared positional term must not stop it."""

import logging

import pytest
import torch
from cli import run_fairseq_steps, train_args
from conftest import build_model, random_tokens
from fairseq.nan_detector import NanDetector


@pytest.mark.parametrize("preset", ["tupe_r", "tupe_a", "bert_a", "bert_rpe"])
def test_nan_detector_names_the_module_with_a_nan_output(preset, dictionary, caplog):
    model = build_model(f"{preset}_tiny", dictionary)
    with torch.no_grad():
        model.encoder.sentence_encoder.layers[1].fc1.weight[0, 0] = float("nan")
    with caplog.at_level(logging.WARNING, logger="fairseq.nan_detector"), NanDetector(model):
        loss = model(random_tokens(dictionary, [6, 4]))[0].sum()
        loss.backward()
    assert "NaN detected in output of encoder.sentence_encoder.layers.1.fc1" in caplog.text


def test_diverging_training_reports_nan_or_inf_gradients(wikitext_bin, tmp_path):
    outputs, code = run_fairseq_steps(
        ("train", train_args(wikitext_bin, tmp_path, "tupe_r_tiny", 20, "--lr", 1e30)),
        check=False,
    )
    assert code != 0
    assert "gradients are Nan/Inf" in outputs[-1]
    assert "not subscriptable" not in outputs[-1]
