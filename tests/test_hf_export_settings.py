"""What an export's config.json keeps of the checkpoint: the model's settings (what the model's code reads and
tupe-convert-hf rebuilds the plugin model from) and the pre-training's task settings, never a path of the
machine that exported it nor the training's setup; a checkpoint converted back records the task settings
the export kept."""
# the fixtures imported from the other test modules are the tests' arguments
# ruff: noqa: F811

import json

import pytest
import torch
from test_hf_export import MASKED_LM, make_checkpoint, whole_data_bin  # noqa: F401

from tupe_plugin.conversion.hf import convert
from tupe_plugin.conversion.hf_export import export
from tupe_plugin.policies.restore_architecture import model_flag_actions

TRAINING = ["--sample-break-mode", "complete", "--mask-prob", "0.2"]


def strings(value):
    """Every string in a JSON value."""
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in (key, *strings(item))]
    if isinstance(value, list):
        return [text for item in value for text in strings(item)]
    return [value] if isinstance(value, str) else []


@pytest.mark.parametrize("arch, remote_code", [("bert_a_tiny", False), ("deberta_tiny", False),
                                               ("tupe_r_tiny", False), ("bert_a_tiny", True)],
                         ids=["RoBERTa", "DeBERTa-v2", "remote code (TUPE-R)", "--remote-code"])
def test_config_json_holds_the_models_settings_and_no_path_of_the_machine(whole_data_bin, tmp_path, arch,
                                                                          remote_code):
    setup = ["--save-dir", str(tmp_path / "run"), "--tensorboard-logdir", str(tmp_path / "tb")]
    checkpoint = make_checkpoint(whole_data_bin, tmp_path / "model.pt", arch, setup, heads=False,
                                 task=MASKED_LM + TRAINING)
    saved = vars(torch.load(checkpoint, weights_only=False)["cfg"]["model"])
    assert {"data", "save_dir", "tensorboard_logdir", "plasma_path", "lr"} <= set(saved)
    export(str(checkpoint), str(whole_data_bin), str(tmp_path / "out"), remote_code=remote_code)
    text = (tmp_path / "out" / "config.json").read_text()
    config = json.loads(text)
    model = config["fairseq_model_args"]
    assert set(model) <= {"arch", "dictionary_fingerprint", "dictionary_size", *model_flag_actions(),
                          "adaptive_input", "embed_init_applied", "encoder_learned_pos",
                          "init_from_checkpoint_applied", "max_source_positions", "no_scale_embedding",
                          "no_token_positional_embeddings"}
    assert model["arch"] == arch and model["max_positions"] == 96
    assert len(model) < 100
    assert config["fairseq_task_args"]["sample_break_mode"] == "complete"
    assert "data" not in config["fairseq_task_args"]
    assert not [value for value in strings(config) if str(tmp_path) in value or value.startswith("/")]
    assert str(tmp_path) not in text


@pytest.mark.parametrize("arch", ["bert_a_tiny", "tupe_r_tiny"])
def test_a_checkpoint_converted_back_records_the_pre_trainings_task_settings(whole_data_bin, tmp_path, arch):
    checkpoint = make_checkpoint(whole_data_bin, tmp_path / "model.pt", arch, [], heads=False,
                                 task=MASKED_LM + TRAINING)
    export(str(checkpoint), str(whole_data_bin), str(tmp_path / "out"))
    convert(str(tmp_path / "out"), str(tmp_path / "back"))
    original = torch.load(checkpoint, weights_only=False)["cfg"]
    back = torch.load(tmp_path / "back" / "model.pt", weights_only=False)["cfg"]
    for key in ("sample_break_mode", "mask_prob", "tokens_per_sample", "leave_unmasked_prob"):
        assert back["task"][key] == original["task"][key], key
    assert back["task"]["sample_break_mode"] == "complete" and back["task"]["mask_prob"] == 0.2
