"""fairseq's own RoBERTa checkpoints (the format of the released ``roberta.base``) as ``bert_a_*``.

A checkpoint of fairseq's ``RobertaModel`` (``encoder.sentence_encoder.*``, or
``decoder.*`` in the released files) computes what the plugin's ``bert_a_*`` of the same sizes computes:
post-LN layers, GELU, a LayerNorm on the input embeddings, a learned absolute table, the tied LM head.
Three names differ, mapped by :func:`to_plugin_names` in place before the weights are checked and loaded:

- ``self_attn.{q,k,v}_proj`` are stacked into the plugin's ``self_attn.in_proj`` (in q, k, v order);
  the released files' ``self_attn.in_proj_weight`` / ``in_proj_bias`` are stacked already;
- fairseq's ``LearnedPositionalEmbedding`` counts positions from ``padding_idx + 1`` (rows 0 ..
  padding_idx are never read by a right-padded batch); the plugin's table starts at the first token, so
  the rows from ``padding_idx + 1`` on are kept;
- the ``version`` buffers of fairseq's ``TransformerEncoder`` have no counterpart and are dropped.

RoBERTa's own upgrades (``decoder`` -> ``encoder``, ``emb_layer_norm`` -> ``layernorm_embedding``) are
applied by :class:`~fairseq.models.roberta.RobertaModel` itself and here, so that the swap of
:mod:`.checkpoint_init` reads the released files too.
"""

import re

import torch

_ATTENTION = re.compile(r"^(.*\.layers\.\d+\.self_attn\.)(?:q_proj\.|in_proj_)(weight|bias)$")


def is_stock_roberta(state, prefix=""):
    """True when the weights ``state`` are fairseq ``RobertaModel``'s (its attention's parameter names)."""
    return any(key.startswith(prefix) and _ATTENTION.match(key[len(prefix):]) for key in state)


def to_plugin_names(state, prefix, padding_idx):
    """Rename the weights of a fairseq RoBERTa ``state`` (keys under ``prefix``) to the plugin's, in place."""
    for key in [key for key in state if key.startswith(prefix)]:
        value = state.pop(key)
        name = key[len(prefix):]
        name = "encoder." + name[len("decoder."):] if name.startswith("decoder.") else name
        name = name.replace(".emb_layer_norm.", ".layernorm_embedding.")
        if name.endswith("sentence_encoder.version"):
            continue
        if name.endswith("sentence_encoder.embed_positions.weight"):
            value = value[padding_idx + 1:]
        state[prefix + name] = value
    for key in list(state):
        match = _ATTENTION.match(key[len(prefix):]) if key.startswith(prefix) else None
        if match is not None:
            attention, kind = prefix + match.group(1), match.group(2)
            stacked = state.pop(f"{attention}in_proj_{kind}", None)
            if stacked is None:
                stacked = torch.cat([state.pop(f"{attention}{part}_proj.{kind}") for part in "qkv"], dim=0)
            state[f"{attention}in_proj.{kind}"] = stacked
