"""Overrides of a plugin checkpoint's settings that could not take effect are refused, naming the override.

fairseq applies fairseq-validate's ``--model-overrides`` (and the ``arg_overrides`` of its loaders,
``from_pretrained``'s keyword arguments) to a checkpoint's config as it reads it: a key that is no setting
of the checkpoint (a typo) was set and never read, and a setting that only gave a tensor stored in the
checkpoint its starting value (FIRE's learned threshold, RoPE's frequencies) was undone without a word
when the weights loaded. Both are refused as the checkpoint is read, and so is a value a model flag does not
take (``{'max_positions': 'abc'}``, an ``attention_backend`` that does not exist), naming what it takes.
The settings an override changes, other than those meant to change at evaluation
(:data:`MAY_CHANGE_AT_EVALUATION`) and the loaders' own (``load_checkpoint_heads``, which
``from_pretrained`` sets, and the other flags that only initialise a new model), are handed to the check of
the weights (:func:`~tupe_plugin.models.checkpoint_guards.record_overrides`), which refuses them: naming a
tensor when the model has other tensors (``{'rotary': 'none'}`` on a RoPE model) instead of torch's
"Unexpected key(s) in state_dict", and otherwise because the same weights would compute other outputs
(``{'activation_fn': 'relu'}``), as fine-tuning refuses such a flag. An override is compared with the value
the checkpoint's model uses (:func:`settings_in_use`): for a setting its config leaves unset, the default the
architecture fills in, so an override giving that default loads and another is refused naming it.
"""

import argparse
import difflib
import math
from dataclasses import fields

from fairseq import checkpoint_utils
from fairseq.registry import REGISTRIES

from ..checkpoints.checkpoint_config import model_config
from ..encodings import registry
from ..encodings.encoding import flag_name
from ..encodings.position_config import BEFORE_RELEASED_FORMS
from ..models.checkpoint_guards import record_overrides
from ..models.model_flags import value_in_use
from ..user_input.command_hints import overrides_named
from ..user_input.user_errors import UserError
from .restore_architecture import NOT_CARRIED, model_flag_actions
from .scope import is_plugin_config

# A setting that only gives a tensor the checkpoint stores its starting value: the tensor's key ends with
# the suffix; the checkpoint's tensor replaces whatever the setting computes (each encoding declares its own).
STARTING_VALUES = registry.starting_values()

# The model settings an evaluation may change (the trained weights keep their meaning): the input lengths,
# dropout and layerdrop (off in evaluation), memory and the attention kernel among its choices, and the
# encodings' options declared so (RoPE's scaling for longer inputs).
MAY_CHANGE_AT_EVALUATION = (
    "dropout", "attention_dropout", "activation_dropout", "pooler_dropout", "encoder_layerdrop",
    "encoder_layers_to_keep", "max_positions", "checkpoint_activations", "offload_activations",
    "min_params_to_wrap", "attention_backend", *registry.evaluation_options(),
)

_fairseq_overwrite_args_by_name = checkpoint_utils.overwrite_args_by_name
_fairseq_load_checkpoint_to_cpu = checkpoint_utils.load_checkpoint_to_cpu

# What the checkpoint being read held before fairseq applied the overrides: its settings (and the model
# flags), the value its model uses for each overridden one, and those of them its config leaves unset.
_read = {}


class OverrideError(UserError, ValueError):
    """An override of a checkpoint's setting that could not take effect."""


def _settings(node):
    if isinstance(node, argparse.Namespace):
        return vars(node)
    return node if hasattr(node, "keys") else {}


def _chosen_settings(overrides):
    """The settings of a component the overrides choose (``bpe='sentencepiece'``: its
    ``sentencepiece_model``), which fairseq gives the checkpoint's config with it."""
    for group, name in overrides.items():
        dataclass = REGISTRIES.get(group, {}).get("dataclass_registry", {}).get(name) \
            if isinstance(name, str) else None
        if dataclass is not None:
            yield from (field.name for field in fields(dataclass))


def _taken(action):
    """What the model flag of argparse ``action`` takes, in words, or None when any text does."""
    if action.nargs == 0:
        return "True or False"
    if action.choices is not None:
        return "one of " + ", ".join(repr(choice) for choice in action.choices)
    if action.type is int:
        return "an integer"
    if action.type is not None:
        return "a finite number"
    return None


