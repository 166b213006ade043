"""The configuration of a tupe-plugin encoder exported to transformers (``model_type`` "tupe").

Self-contained: it imports transformers only, and is copied into every export (``trust_remote_code``).
The sizes are BERT's names; the position encoding is the plugin's flags, under their own names; the
checkpoint's model flags are kept whole in ``fairseq_model_args`` (what ``tupe-convert-hf`` restores).
Every field is checked when the configuration is built: a config.json edited into a model the weights do
not describe (an unknown encoding, zero heads, a NaN epsilon, a missing ``rel_pos``) is refused in one
ValueError naming the field and what it takes, not loaded into other logits or a crash deep in the model.
"""

import math

from transformers import PretrainedConfig

# The position-encoding settings of the plugin's model flags and their defaults (no position encoding).
POSITION_DEFAULTS = dict(
    abs_pos="none", rel_pos="none", untied_pos="none", cls_reset="none", untied_proj_bias=False,
    rel_pos_buckets=32, rel_pos_max_distance=128, shaw_max_distance=64, shaw_keys_only=False,
    rotary="none", rotary_base=10000.0, rotary_scaling="none", rotary_scaling_factor=1.0,
    alibi_asymmetric=False, alibi_learned_slopes=False, kerple_param="clamped", sandwich_dim=128,
    sandwich_scale=1.0, sandwich_frequencies="one-based", fire_hidden=32, fire_threshold=512.0,
    fire_signed=False, fire_normaliser="largest-distance", deberta_max_distance=512, deberta_buckets=0,
    deberta_share_att_key=False, deberta_p2c="released", deberta_rel_proj_bias="query",
    deberta_table_norm=False, deberta_emd=False, deberta_emd_layers=2,
)


# The activations the model knows by name (modeling_tupe's ACTIVATIONS).
ACTIVATION_NAMES = ("gelu", "gelu_accurate", "gelu_fast", "relu", "relu_squared", "tanh", "linear")

# What each field takes, checked as the configuration is built: a choice among names, True or False, an
# integer from a least value, a finite number above (or from) a least value, a probability in [0, 1).
CHOICES = dict(
    abs_pos=("none", "learned", "sinusoidal", "learnable-sinusoidal"),
    rel_pos=("none", "t5", "alibi", "kerple-log", "kerple-power", "sandwich", "fire", "deberta",
             "shaw-learned", "shaw-sinusoidal", "shaw-learnable-sinusoidal"),
    untied_pos=("none", "tupe", "four-term"), cls_reset=("none", "paper", "release"),
    rotary=("none", "fixed", "learnable"), rotary_scaling=("none", "linear", "ntk"),
    kerple_param=("clamped", "softplus"), sandwich_frequencies=("one-based", "zero-based"),
    fire_normaliser=("largest-distance", "length"), deberta_p2c=("released", "paper"),
    deberta_rel_proj_bias=("query", "both", "none"), hidden_act=ACTIVATION_NAMES,
    pooler_activation=ACTIVATION_NAMES,
)
BOOLEANS = ("untied_proj_bias", "shaw_keys_only", "alibi_asymmetric", "alibi_learned_slopes", "fire_signed",
            "deberta_share_att_key", "deberta_table_norm", "deberta_emd", "pre_layer_norm",
            "embedding_layer_norm")
INTEGERS = dict(vocab_size=1, hidden_size=1, num_hidden_layers=1, num_attention_heads=1,
                intermediate_size=1, max_position_embeddings=1, rel_pos_buckets=4, rel_pos_max_distance=1,
                shaw_max_distance=1, sandwich_dim=2, fire_hidden=1, deberta_max_distance=1, deberta_buckets=0,
                deberta_emd_layers=1)
# The sizes far beyond any published model of that shape, refused as a damaged or mistyped config (the
# plugin refuses the same flags at training): a model built from them would exhaust the machine's memory.
LARGEST = dict(num_hidden_layers=1000, hidden_size=65536, intermediate_size=262144, num_attention_heads=1024)
# (least value, whether the least value itself is taken)
NUMBERS = dict(layer_norm_eps=(0.0, False), rotary_base=(1.0, False), rotary_scaling_factor=(0.0, False),
               sandwich_scale=(0.0, False), fire_threshold=(1.0, True))
PROBABILITIES = ("hidden_dropout_prob", "attention_probs_dropout_prob", "activation_dropout",
                 "classifier_dropout")
