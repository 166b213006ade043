"""The one-to-one names of a plugin checkpoint's tensors and of its transformers export (``tupe-export-hf``,
and ``tupe-convert-hf`` on an export), and the safetensors file both read and write.

Each row is (plugin prefix, transformers prefix), those of the position encodings' tensors from the
registry (each encoding's ``export_names``); ``{n}`` is a layer number, ``{head}`` the name of the
checkpoint's classification or span head (one of each is exported). The masked-LM head's ``weight`` is the
word embeddings (tied): it has no row, and comes back from them. An export for one classification or one span
head holds no masked-LM head (:func:`exported_head`).
"""

import json
import re
import struct

import torch

from tupe_plugin.encodings import registry

# The model type of the exports' config.json (the transformers code they carry registers it).
EXPORT_MODEL_TYPE = "tupe"

NAME_TABLE = (
    ("encoder.sentence_encoder.embed_tokens.", "tupe.embeddings.word_embeddings."),
    ("encoder.sentence_encoder.embed_positions.weight", "tupe.embeddings.position_embeddings.weight"),
    ("encoder.sentence_encoder.embed_positions.sinusoid.frequencies", "tupe.embeddings.position_frequencies"),
    ("encoder.sentence_encoder.layernorm_embedding.", "tupe.embeddings.LayerNorm."),
    ("encoder.sentence_encoder.layers.{n}.self_attn.in_proj.", "tupe.layer.{n}.attention.qkv."),
    ("encoder.sentence_encoder.layers.{n}.self_attn.out_proj.", "tupe.layer.{n}.attention.output."),
    ("encoder.sentence_encoder.layers.{n}.self_attn_layer_norm.", "tupe.layer.{n}.attention_layer_norm."),
    ("encoder.sentence_encoder.layers.{n}.fc1.", "tupe.layer.{n}.intermediate."),
    ("encoder.sentence_encoder.layers.{n}.fc2.", "tupe.layer.{n}.output."),
    ("encoder.sentence_encoder.layers.{n}.final_layer_norm.", "tupe.layer.{n}.output_layer_norm."),
    ("encoder.sentence_encoder.layer_norm.", "tupe.final_layer_norm."),
    *registry.export_names("encoder.sentence_encoder.positional_term.", "tupe.position."),
    ("encoder.sentence_encoder.positional_term.cls_reset.thetas", "tupe.position.cls_thetas"),
    ("encoder.sentence_encoder.layers.{n}.self_attn.relative_projections.query.",
     "tupe.layer.{n}.attention.relative_query."),
    ("encoder.sentence_encoder.layers.{n}.self_attn.relative_projections.key.",
     "tupe.layer.{n}.attention.relative_key."),
    ("encoder.sentence_encoder.enhanced_mask_decoder.embed_positions.weight",
     "tupe.enhanced_mask_decoder.position_embeddings.weight"),
    ("encoder.lm_head.dense.", "lm_head.dense."),
    ("encoder.lm_head.layer_norm.", "lm_head.LayerNorm."),
    ("encoder.lm_head.bias", "lm_head.bias"),
    ("classification_heads.{head}.", "classifier."),
    ("span_heads.{head}.out_proj.", "qa_outputs."),
)
TIED = ("encoder.lm_head.weight", "encoder.sentence_encoder.embed_tokens.weight")
# the plugin keys of the masked-LM head
LM_HEAD = "encoder.lm_head."
# A plugin layer's parts and those of transformers' BERT-style layer (under ``encoder.layer.N.``), which
# the conversion in (:mod:`.hf`) and the native exports (:mod:`.hf_native`) share
LAYER_PARTS = (
    ("self_attn.out_proj.", "attention.output.dense."),
    ("self_attn_layer_norm.", "attention.output.LayerNorm."),
    ("fc1.", "intermediate.dense."),
    ("fc2.", "output.dense."),
    ("final_layer_norm.", "output.LayerNorm."),
)
QKV_PARTS = ("attention.self.query.", "attention.self.key.", "attention.self.value.")

SAFETENSORS_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64"}


def exported_head(heads):
    """The head an export of ``heads`` ({"classification": name or None, "span": name or None}) is for:
    "classification" or "span" when it holds that head alone, else (no head, or both) "masked_lm". Only a
    "masked_lm" export holds the masked-LM head's tensors: a classifier's or a span head's loads into its
    transformers class without weights that class does not read."""
    if heads.get("classification") and not heads.get("span"):
        return "classification"
    if heads.get("span") and not heads.get("classification"):
        return "span"
    return "masked_lm"


def _pattern(prefix, head):
    """The regex of a table prefix; ``head`` (a name or None) fills ``{head}``."""
    pattern = re.escape(prefix).replace(r"\{n\}", r"(?P<n>\d+)")
    return pattern.replace(r"\{head\}", re.escape(head) if head else r"(?!)")


def rename(key, head_names, to_hf=True):
    """The other side's name of ``key`` (None: no row). ``head_names``: {"classification": name or None,
    "span": name or None}, the checkpoint's heads."""
    for plugin, hf in NAME_TABLE:
        source, target = (plugin, hf) if to_hf else (hf, plugin)
        kind = "span" if "span_heads" in plugin else "classification"
        head = head_names.get(kind)
        match = re.match(_pattern(source, head), key)
        if match and (source.endswith(".") or match.end() == len(key)):
            filled = target.replace("{n}", match.groupdict().get("n") or "").replace("{head}", head or "")
            return filled + key[match.end():]
    return None


def write_safetensors(path, tensors):
    """``tensors`` ({name: float tensor}) as a .safetensors file: 8-byte little-endian header size, the JSON
    header (dtype, shape, data offsets), the raw little-endian data."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        # flattened first: a 0-dim tensor (FIRE's log c and threshold) has no byte view of its own
        data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {"dtype": SAFETENSORS_NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for data in blobs:
            f.write(data)