def _takes(action, value):
    if action.nargs == 0:
        return isinstance(value, bool)
    if action.choices is not None:
        return value in action.choices
    if action.type is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if action.type is not None:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return value is None or isinstance(value, str)


def check_values(overrides, actions):
    """Refuse an override whose value its model flag (argparse ``actions`` by dest) does not take."""
    for key, value in overrides.items():
        action = actions.get(key)
        if action is not None and not _takes(action, value):
            raise OverrideError(
                f"{overrides_named({key: value})}: {key!r} ({action.option_strings[0]}) takes "
                f"{_taken(action)}, not {value!r}: correct the value")


def settings_in_use(model):
    """{setting: the value a model built from the checkpoint's model config ``model`` uses}: those it records,
    and for those it leaves unset what the architecture fills in (as the checkpoint's: an option added since
    takes the value the checkpoint was trained with) or the model uses in place of None."""
    from ..models.tupe_roberta import base_architecture

    args = argparse.Namespace(**model)
    args.embed_init_applied = True  # a checkpoint's config: the model it describes was built
    base_architecture(args)
    return {setting: value_in_use(setting, value) for setting, value in vars(args).items()}


def overwrite_args_by_name(cfg, overrides):
    """fairseq's; for a plugin checkpoint, its settings and what the overridden ones held are kept first."""
    if is_plugin_config(cfg):
        actions = model_flag_actions()
        check_values(overrides, actions)
        flags = set(actions)
        known = set(cfg.keys()) | flags | set(_chosen_settings(overrides))
        for group in cfg.keys():
            known.update(_settings(cfg.get(group)))
        model = _settings(cfg.get("model"))
        in_use = settings_in_use(model)
        _read.update(known=known, flags=flags, saved={key: in_use.get(key) for key in overrides},
                     unset={key for key in overrides  # an option added since has its value as trained
                            if model.get(key) is None and key not in BEFORE_RELEASED_FORMS})
    _fairseq_overwrite_args_by_name(cfg, overrides)


def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
    """fairseq's loader; the overrides applied to a plugin checkpoint are checked against it."""
    _read.clear()
    state = _fairseq_load_checkpoint_to_cpu(path, arg_overrides, load_on_all_ranks)
    changed = check_overrides(path, arg_overrides, state["model"]) if arg_overrides and _read else {}
    record_overrides(model_config(state), changed)
    return state


def check_overrides(path, overrides, weights):
    """Refuse an unknown key or a learned setting among ``overrides`` of the checkpoint ``path``; return
    the model settings they change that the check of its weights is to name: {name: (how the checkpoint
    set it, in words; new)}."""
    for key, value in overrides.items():
        if key not in _read["known"]:
            close = difflib.get_close_matches(key, _read["known"], n=1)
            raise OverrideError(
                f"{overrides_named({key: value})}: {key!r} is no setting of {path}"
                f"{f' (did you mean {close[0]!r}?)' if close else ''}; it would be ignored: correct it or "
                "drop it")
    changed = {key: (_read["saved"].get(key), value) for key, value in overrides.items()
               if key in _read["flags"] and _read["saved"].get(key) != value}
    for key in changed.keys() & STARTING_VALUES.keys():
        _check_starting_value(path, key, changed[key], weights)
    return {key: (_trained(key, saved), value) for key, (saved, value) in changed.items()
            if key not in MAY_CHANGE_AT_EVALUATION and key not in NOT_CARRIED}


def _trained(key, saved):
    """How the checkpoint set ``key`` (its model uses ``saved``), for messages."""
    if key not in _read["unset"]:
        return f"{key} = {saved!r}"
    return f"{key} unset (so the default {saved!r})" if saved is not None else f"{key} unset"


def _check_starting_value(path, key, change, weights):
    suffix, why = STARTING_VALUES[key]
    tensor = next((name for name in weights if name.endswith(suffix)), None)
    if tensor is None:
        return
    saved, value = change
    now = f" = {weights[tensor].item():g} after training" if weights[tensor].numel() == 1 else ""
    raise OverrideError(
        f"{overrides_named({key: value})} cannot change {path}: {why}, {tensor}{now}; {flag_name(key)} "
        f"({saved}) only gave its starting value, which the checkpoint's weights replace: drop the override")


checkpoint_utils.overwrite_args_by_name = overwrite_args_by_name
checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
