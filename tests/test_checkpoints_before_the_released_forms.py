"""Checkpoints saved before KERPLE, FIRE, Sandwich and DeBERTa defaulted to their authors' released forms
record none of the options that choose the form: they are rebuilt with the form they were trained with,
by fairseq-validate and the hub as by a fine-tuning's --restore-file, while new models take the released
forms and record them."""

import argparse

import pytest
import torch
from conftest import PRESETS, build_model, preset_encodings, test_data
from fairseq import checkpoint_utils
from fairseq.models import ARCH_CONFIG_REGISTRY
from tupe_plugin.checkpoints.checkpoint_config import saved_model_config
from tupe_plugin.encodings import registry
from tupe_plugin.encodings.position_config import BEFORE_RELEASED_FORMS, DEFAULTS
from tupe_plugin.policies.restore_architecture import carry_checkpoint_architecture

FIXTURE = test_data("checkpoints")
EARLIER_FORMS = {
    "bert_kerple": {"kerple_param": "softplus"},
    "bert_fire": {"fire_normaliser": "length"},
    "deberta_emd": {"deberta_p2c": "paper", "deberta_rel_proj_bias": "none"},
}


def test_the_fixtures_record_none_of_the_options_that_choose_the_form():
    for name in EARLIER_FORMS:
        saved = saved_model_config(f"{FIXTURE}/{name}.pt")
        assert not any(hasattr(saved, flag) for flag in BEFORE_RELEASED_FORMS)


@pytest.mark.parametrize("name", sorted(EARLIER_FORMS))
def test_a_checkpoint_saved_before_the_options_is_rebuilt_with_its_earlier_form(name):
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [f"{FIXTURE}/{name}.pt"], arg_overrides={"data": FIXTURE}, strict=True)
    config = models[0].encoder.sentence_encoder.config
    for flag, value in EARLIER_FORMS[name].items():
        assert getattr(config, flag) == value


@pytest.mark.parametrize("name", sorted(EARLIER_FORMS))
def test_a_fine_tuning_restore_of_such_a_checkpoint_carries_its_earlier_form(name):
    path = f"{FIXTURE}/{name}.pt"
    saved = saved_model_config(path)
    model_cfg = argparse.Namespace(arch=saved.arch)
    ARCH_CONFIG_REGISTRY[saved.arch](model_cfg)
    carried = carry_checkpoint_architecture(model_cfg, saved, path, argv=["--arch", saved.arch])
    for flag, value in EARLIER_FORMS[name].items():
        assert carried[flag] == value and getattr(model_cfg, flag) == value


# every preset that uses an encoding with an option of an earlier form
WITH_EARLIER_FORMS = {registry.owner(name) for name in BEFORE_RELEASED_FORMS}
WITH_RELEASED_FORMS = [preset for preset in PRESETS if WITH_EARLIER_FORMS & set(preset_encodings(preset))]


@pytest.mark.parametrize("preset", WITH_RELEASED_FORMS)
def test_a_new_model_takes_the_released_forms_and_records_them(preset, dictionary):
    model = build_model(f"{preset}_tiny", dictionary)
    for flag in BEFORE_RELEASED_FORMS:
        assert getattr(model.args, flag) == DEFAULTS[flag]


def test_a_checkpoint_that_records_its_form_is_rebuilt_with_it(dictionary):
    """A config that has built a model before and records --kerple-param keeps it."""
    trained = build_model("bert_kerple_tiny", dictionary)
    assert trained.args.embed_init_applied and trained.args.kerple_param == "clamped"
    rebuilt = build_model("bert_kerple_tiny", dictionary, **{k: v for k, v in vars(trained.args).items()
                                                             if k not in ("arch", "max_positions")})
    rebuilt.load_state_dict(trained.state_dict())
    assert rebuilt.encoder.sentence_encoder.config.kerple_clamped
    assert torch.equal(rebuilt.encoder.sentence_encoder.positional_term.relative_bias.r1,
                       trained.encoder.sentence_encoder.positional_term.relative_bias.r1)


def test_a_saved_sandwich_config_without_the_option_is_rebuilt_with_zero_based_frequencies(dictionary):
    model = build_model("bert_sandwich_tiny", dictionary, embed_init_applied=True)
    assert model.encoder.sentence_encoder.config.sandwich_frequencies == "zero-based"
