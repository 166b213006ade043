"""The import paths of the plugin's former flat layout (``tupe_plugin.modules.relative_position``, ...), for
code written against them: each name is an alias of the module at its new home in
:mod:`tupe_plugin.encodings`, :mod:`tupe_plugin.attention` or :mod:`tupe_plugin.encoder`. The former
``attention_kernels`` was split into :mod:`tupe_plugin.attention.paths`, :mod:`~tupe_plugin.attention.attend`
and :mod:`~tupe_plugin.attention.cpu_kernels` and has no alias. New code imports the new homes.
"""

import importlib
import sys

NEW_HOMES = {
    **{name: f"encodings.{name}" for name in (
        "absolute_position", "alibi_position", "cls_reset", "deberta_position", "fire_position",
        "kerple_position", "offset_bias", "position_config", "positional_term", "relative_position",
        "rotary_position", "sandwich_position", "shaw_position", "sinusoid", "untied_position")},
    **{name: f"attention.{name}" for name in ("clipped_distances", "compiled_kernels", "toeplitz_scores")},
    "attention_dropout": "attention.dropout",
    "attention": "encoder.self_attention",
    **{name: f"encoder.{name}" for name in (
        "embedding_diagnosis", "encoder_layer", "enhanced_mask_decoder", "positional_encoder",
        "pretrained_embeddings")},
}

for _old, _new in NEW_HOMES.items():
    sys.modules[f"{__name__}.{_old}"] = globals()[_old] = importlib.import_module(f"tupe_plugin.{_new}")
