"""Overrides of a checkpoint's settings (fairseq-validate's --model-overrides, the arg_overrides of
fairseq's loaders) that cannot take effect are refused naming the override: a key that is no setting, a
value its flag does not take, a setting whose value a learned tensor of the checkpoint holds, one that
changes the model's tensors or what the trained weights compute. Those meant to change at evaluation load."""

import argparse
import re

import pytest
import torch
from cli import run_fairseq
from conftest import _Task, test_data
from fairseq import checkpoint_utils
from fairseq.data import Dictionary

from tupe_plugin.fairseq_fixes.model_overrides_syntax import model_overrides_text
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
    ("bert_kerple", {"kerple_param": "clamped"}, "kerple_param = 'softplus'",
     "relative_bias.raw_r1 has no place"),
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
    ("{'activation_fn': 'relu'}", "error: --model-overrides \"{'activation_fn': 'relu'}\" cannot apply to "
     "this checkpoint, trained with activation_fn = 'gelu'"),
    ("{'max_positions': 'abc'}", "error: --model-overrides \"{'max_positions': 'abc'}\": 'max_positions' "
     "(--max-positions) takes an integer"),
    ("{'arch': 'bert_a_tiny'}", "error: --model-overrides \"{'arch': 'bert_a_tiny'}\": "),
])
def test_fairseq_validate_names_the_override_that_cannot_apply_in_one_line(override, message):
    arch = "bert_lrope" if "rotary" in override or "activation" in override else "bert_fire"
    proc = run_fairseq("validate", FIXTURE, "--user-dir", "tupe_plugin", "--path", f"{FIXTURE}/{arch}.pt",
                       "--task", "masked_lm", "--batch-size", 2, "--cpu", "--model-overrides", override,
                       check=False)
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines()[-1].startswith(message), proc.stdout[-2000:]
    assert "Traceback" not in proc.stdout and "Unexpected key(s)" not in proc.stdout


@pytest.fixture
def sandwich_checkpoint(tmp_path):
    """A Sandwich checkpoint (made here from the FIRE fixture's config, saved before --sandwich-frequencies:
    zero-based)."""
    state = torch.load(f"{FIXTURE}/bert_fire.pt", weights_only=False)
    args = argparse.Namespace(**{key: value for key, value in vars(state["cfg"]["model"]).items()
                                 if not key.startswith("fire_")})
    args.arch, args.rel_pos = "bert_sandwich_tiny", "sandwich"
    dictionary = Dictionary.load(f"{FIXTURE}/dict.txt")
    dictionary.add_symbol("<mask>")
    state["model"] = TupeRobertaModel.build_model(args, _Task(dictionary, args.max_positions)).state_dict()
    state["cfg"]["model"] = args
    torch.save(state, tmp_path / "bert_sandwich.pt")
    return str(tmp_path / "bert_sandwich.pt")


def test_an_override_of_sandwichs_frequencies_is_refused_as_the_checkpoint_stores_them(sandwich_checkpoint):
    """The checkpoint stores its frequencies: another --sandwich-frequencies would be undone by its
    weights."""
    with pytest.raises(OverrideError, match="Sandwich's frequencies are stored in the checkpoint, "
                       ".*relative_bias.sinusoid.frequencies"):
        checkpoint_utils.load_model_ensemble_and_task(
            [sandwich_checkpoint], arg_overrides={"data": FIXTURE, "sandwich_frequencies": "one-based"})


def test_an_override_of_sandwichs_scale_is_refused_as_it_changes_what_the_weights_compute(
        sandwich_checkpoint):
    with pytest.raises(CheckpointMismatchError, match=r"arg_overrides \{'sandwich_scale': 5.0\} cannot "
                       r"apply to this checkpoint, trained with sandwich_scale = 1.0: the same weights would "
                       "compute other outputs"):
        checkpoint_utils.load_model_ensemble_and_task(
            [sandwich_checkpoint], arg_overrides={"data": FIXTURE, "sandwich_scale": 5.0})


@pytest.mark.parametrize("arch, override, trained", [
    ("bert_alibi_asym", {"activation_fn": "relu"}, "activation_fn = 'gelu'"),
    ("bert_alibi_asym", {"layer_norm_eps": 0.5}, "layer_norm_eps unset (so the default 1e-05)"),
    ("bert_kerple", {"rel_pos": "kerple-power"}, "rel_pos = 'kerple-log'"),
    # a checkpoint saved before --deberta-p2c was trained with the paper's form
    ("deberta_emd", {"deberta_p2c": "released"}, "deberta_p2c = 'paper'"),
    ("bert_lrope", {"pooler_activation_fn": "relu"}, "pooler_activation_fn = 'tanh'"),
])
def test_an_override_that_changes_what_the_trained_weights_compute_is_refused_naming_it(arch, override,
                                                                                         trained):
    """Tensors of the same shapes would load: the model would compute other outputs than those trained, as
    the same flag at fine-tuning would (refused there too)."""
    with pytest.raises(CheckpointMismatchError) as error:
        load(arch, **override)
    assert str(error.value).startswith(f"arg_overrides {override!r} cannot apply to this checkpoint, trained "
                                       f"with {trained}: the same weights would compute other outputs")
    assert str(error.value).endswith("drop the override")


