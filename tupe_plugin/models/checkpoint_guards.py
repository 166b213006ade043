"""Refuse, with a message a user can act on, a checkpoint whose weights do not fit the model being built.

Every check a checkpoint passes before its weights are loaded into a plugin model lives here:
learned position tables of another length, the released [CLS] semantics, U^Q/U^K biases, the
vocabulary, the architecture, and overrides of its trained settings (``--model-overrides``). fairseq wraps
any ``load_state_dict`` failure of ``--restore-file`` into "please ensure that the
architectures match", with torch's list of size mismatches underneath. Fine-tuning from a masked-LM
checkpoint goes wrong in two ways that deserve their own words: a task prepared with another dictionary
than the pre-training one (embedding rows differ), and an ``--arch`` other than the pre-training one.
"""

import hashlib

from tupe_plugin.user_input.command_hints import model_setting, overrides_named
from ..user_input.user_errors import UserError

HEAD_PREFIXES = ("classification_heads.", "span_heads.")

# The model settings that overrides changed in the checkpoint config read last ({name: (how the checkpoint
# set it, in words; new)}), by id of that config, which the model is built from
# (tupe_plugin.policies.model_overrides records them).
_overridden = {}


class CheckpointMismatchError(UserError, ValueError):
    """A checkpoint whose weights do not fit the model being built."""


class DictionaryMismatchError(UserError, ValueError):
    """A dictionary of the checkpoint's size whose symbols or order differ from the checkpoint's."""


def dictionary_fingerprint(dictionary):
    """A short hash of the dictionary's symbols in id order (the plugin records it in ``cfg.model``)."""
    return hashlib.sha256("\n".join(dictionary.symbols).encode("utf-8")).hexdigest()[:16]


def check_dictionary_fingerprint(args, dictionary):
    """Record the fingerprint of ``dictionary`` in ``args`` (saved in every checkpoint's ``cfg.model``);
    refuse a dictionary of the same size whose fingerprint differs from the one already recorded.

    A size difference is left to :func:`check_checkpoint_matches`, which names the vocabulary sizes.
    """
    fingerprint = dictionary_fingerprint(dictionary)
    recorded = getattr(args, "dictionary_fingerprint", None)
    recorded_size = getattr(args, "dictionary_size", None)
    if recorded is not None and recorded != fingerprint and recorded_size in (None, len(dictionary)):
        raise DictionaryMismatchError(
            f"the data's dictionary ({len(dictionary)} symbols, fingerprint {fingerprint}) is not the one "
            f"the checkpoint was trained with (fingerprint {recorded}): same size, other symbols or another "
            "order, so token ids would silently mean other words; binarize the data against the "
            "pre-training dict.txt (fairseq-preprocess --srcdict PRETRAIN-DATA/dict.txt; "
            "tupe-prepare-glue / tupe-prepare-squad --dict PRETRAIN-DATA/dict.txt)"
        )
    args.dictionary_fingerprint = fingerprint
    args.dictionary_size = len(dictionary)


def record_overrides(model_cfg, changed):
    """Remember the model settings ``changed`` by overrides in the checkpoint config ``model_cfg`` just read,
    forgetting those of any earlier checkpoint."""
    _overridden.clear()
    if changed:
        _overridden[id(model_cfg)] = changed


def check_checkpoint(model, saved_state, prefix):
    """Raise ``ValueError`` naming the flag to change when ``saved_state`` cannot load into ``model``.

    Runs before fairseq's upgrades, on the raw checkpoint weights (``prefix`` = ``name + "."``).
    """
    own_state = model.state_dict()
    config = model.encoder.sentence_encoder.config
    _check_position_table_lengths(config, own_state, saved_state, prefix)
    _check_untied_projection_bias(own_state, saved_state, prefix)
    _check_overridden_settings(_overridden.get(id(model.args)), own_state, saved_state, prefix)


def _check_position_table_lengths(config, own_state, saved_state, prefix):
    for key, table in own_state.items():
        saved = saved_state.get(prefix + key)
        if not key.endswith("embed_positions.weight") or saved is None \
                or saved.shape[1:] != table.shape[1:] or saved.size(0) == table.size(0):
            continue
        extra_rows = table.size(0) - config.max_positions
        if saved.size(0) == table.size(0) + 1 and not config.release:
            raise CheckpointMismatchError(
                f"the checkpoint's position table {key} has one row more than the model's: "
                "it keeps the authors' released semantics (scripts/convert_official_tupe.py); "
                "build the model with --cls-reset release --untied-proj-bias"
            )
        raise CheckpointMismatchError(
            f"the checkpoint's learned position table {key} has "
            f"{saved.size(0) - extra_rows} positions but the model is built for "
            f"--max-positions {config.max_positions}; a learned table cannot change "
            f"length: use {model_setting('max_positions', saved.size(0) - extra_rows)} (architectures "
            "with sinusoidal, T5 or Shaw positions, or none, accept longer inputs)"
        )


