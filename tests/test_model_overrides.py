"""Overrides of a checkpoint's settings (fairseq-validate's --model-overrides, the arg_overrides of
fairseq's loaders) that cannot take effect are refused naming the override: a key that is no setting, a
setting whose value a learned tensor of the checkpoint holds, one that changes the model's tensors."""

import argparse

import pytest
import torch
from cli import run_fairseq
from conftest import _Task, test_data
from fairseq import checkpoint_utils
from fairseq.data import Dictionary

from tupe_plugin.models import TupeRobertaModel
from tupe_plugin.models.checkpoint_guards import CheckpointMismatchError
from tupe_plugin.policies.model_overrides import OverrideError

FIXTURE = test_data("checkpoints")


def load(arch, **overrides):
    return checkpoint_utils.load_model_ensemble_and_task([f"{FIXTURE}/{arch}.pt"],
                                                         arg_overrides={"data": FIXTURE, **overrides})


def test_an_override_that_is_no_setting_is_refused_naming_the_closest_setting():
    with pytest.raises(OverrideError, match=r"arg_overrides \{'fire_treshold': 64.0\}: 'fire_treshold' is no "
                       r"setting of .*bert_fire.pt \(did you mean 'fire_threshold'\?\)"):
        load("bert_fire", fire_treshold=64.0)


@pytest.mark.parametrize("arch, override, learned", [
    ("bert_fire", {"fire_threshold": 64.0}, "FIRE's threshold L is learned, .*relative_bias.threshold = "),
    ("bert_lrope", {"rotary_base": 500.0},
     "RoPE's frequencies are stored in the checkpoint, .*rotary.sinusoid.frequencies"),
])
def test_an_override_of_a_starting_value_is_refused_naming_the_learned_tensor(arch, override, learned):
    with pytest.raises(OverrideError, match=f"cannot change .*{arch}.pt: {learned}.* only gave its starting "
                       "value, which the checkpoint's weights replace"):
        load(arch, **override)


@pytest.mark.parametrize("arch, override, trained, tensor", [
    ("bert_lrope", {"rotary": "none"}, "rotary = 'learnable'", "sinusoid.frequencies has no place in it"),
    ("bert_a_lsin_rpe", {"abs_pos": "none"}, "abs_pos = 'learned'", "embed_positions.weight has no place"),
    ("bert_fire", {"rel_pos": "alibi"}, "rel_pos = 'fire'", "relative_bias.log_c has no place in it"),
    ("bert_fire", {"fire_hidden": 8}, "fire_hidden = 32", "mlp.0.bias is (8,) but (32,) in the checkpoint"),
    # a checkpoint saved before --kerple-param was trained with the softplus form
    ("bert_kerple", {"kerple_param": "clamped"}, "kerple_param = 'softplus'", "relative_bias.raw_r1 has no place"),
])
def test_an_override_that_changes_the_model_tensors_is_refused_naming_it_and_a_tensor(arch, override, trained,
                                                                                       tensor):
    with pytest.raises(CheckpointMismatchError) as error:
        load(arch, **override)
    message = str(error.value)
    assert f"arg_overrides {override!r} cannot apply to this checkpoint, trained with {trained}" in message
    assert tensor in message


def test_the_command_line_settings_and_overrides_that_take_effect_still_load():
    """fairseq-validate hands the settings its command line gives along with --model-overrides."""
    (model,), _, _ = load("bert_lrope", max_positions=256, rotary_scaling="linear", rotary_scaling_factor=4.0,
                          rotary_base=10000.0, task="masked_lm", batch_size=4, cpu=True, tokens_per_sample=64,
                          path="checkpoint.pt", user_dir="tupe_plugin", valid_subset="valid",
                          model_overrides="{'max_positions': 256}")
    assert model.encoder.sentence_encoder.positional_term.rotary.scaling == "linear"


@pytest.mark.parametrize("override, message", [
    ("{'rotary': 'none'}", "error: --model-overrides \"{'rotary': 'none'}\" cannot apply to this checkpoint"),
    ("{'fire_treshold': 64.0}", "error: --model-overrides \"{'fire_treshold': 64.0}\": 'fire_treshold' is no "
     "setting of"),
])
def test_fairseq_validate_names_the_override_that_cannot_apply_in_one_line(override, message):
    arch = "bert_lrope" if "rotary" in override else "bert_fire"
    proc = run_fairseq("validate", FIXTURE, "--user-dir", "tupe_plugin", "--path", f"{FIXTURE}/{arch}.pt",
                       "--task", "masked_lm", "--batch-size", 2, "--cpu", "--model-overrides", override,
                       check=False)
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines()[-1].startswith(message), proc.stdout[-2000:]
    assert "Traceback" not in proc.stdout and "Unexpected key(s)" not in proc.stdout


def test_an_override_of_sandwichs_frequencies_is_refused_as_the_checkpoint_stores_them(tmp_path):
    """A Sandwich checkpoint (made here from the FIRE fixture's config, saved before --sandwich-frequencies:
    zero-based) stores its frequencies: another --sandwich-frequencies would be undone by its weights."""
    state = torch.load(f"{FIXTURE}/bert_fire.pt", weights_only=False)
    args = argparse.Namespace(**{key: value for key, value in vars(state["cfg"]["model"]).items()
                                 if not key.startswith("fire_")})
    args.arch, args.rel_pos = "bert_sandwich_tiny", "sandwich"
    dictionary = Dictionary.load(f"{FIXTURE}/dict.txt")
    dictionary.add_symbol("<mask>")
    state["model"] = TupeRobertaModel.build_model(args, _Task(dictionary, args.max_positions)).state_dict()
    state["cfg"]["model"] = args
    torch.save(state, tmp_path / "bert_sandwich.pt")
    with pytest.raises(OverrideError, match="Sandwich's frequencies are stored in the checkpoint, "
                       ".*relative_bias.sinusoid.frequencies"):
        checkpoint_utils.load_model_ensemble_and_task(
            [str(tmp_path / "bert_sandwich.pt")], arg_overrides={"data": FIXTURE,
                                                                "sandwich_frequencies": "one-based"})
