"""Fine-tuning (and resuming) builds the architecture of the checkpoint it loads.

fairseq-train builds the model from its command line, then loads the ``--restore-file`` (or
``checkpoint_last.pt``) weights into it. A flag of the pre-training run that the fine-tuning command
does not repeat (``--rel-pos-max-distance``, ``--shaw-keys-only``, ``--activation-fn``, ...) silently
reverted to the preset's default, and the weights loaded anyway when no shape changed. Before the model
is built, :func:`carry_checkpoint_architecture` reads the checkpoint's ``cfg.model`` and

- carries every model setting the command line does not give (logged, one line);
- refuses a setting the command line gives with another value, naming the flag and both values,
  unless it is one that may change at fine-tuning (:data:`MAY_CHANGE_AT_FINE_TUNING`);
- refuses an ``--arch`` whose preset differs from the checkpoint's in any setting.

Settings that only initialise a new model (:data:`NOT_CARRIED`) are left alone: the checkpoint's
weights replace that initialisation.
"""

import argparse
import logging

from ..checkpoints.checkpoint_config import saved_model_config
from ..encodings import registry
from ..encodings.position_config import BEFORE_RELEASED_FORMS
from ..models.model_flags import SETTING_OF_FLAG, carry_setting, show_setting, value_in_use
from ..user_input.user_errors import UserError
from .missing_restore_file import checkpoint_to_restore
from .scope import is_plugin_arch

logger = logging.getLogger(__name__)

# Regularisation, pruning, memory and kernel flags and the classification-head settings: a fine-tuning
# may give them other values than pre-training (the model's weights keep their meaning). When the command
# does not give them they are carried like the rest. --max-positions may change too: a learned position
# table refuses another length by itself (checkpoint_guards), relative and sinusoidal encodings accept it.
# So may the encodings' options declared to (RoPE's scaling for longer inputs changes the angles, no weight).
MAY_CHANGE_AT_FINE_TUNING = (
    "dropout", "attention_dropout", "activation_dropout", "pooler_dropout", "pooler_activation_fn",
    "encoder_layerdrop", "encoder_layers_to_keep", "spectral_norm_classification_head",
    "max_positions", "checkpoint_activations", "offload_activations", "min_params_to_wrap",
    "attention_backend", *registry.evaluation_options(),
)

# Flags that initialise a new model or load the hub; the loaded weights replace what they do.
NOT_CARRIED = (
    "embed_init_path", "embed_init_dict", "embed_init_standardize", "embed_init_project",
    "load_checkpoint_heads", "allow_skipped_data",
    "init_from_checkpoint", "init_extra_positions", "init_untied_from_absolute",
)

# Recorded by the plugin in its checkpoints, not flags: carried, never given on the command line.
RECORDED = ("dictionary_fingerprint", "dictionary_size")

_MISSING = object()


class ArchitectureMismatchError(UserError, ValueError):
    """A fine-tuning command that would build another architecture than its checkpoint's."""


def model_flag_actions():
    """{dest: argparse action} of every model flag (RoBERTa's and the plugin's): its type and choices."""
    from ..models.tupe_roberta import TupeRobertaModel

    parser = argparse.ArgumentParser(add_help=False)
    TupeRobertaModel.add_args(parser)
    return {action.dest: action for action in parser._actions if action.option_strings}


def model_flags():
    """{option string: dest} of every model flag (RoBERTa's and the plugin's)."""
    return {option: dest for dest, action in model_flag_actions().items() for option in action.option_strings}


def explicit_settings(argv, flags=None):
    """The model settings the command line ``argv`` gives explicitly (fairseq parses no abbreviation)."""
    flags = model_flags() if flags is None else flags
    given = set()
    for token in argv:
        option = token.split("=", 1)[0]
        if option in flags:
            given.add(SETTING_OF_FLAG.get(flags[option], flags[option]))
    return given