def _check_untied_projection_bias(own_state, saved_state, prefix):
    for key in (k for k in own_state if k.endswith("untied_position.q_proj.weight")):
        bias = key[: -len("weight")] + "bias"
        saved_bias = prefix + bias in saved_state
        if prefix + key in saved_state and saved_bias != (bias in own_state):
            raise CheckpointMismatchError(
                f"the checkpoint's untied projections U^Q/U^K have {'a' if saved_bias else 'no'} "
                f"bias ({bias}): build the model {'with' if saved_bias else 'without'} "
                "--untied-proj-bias"
            )


def _check_overridden_settings(changed, own_state, saved_state, prefix):
    """An override of a trained model's setting is refused naming it: with a tensor when it gives the model
    other tensors than the checkpoint's, otherwise because the same weights would compute other outputs."""
    if not changed:
        return
    trained = ", ".join(was for was, _ in changed.values())
    overrides = overrides_named({key: new for key, (_, new) in changed.items()})
    own = {key: tuple(value.shape) for key, value in own_state.items() if not key.startswith(HEAD_PREFIXES)}
    saved = {key[len(prefix):]: tuple(value.shape) for key, value in saved_state.items()
             if key.startswith(prefix) and not key[len(prefix):].startswith(HEAD_PREFIXES)}
    differences = [f"the checkpoint's {key} has no place in it" for key in sorted(saved.keys() - own.keys())]
    differences += [f"its {key} is not in the checkpoint" for key in sorted(own.keys() - saved.keys())]
    differences += [f"its {key} is {own[key]} but {saved[key]} in the checkpoint"
                    for key in sorted(own.keys() & saved.keys()) if own[key] != saved[key]]
    if not differences:
        raise CheckpointMismatchError(
            f"{overrides} cannot apply to this checkpoint, trained with {trained}: the same weights would "
            "compute other outputs than those trained; a trained model's settings are fixed (at evaluation "
            "only its lengths, RoPE's scaling, dropout, layerdrop and the attention backend may change): "
            "drop the override")
    raise CheckpointMismatchError(
        f"{overrides} cannot apply to this checkpoint, trained with {trained}: the model built with it has "
        f"other tensors ({differences[0]}"
        f"{f', and {len(differences) - 1} more' if len(differences) > 1 else ''}); a trained model's "
        "encoding and sizes are fixed: drop the override (to train another encoding from these weights: "
        "fairseq-train --init-from-checkpoint)"
    )


def check_checkpoint_matches(model_state, saved_state, prefix, arch):
    """Raise ``ValueError`` when ``saved_state`` lacks weights of ``model_state`` or has other shapes.

    Heads are left out: fine-tuning adds them. Extra weights in the checkpoint are fairseq's business
    (``--encoder-layers-to-keep`` prunes them after this check).
    """
    missing, resized = [], []
    for key, value in model_state.items():
        if key.startswith(HEAD_PREFIXES):
            continue
        saved = saved_state.get(prefix + key)
        if saved is None:
            missing.append(key)
        elif saved.shape != value.shape and not _position_table_of_another_length(key, saved, value):
            resized.append((key, tuple(saved.shape), tuple(value.shape)))
    embedding = next((r for r in resized if r[0].endswith("embed_tokens.weight") and r[1][1:] == r[2][1:]),
                     None)
    if embedding is not None:
        raise CheckpointMismatchError(
            f"the checkpoint's vocabulary has {embedding[1][0]} symbols but this model's dictionary has "
            f"{embedding[2][0]}: the data were binarized with another dict.txt; binarize them against "
            "the pre-training one (fairseq-preprocess --srcdict PRETRAIN-DATA/dict.txt; "
            "tupe-prepare-glue / tupe-prepare-squad --dict PRETRAIN-DATA/dict.txt)"
        )
    if missing or resized:
        details = [f"missing {key}" for key in missing[:3]]
        details += [f"{key} is {saved} in the checkpoint, {built} in the model"
                    for key, saved, built in resized[:3]]
        raise CheckpointMismatchError(
            f"the checkpoint does not fit --arch {arch} ({'; '.join(details)}"
            f"{', ...' if len(missing) + len(resized) > 3 else ''}): fine-tune with the --arch (and size "
            "flags) the checkpoint was pre-trained with; it is stored in the checkpoint's cfg.model.arch"
        )


def _position_table_of_another_length(key, saved, built):
    """Left to the model's own check, which names --max-positions."""
    return key.endswith("embed_positions.weight") and saved.shape[1:] == built.shape[1:]