def test_an_override_giving_the_default_of_a_setting_the_checkpoint_left_unset_loads():
    """The checkpoint's config holds layer_norm_eps None: its LayerNorms use fairseq's epsilon, 1e-5."""
    (model,), _, _ = load("bert_alibi_asym", layer_norm_eps=1e-5)
    epsilons = {module.eps for module in model.modules() if isinstance(module, torch.nn.LayerNorm)}
    assert epsilons == {1e-5}


def test_an_override_giving_the_default_of_an_option_the_checkpoint_predates_loads():
    """deberta_emd.pt was saved before --deberta-table-norm: the architecture fills in False."""
    (model,), _, _ = load("deberta_emd", deberta_table_norm=False)
    assert model.args.deberta_table_norm is False


def test_an_override_of_an_option_the_checkpoint_predates_is_refused_naming_the_default_it_used():
    with pytest.raises(CheckpointMismatchError, match=r"^arg_overrides \{'deberta_table_norm': True\} cannot "
                       r"apply to this checkpoint, trained with deberta_table_norm unset \(so the default "
                       r"False\): the model built with it has other tensors \(its .*disentangled.norm.bias "
                       "is not in the checkpoint"):
        load("deberta_emd", deberta_table_norm=True)


@pytest.mark.parametrize("override", [
    dict(attention_backend="math", dropout=0.3, attention_dropout=0.2, activation_dropout=0.1),
    dict(encoder_layerdrop=0.2, max_positions=256),
])
def test_overrides_meant_to_change_at_evaluation_still_load(override):
    (model,), _, _ = load("bert_alibi_asym", **override)
    assert all(getattr(model.args, key) == value for key, value in override.items())


@pytest.mark.parametrize("override, takes", [
    ({"max_positions": "abc"}, r"'max_positions' \(--max-positions\) takes an integer, not 'abc'"),
    ({"activation_fn": "bogus"},
     r"'activation_fn' \(--activation-fn\) takes one of 'relu', 'gelu', .*, not 'bogus'"),
    ({"attention_backend": "bogus"},
     r"'attention_backend' \(--attention-backend\) takes one of 'auto', .*'math', .*, not 'bogus'"),
    ({"fire_signed": "yes"}, r"'fire_signed' \(--fire-signed\) takes True or False, not 'yes'"),
    ({"rotary_scaling_factor": float("nan")},
     r"'rotary_scaling_factor' \(--rotary-scaling-factor\) takes a finite number, not nan"),
    ({"encoder_layers": 2.5}, r"'encoder_layers' \(--encoder-layers\) takes an integer, not 2.5"),
])
def test_an_override_value_its_flag_does_not_take_is_refused_naming_what_it_takes(override, takes):
    with pytest.raises(OverrideError, match=r"^arg_overrides \{.*\}: " + takes + ": correct the value$"):
        load("bert_fire", **override)


@pytest.mark.parametrize("text, problem", [
    ("{'max_positions': }", "is no Python dict"),
    ("{'max_positions': 128", "is no Python dict"),
    ("{'max_positions': max}", "is no Python dict (it holds more than literal values)"),
    ("[('max_positions', 128)]", "is a list, not a dict of settings by name"),
])
def test_model_overrides_text_that_is_no_dict_is_refused_as_the_flag_is_read(text, problem):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(problem)):
        model_overrides_text(text)


def test_model_overrides_text_that_is_a_dict_is_kept_as_text():
    assert model_overrides_text("{'max_positions': 128}") == "{'max_positions': 128}"


def test_fairseq_validate_refuses_model_overrides_that_is_no_dict_in_argparses_line():
    proc = run_fairseq("validate", FIXTURE, "--user-dir", "tupe_plugin", "--path", f"{FIXTURE}/bert_fire.pt",
                       "--task", "masked_lm", "--batch-size", 2, "--cpu", "--model-overrides",
                       "{'max_positions': }", check=False)
    assert proc.returncode == 2
    assert proc.stdout.strip().splitlines()[-1].startswith(
        "fairseq-validate: error: argument --model-overrides: \"{'max_positions': }\" is no Python dict")
    assert "Traceback" not in proc.stdout


@pytest.mark.parametrize("key", ["arch", "_name"])
def test_an_override_of_the_architecture_is_refused_as_it_would_be_ignored(key):
    with pytest.raises(OverrideError, match=rf"^arg_overrides \{{'{key}': 'bert_a_tiny'\}}: .*tupe_r.pt is a "
                       r"tupe_r_tiny checkpoint and an override cannot change its architecture .*it would be "
                       r"ignored: drop it"):
        checkpoint_utils.load_model_ensemble_and_task([f"{FIXTURE}/tupe_r.pt"],
                                                      arg_overrides={"data": FIXTURE, key: "bert_a_tiny"})


def test_an_override_naming_the_checkpoints_own_architecture_loads():
    (model,), _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [f"{FIXTURE}/tupe_r.pt"], arg_overrides={"data": FIXTURE, "arch": "tupe_r_tiny"})
    assert model.args.untied_pos == "tupe"