def architecture_settings(flags=None):
    flags = model_flags() if flags is None else flags
    dests = {SETTING_OF_FLAG.get(dest, dest) for dest in flags.values()}
    return sorted(dests - set(NOT_CARRIED))


def _get(config, name):
    if config is None:
        return _MISSING
    if isinstance(config, dict):
        return config.get(name, _MISSING)
    return getattr(config, name, _MISSING)


def _recorded(config, name):
    """The value ``config`` records for ``name``, or None."""
    value = _get(config, name)
    return None if value is _MISSING else value


def _same(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return float(a) == float(b)
    return a == b


def _show(setting, value):
    flag = "--" + setting.replace("_", "-")
    shown = show_setting(setting, value)
    if shown is not None:
        return shown
    if value is True:
        return flag
    if value is False or value is None:
        return f"no {flag}"
    return f"{flag} {value}"


def carry_checkpoint_architecture(model_cfg, saved, path, argv):
    """Make ``model_cfg`` (the command line's model config, preset applied) the architecture of ``saved``.

    ``saved`` is the checkpoint's model config, ``path`` its file (for messages), ``argv`` the command
    line. Returns the carried settings {name: value}; raises :class:`ArchitectureMismatchError`.
    """
    saved_arch = _get(saved, "arch")
    if not is_plugin_arch(saved_arch) or not is_plugin_arch(_get(model_cfg, "arch")):
        return {}  # another model family: fairseq's own checks apply
    flags = model_flags()
    explicit = explicit_settings(argv, flags)
    arch = _get(model_cfg, "arch")
    refused, carried = [], {}
    for setting in architecture_settings(flags) + list(RECORDED):
        wanted, pretrained = _get(model_cfg, setting), _get(saved, setting)
        if pretrained is _MISSING and setting in BEFORE_RELEASED_FORMS:  # saved before the option existed
            pretrained = registry.value_as_trained(setting, lambda name: _recorded(saved, name))
        if pretrained is _MISSING or (wanted is not _MISSING and _same(value_in_use(setting, wanted),
                                                                         value_in_use(setting, pretrained))):
            continue
        if setting in explicit:
            if setting not in MAY_CHANGE_AT_FINE_TUNING:
                refused.append(f"{_show(setting, wanted)} is given but the checkpoint has "
                               f"{_show(setting, pretrained)}")
            continue
        preset_decides = wanted not in (_MISSING, None) and setting not in RECORDED \
            and setting not in MAY_CHANGE_AT_FINE_TUNING
        if arch != saved_arch and preset_decides:
            refused.append(f"--arch {arch} gives {_show(setting, wanted)} but the checkpoint "
                           f"(--arch {saved_arch}) has {_show(setting, pretrained)}")
            continue
        carried[setting] = pretrained
    if refused:
        raise ArchitectureMismatchError(
            f"{path} does not fit this command: {'; '.join(refused)}. The weights would load into another "
            f"architecture: fine-tune with --arch {saved_arch} and without these flags (settings not given "
            "are carried from the checkpoint; only dropout, layerdrop, pooler, --max-positions and "
            "--rotary-scaling flags may differ), or, to swap the position encoding and continue "
            f"pre-training, start a new run with --init-from-checkpoint {path} instead of --restore-file"
        )
    for setting, value in carried.items():
        carry_setting(model_cfg, setting, value)
    shown = [_show(s, v) for s, v in carried.items() if s not in RECORDED]
    if shown:
        logger.info(f"model settings carried from {path} (not given on the command line): {', '.join(shown)}")
    return carried


def prepare_training(cfg, argv):
    """Before fairseq-train builds the model: refuse a missing --restore-file, carry the checkpoint's
    architecture into ``cfg.model`` (``argv``: the command line, for the settings it gives)."""
    path = checkpoint_to_restore(cfg.checkpoint, cfg.checkpoint.checkpoint_suffix)
    if path is None or not isinstance(cfg.model, argparse.Namespace):
        return {}
    return carry_checkpoint_architecture(cfg.model, saved_model_config(path), path, argv)

