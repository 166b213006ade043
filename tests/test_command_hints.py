"""Refusals give the fix for the command at hand: fairseq-validate takes model options only through
--model-overrides, fairseq-train as flags, from_pretrained as keyword arguments."""

import pytest
import torch
from conftest import build_model

from tupe_plugin.models.checkpoint_guards import check_checkpoint
from tupe_plugin.user_input.command_hints import current_command, input_length_fix, model_setting

VALIDATE = ["/x/.venv/bin/fairseq-validate", "/x/.venv/lib/python3.11/site-packages/fairseq_cli/validate.py",
            "fairseq-eval-lm"]
TRAIN = ["/x/.venv/bin/fairseq-train", "/x/site-packages/fairseq_cli/train.py", "fairseq-hydra-train"]


@pytest.mark.parametrize("program", VALIDATE)
def test_validate_commands_are_told_to_use_model_overrides(program):
    assert current_command([program]) == "validate"
    assert model_setting("max_positions", 128, [program]) == "--model-overrides \"{'max_positions': 128}\""


@pytest.mark.parametrize("program", TRAIN)
def test_train_commands_are_told_the_flag(program):
    assert model_setting("max_positions", 128, [program]) == "--max-positions 128"


@pytest.mark.parametrize("argv", [["my_script.py"], ["-c"], []])
def test_python_is_told_every_way(argv):
    hint = model_setting("max_positions", 128, argv)
    assert "max_positions=128 (from_pretrained)" in hint and "--model-overrides" in hint


def test_input_length_fix_in_validate_names_tokens_per_sample_not_max_positions():
    fix = input_length_fix(64, ["fairseq-validate"])
    assert "--tokens-per-sample 64" in fix and "--max-positions" not in fix


@pytest.mark.parametrize("program, expected, unexpected", [
    ("fairseq-validate", "use --model-overrides \"{'max_positions': 32}\"", "--max-positions 32"),
    ("fairseq-train", "use --max-positions 32", "--model-overrides"),
])
def test_checkpoint_table_length_refusal_names_the_fix_of_the_running_command(
        monkeypatch, dictionary, program, expected, unexpected):
    saved = build_model("bert_a_tiny", dictionary, max_positions=32).state_dict()
    model = build_model("bert_a_tiny", dictionary, max_positions=64)
    monkeypatch.setattr("sys.argv", [program])
    with pytest.raises(ValueError) as error:
        check_checkpoint(model, saved, "")
    assert expected in str(error.value) and unexpected not in str(error.value)


@pytest.mark.parametrize("arch, program", [("bert_a_tiny", "fairseq-validate"),
                                           ("tupe_a_tiny", "fairseq-validate"),
                                           ("bert_a_tiny", "fairseq-train")])
def test_longer_input_refusal_names_the_fix_of_the_running_command(monkeypatch, dictionary, arch, program):
    model = build_model(arch, dictionary, max_positions=8).eval()
    monkeypatch.setattr("sys.argv", [program])
    with pytest.raises(ValueError) as error:
        model(torch.full((1, 12), 5, dtype=torch.long))
    message = str(error.value)
    if program == "fairseq-validate":
        assert "--tokens-per-sample 8 or less" in message and "--max-positions" not in message
    else:
        assert "raise --max-positions" in message


def test_a_string_setting_is_quoted_where_python_reads_it():
    assert model_setting("attention_backend", "triton", ["fairseq-validate"]) == \
        "--model-overrides \"{'attention_backend': 'triton'}\""
    assert model_setting("attention_backend", "triton", ["fairseq-train"]) == "--attention-backend triton"
    hint = model_setting("attention_backend", "triton", ["x.py"])
    assert "attention_backend='triton' (from_pretrained)" in hint


@pytest.mark.parametrize("program, expected, unexpected", [
    ("fairseq-validate", "pass --model-overrides \"{'attention_dropout': 0.0}\" (evaluation drops nothing "
     "anyway), or use --model-overrides \"{'attention_backend': 'triton'}\"", "--attention-dropout 0"),
    ("fairseq-eval-lm", "pass --model-overrides \"{'attention_dropout': 0.0}\"", "--attention-dropout 0"),
    ("fairseq-train", "pass --attention-dropout 0.0 (evaluation drops nothing anyway), or use "
     "--attention-backend triton", "--model-overrides"),
])
def test_the_flex_dropout_refusal_names_the_fix_of_the_running_command(monkeypatch, dictionary, program,
                                                                       expected, unexpected):
    """fairseq-validate takes no --attention-dropout ("unrecognized arguments"): it is told the override."""
    monkeypatch.setattr("sys.argv", [program])
    with pytest.raises(ValueError) as error:
        build_model("tupe_r_tiny", dictionary, attention_backend="flex", attention_dropout=0.1)
    assert expected in str(error.value) and unexpected not in str(error.value)