# The fields an export writes that decide the weights and what they compute: a config.json without one
# would build another model.
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "hidden_act", "pre_layer_norm", "embedding_layer_norm",
            *POSITION_DEFAULTS)
FIX = "export the checkpoint again with tupe-export-hf, or correct the field in config.json"


def _is_integer(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _takes(name):
    """What field ``name`` takes, in words, for the error message."""
    if name in CHOICES:
        return "one of " + ", ".join(repr(choice) for choice in CHOICES[name])
    if name in BOOLEANS:
        return "true or false"
    if name in INTEGERS:
        largest = f" and <= {LARGEST[name]} (beyond any published model)" if name in LARGEST else ""
        return f"an integer >= {INTEGERS[name]}{largest}"
    if name in NUMBERS:
        least, included = NUMBERS[name]
        return f"a finite number {'>=' if included else '>'} {least:g}"
    return "a probability in [0, 1)"


def _field_takes(name, value):
    if name in CHOICES:
        return isinstance(value, str) and value in CHOICES[name]
    if name in BOOLEANS:
        return isinstance(value, bool)
    if name in INTEGERS:
        return _is_integer(value) and INTEGERS[name] <= value <= LARGEST.get(name, value)
    if name in NUMBERS:
        least, included = NUMBERS[name]
        return _is_number(value) and (value >= least if included else value > least)
    return _is_number(value) and 0 <= value < 1


def check_fields(fields):
    """Raise ValueError, naming the field and what it takes, for the first field of ``fields`` (name: value)
    that a tupe export cannot hold, or a required one that is missing."""
    for name in REQUIRED:
        if name not in fields:
            raise ValueError(f"config.json has no {name} ({_takes(name)}), which the model's weights and "
                             f"what they compute depend on: {FIX}")
    for name, value in fields.items():
        if not _field_takes(name, value):
            raise ValueError(f"config.json: {name} = {value!r}, but {name} takes {_takes(name)}: {FIX}")
    hidden, heads = fields["hidden_size"], fields["num_attention_heads"]
    if hidden % heads:
        raise ValueError(f"config.json: hidden_size = {hidden} is no multiple of num_attention_heads = "
                         f"{heads}: {FIX}")
    if fields["rel_pos"] == "t5" and fields["rel_pos_buckets"] % 2:
        raise ValueError(f"config.json: rel_pos_buckets = {fields['rel_pos_buckets']}, but T5's buckets are "
                         f"split between the two directions and take an even integer >= 4: {FIX}")


_MISSING = object()


class TupeConfig(PretrainedConfig):
    """The model's sizes and position encoding; every field is checked as the configuration is built
    (:func:`check_fields`): a value the model cannot take, or a missing field that decides the weights, is a
    ValueError naming the field and what it takes."""

    model_type = "tupe"

    def __init__(self, vocab_size=_MISSING, hidden_size=_MISSING, num_hidden_layers=_MISSING,
                 num_attention_heads=_MISSING, intermediate_size=_MISSING, max_position_embeddings=_MISSING,
                 hidden_act=_MISSING, pooler_activation="tanh", hidden_dropout_prob=0.1,
                 attention_probs_dropout_prob=0.1, activation_dropout=0.0, classifier_dropout=0.0,
                 layer_norm_eps=1e-5, pre_layer_norm=_MISSING, embedding_layer_norm=_MISSING, pad_token_id=1,
                 bos_token_id=0, eos_token_id=2, fairseq_model_args=None, **kwargs):
        positions = {name: kwargs.pop(name, _MISSING) for name in POSITION_DEFAULTS}
        fields = dict(
            vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads, intermediate_size=intermediate_size,
            max_position_embeddings=max_position_embeddings, hidden_act=hidden_act,
            pooler_activation=pooler_activation, hidden_dropout_prob=hidden_dropout_prob,
            attention_probs_dropout_prob=attention_probs_dropout_prob, activation_dropout=activation_dropout,
            classifier_dropout=classifier_dropout, layer_norm_eps=layer_norm_eps,
            pre_layer_norm=pre_layer_norm, embedding_layer_norm=embedding_layer_norm, **positions)
        fields = {name: value for name, value in fields.items() if value is not _MISSING}
        check_fields(fields)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         **kwargs)
        for name, value in fields.items():
            setattr(self, name, value)
        self.fairseq_model_args = fairseq_model_args or {}
