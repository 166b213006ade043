"""Hugging Face BERT and RoBERTa masked-LM checkpoints, converted into plugin ``bert_a_*`` checkpoints.

``tupe-convert-hf`` (:mod:`.hf_cli`) is the command line. The mapping is written from the two models'
definitions (Devlin et al. 2019, BERT; Liu et al. 2019, RoBERTa), not from any converter:

* Read: ``config.json``; the weights from ``model.safetensors`` (parsed here from the format's JSON header,
  no extra package) or else ``pytorch_model.bin`` (``torch.load(weights_only=True)``); the tokenizer's
  ``vocab.txt`` (WordPiece, BERT) or ``vocab.json`` + ``merges.txt`` (byte-level BPE, RoBERTa), or else
  their vocabulary and merges in ``tokenizer.json`` (all that transformers 5 saves), and
  ``tokenizer_config.json`` when there (``do_lower_case``, BERT's special tokens, ``add_prefix_space``).
* Layers: BERT's post-LN layer is the plugin's (LayerNorm after each residual, embedding LayerNorm, GELU);
  query/key/value are stacked into ``in_proj``. The MLM head's transform (dense, GELU, LayerNorm) is
  RoBERTa's ``lm_head``; its decoder stays tied to the word embeddings.
* Positions: the plugin's row t is input position t. BERT counts from 0 (row t = HF row t); RoBERTa from
  ``pad_token_id + 1`` (row t = HF row t + pad + 1; the rows below are dropped), so ``--max-positions`` is
  ``max_position_embeddings`` minus that offset.
* Token types: fairseq feeds no segment ids, every token is segment 0: row 0 of ``token_type_embeddings``
  is added to every position row; further rows (BERT's second segment) are dropped, said in the log.
* Ids: fairseq's Dictionary puts ``<s> <pad> </s> <unk>`` at ids 0-3 and the masked-LM task appends
  ``<mask>``. RoBERTa's vocabulary has that order already: ``dict.txt`` lists HF ids 4..V-2 as symbols
  (what ``--bpe hf_byte_bpe`` outputs) and every id is kept. BERT's ``[CLS] [PAD] [SEP] [UNK]`` become
  ids 0-3 and ``[MASK]`` the last id; the other WordPiece tokens (what ``--bpe bert`` outputs) follow in
  their HF order. The rows of the embeddings and of the output bias are permuted alike;
  ``extra_state['hf_token_ids']`` lists the HF id of every plugin id.
* The matching fairseq BPE is recorded in ``cfg.bpe`` (``bert`` with ``OUT/vocab.txt`` and
  ``bpe_cased``; ``hf_byte_bpe`` with ``OUT/vocab.json`` / ``OUT/merges.txt``), the tokenizer files copied
  into OUT, so that ``from_pretrained`` encodes text as the original tokenizer did.
* ``layer_norm_eps`` (BERT's 1e-12, RoBERTa's 1e-5) is recorded as the model's ``--layer-norm-eps``, so
  that fine-tuning and a ``--init-from-checkpoint`` swap keep it.
* Refused, in one line naming the file and field: another ``model_type``, a ``position_embedding_type``
  other than absolute, an activation other than GELU, a decoder, untied word embeddings, special tokens
  not where fairseq needs them, a weight with no place in the plugin, one missing, or a size that
  disagrees with ``config.json``. The pooler and the next-sentence head are dropped, said in the log.
* The output folder is written aside and moved into place as :func:`.official_tupe.convert` does.
* A folder written by ``tupe-export-hf`` (``model_type`` "tupe", or a native RoBERTa export, whose
  config.json records the plugin's ``fairseq_model_args``) goes back to its plugin checkpoint
  (:mod:`.hf_import`).
"""

import json
import logging
import os
import pickle
import re
import shutil
import struct
from typing import Callable, NamedTuple

import torch

from tupe_plugin.cli.fairseq_tools import PLUGIN_DIR
from tupe_plugin.cli.prepared_folder import make_sibling_folder
from tupe_plugin.conversion import hf_import
from tupe_plugin.conversion.hf_names import EXPORT_MODEL_TYPE, LAYER_PARTS, QKV_PARTS
from tupe_plugin.conversion.official_tupe import (CHECKPOINT_NAME, check_output_folder, converted_state,
                                                  move_into_place)
from tupe_plugin.fairseq_fixes.checkpoint_compat import load, unreadable_reason
from tupe_plugin.models.architectures import ARCHITECTURES, SIZES
from tupe_plugin.user_input.memory_limits import beyond_memory
from tupe_plugin.user_input.user_errors import UserError

logger = logging.getLogger("convert_hf")

CONFIG, TOKENIZER_CONFIG, TOKENIZER_JSON = "config.json", "tokenizer_config.json", "tokenizer.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
FAIRSEQ_MASK = "<mask>"
PLUGIN = "encoder.sentence_encoder."
HEAD = "encoder.lm_head."
SWAP_FLAG = "--init-from-checkpoint"
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


class Family:
    """What differs between BERT and RoBERTa folders: key prefixes, tokenizer files, fairseq BPE."""

    def __init__(self, base, head, head_dense, head_norm, tokenizer_files, bpe):
        self.base, self.head, self.head_dense, self.head_norm = base, head, head_dense, head_norm
        self.tokenizer_files, self.bpe = tokenizer_files, bpe


FAMILIES = {
    "bert": Family("bert.", "cls.predictions.", "transform.dense.", "transform.LayerNorm.", ("vocab.txt",),
                   "bert"),
    "roberta": Family("roberta.", "lm_head.", "dense.", "layer_norm.", ("vocab.json", "merges.txt"),
                      "hf_byte_bpe"),
}
# weights with no place in a masked-LM encoder: (pattern, what they are), dropped and logged
DROPPED = (
    (r"^(bert|roberta)\.pooler\.", "the pooler (fine-tuning builds its own classification head)"),
    (r"^cls\.seq_relationship\.", "the next-sentence-prediction head"),
    (r"\.(position_ids|token_type_ids)$", "index buffers"),
)


class HfCheckpointError(UserError, ValueError):
    """The folder is not a Hugging Face BERT/RoBERTa masked LM the plugin can represent."""


def read_json(hf_dir, name, required=True):
    path = os.path.join(hf_dir, name)
    if not os.path.isfile(path):
        if required:
            raise HfCheckpointError(f"--hf-model {hf_dir} has no {name}: pass a folder written by "
                                    "save_pretrained (config.json, the weights and the tokenizer's files)")
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return parse_json(f.read(), path)
    except UnicodeDecodeError as error:
        raise HfCheckpointError(f"{path} is not valid JSON ({error}): download the model again") from error


def parse_json(text, path):
    """The JSON object ``text`` read from ``path``."""
    try:
        value = json.loads(text)
    except ValueError as error:
        raise HfCheckpointError(f"{path} is not valid JSON ({error}): download the model again") from error
    except RecursionError:
        raise HfCheckpointError(f"{path} nests its values too deep to read (a config nests a few levels): "
                                "download the model again") from None
    if not isinstance(value, dict):
        raise HfCheckpointError(f"{path} is not a JSON object: download the model again")
    return value


def check_config(config, path):
    """Refuse a BERT or RoBERTa ``config.json`` the plugin cannot represent."""
    refusals = (
        ("position_embedding_type", "absolute",
         "the plugin converts absolute position embeddings only (relative_key* are Shaw/Huang variants)"),
        ("hidden_act", "gelu", "the plugin's layers and MLM head apply fairseq's exact GELU"),
        ("is_decoder", False, "a decoder attends causally; the plugin is a bidirectional encoder"),
        ("add_cross_attention", False, "the plugin's layers have no cross-attention"),
        ("tie_word_embeddings", True, "the plugin's MLM head shares the word embeddings"),
    )
    for field, supported, why in refusals:
        if config.get(field, supported) != supported:
            raise HfCheckpointError(f"{path}: {field} = {config[field]!r} is not supported ({why}); convert "
                                    f"a model with {field} = {json.dumps(supported)}")
    check_sizes(config, path)


def check_sizes(config, path):
    """Refuse a ``config.json`` whose sizes are not positive integers, or whose position table alone would
    exceed the machine's memory (a typo), before anything is allocated."""
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "max_position_embeddings"):
        if not isinstance(config.get(field), int) or config[field] < 1:
            raise HfCheckpointError(f"{path}: {field} = {config.get(field)!r}, expected a positive integer")
    positions, dim = config["max_position_embeddings"], config["hidden_size"]
    if problem := beyond_memory(f"max_position_embeddings = {positions}", "position table",
                                positions * dim * 4):
        raise HfCheckpointError(f"{path}: {problem} (512 is BERT's): correct max_position_embeddings")


def read_safetensors(path):
    """{name: tensor} of a .safetensors file: 8-byte little-endian header size, JSON header, raw data."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    try:
        (header_size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + header_size].decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError(f"its header is a JSON {type(header).__name__}, not an object of tensors")
        start = 8 + header_size
        tensors = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = (start + offset for offset in info["data_offsets"])
            if info["dtype"] not in SAFETENSORS_DTYPES:
                raise HfCheckpointError(f"{path}: tensor {name} has dtype {info['dtype']}, which "
                                        "tupe-convert-hf does not read; save the model in float32, float16 "
                                        "or bfloat16")
            dtype = SAFETENSORS_DTYPES[info["dtype"]]
            if end > len(data) or end - begin != torch.Size(info["shape"]).numel() * dtype.itemsize:
                raise ValueError(f"tensor {name} lies outside the file")
            flat = torch.frombuffer(data, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=begin) \
                if end > begin else torch.empty(0, dtype=dtype)
            tensors[name] = flat.reshape(info["shape"]).clone()
    except HfCheckpointError:
        raise
    except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise HfCheckpointError(f"{path} ({len(data)} bytes) is not a complete safetensors file ({error}): "
                                "download it again") from error
    except RecursionError:
        raise HfCheckpointError(f"{path}: its header nests values too deep to be a safetensors header: "
                                "download it again") from None
    return tensors


def load_weights(hf_dir):
    """(float32 state dict with LayerNorm gamma/beta renamed weight/bias, the file read)."""
    path = next((os.path.join(hf_dir, name) for name in WEIGHT_FILES
                 if os.path.isfile(os.path.join(hf_dir, name))), None)
    if path is None:
        raise HfCheckpointError(f"--hf-model {hf_dir} has neither {' nor '.join(WEIGHT_FILES)} (a sharded "
                                "checkpoint is not supported): save the model with save_pretrained in one "
                                "file")
    if path.endswith(".safetensors"):
        state = read_safetensors(path)
    else:
        try:
            state = load(path, "--hf-model", fix="save the model with save_pretrained (model.safetensors, or "
                         "a pytorch_model.bin of tensors)")
        except (pickle.UnpicklingError, EOFError, RuntimeError) as error:
            raise HfCheckpointError(f"{path} cannot be read as a PyTorch state dict of tensors "
                                    f"({unreadable_reason(path)}): download it again") from error
        if not isinstance(state, dict):
            raise HfCheckpointError(f"{path} holds a {type(state).__name__}, not a state dict")
        if {"model", "cfg"} <= set(state) or {"model", "args"} <= set(state):
            raise HfCheckpointError(f"{path} is a fairseq checkpoint, not a transformers model's weights: "
                                    "fairseq's commands read it as it is (tupe-export-hf writes a "
                                    "transformers folder of it)")
        other = next((key for key, value in state.items() if not isinstance(value, torch.Tensor)), None)
        if other is not None:
            kind = type(state[other]).__name__
            raise HfCheckpointError(f"{path}: {other!r} holds a value of type {kind}, not a tensor: save the "
                                    "model with save_pretrained (a state dict of tensors)")
    weights = {}
    for key, value in state.items():
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key)
        key = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key)
        weights[key] = value.float() if value.is_floating_point() else value
    return weights, path


# ---------------------------------------------------------------- vocabulary

def special_token(value, default):
    """A special token of tokenizer_config.json: a string, or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else default


# tokenizer_config.json's special tokens (with their usual text): fairseq's <s> <pad> </s> <unk>, then <mask>
SPECIAL_FIELDS = (("cls_token", "[CLS]"), ("pad_token", "[PAD]"), ("sep_token", "[SEP]"),
                  ("unk_token", "[UNK]"), ("mask_token", "[MASK]"))


def fairseq_order(ids, size):
    """Plugin id -> HF id of a vocabulary of ``size`` ids with the special tokens' HF ``ids`` (by field of
    :data:`SPECIAL_FIELDS`): [CLS] [PAD] [SEP] [UNK] as fairseq's ids 0-3, the other ids in their order,
    [MASK] last."""
    specials = [ids[field] for field, _ in SPECIAL_FIELDS[:4]]
    taken = set(specials) | {ids["mask_token"]}
    return specials + [i for i in range(size) if i not in taken] + [ids["mask_token"]]


def check_ids(vocab, path):
    """Refuse a vocabulary (token -> id) of ``path`` whose ids are not 0..V-1, each once."""
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise HfCheckpointError(f"{path}: the vocabulary's ids are not 0..{len(vocab) - 1}, each once")


def tokenizer_files(hf_dir, names, model_type):
    """``{name: (text, where)}`` of the tokenizer files ``names`` (``where`` names the file in errors): read
    from ``hf_dir``, or written from ``tokenizer.json`` where they are absent (transformers 5 saves only
    that file)."""
    paths = {name: os.path.join(hf_dir, name) for name in names}
    if all(os.path.isfile(path) for path in paths.values()):
        files = {}
        for name, path in paths.items():
            with open(path, encoding="utf-8") as f:
                files[name] = f.read(), path
        return files
    path = os.path.join(hf_dir, TOKENIZER_JSON)
    if not os.path.isfile(path):
        missing = " or ".join(name for name, path in paths.items() if not os.path.isfile(path))
        raise HfCheckpointError(f"--hf-model {hf_dir} has no {missing} ({model_type}'s tokenizer) and no "
                                f"{TOKENIZER_JSON}: save the tokenizer with save_pretrained into the same "
                                "folder")
    model = read_json(hf_dir, TOKENIZER_JSON).get("model") or {}
    kind = "WordPiece" if model_type == "bert" else "BPE"
    vocab = model.get("vocab")
    if model.get("type") != kind or not isinstance(vocab, dict):
        raise HfCheckpointError(f"{path} holds a {model.get('type')} tokenizer, not {model_type}'s {kind} "
                                "vocabulary: pass the tokenizer saved with the model")
    check_ids(vocab, path)
    where = f"{path} (its vocabulary as {names[0]})"
    if model_type == "bert":
        return {"vocab.txt": ("".join(token + "\n" for token in sorted(vocab, key=vocab.get)), where)}
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model.get("merges", [])]
    return {"vocab.json": (json.dumps(vocab, ensure_ascii=False), where),
            "merges.txt": ("#version: 0.2\n" + "".join(merge + "\n" for merge in merges), path)}


def bert_vocabulary(files, config, tokenizer_config):
    """(plugin id -> HF id, dict.txt lines, --bpe bert settings) of a WordPiece vocab.txt."""
    text, path = files["vocab.txt"]
    tokens = text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()  # a trailing empty line
    first_line = {}
    for line, token in enumerate(tokens, 1):
        problem = ("is empty or holds whitespace" if not token or token.split() != [token]
                   else "is one of fairseq's special symbols" if token in FAIRSEQ_SPECIALS + (FAIRSEQ_MASK,)
                   else f"repeats line {first_line[token]}" if token in first_line else None)
        if problem:
            raise HfCheckpointError(f"{path} line {line}: token {token!r} {problem}; fairseq's dict.txt "
                                    "cannot hold it")
        first_line[token] = line
    _check_vocab_size(path, len(tokens), config)
    ids = {}
    for field, default in SPECIAL_FIELDS:
        token = special_token(tokenizer_config.get(field), default)
        if token not in first_line:
            raise HfCheckpointError(f"{path} has no {token} (tokenizer_config.json {field}): pass the "
                                    "vocab.txt saved with the model")
        ids[field] = first_line[token] - 1
    _check_pad(config, ids["pad_token"])
    lower = tokenizer_config.get("do_lower_case", True)
    strip_accents = tokenizer_config.get("strip_accents")
    if strip_accents is not None and bool(strip_accents) != bool(lower) \
            or not tokenizer_config.get("tokenize_chinese_chars", True):
        raise HfCheckpointError(
            f"{TOKENIZER_CONFIG}: strip_accents = {strip_accents!r}, tokenize_chinese_chars = "
            f"{tokenizer_config.get('tokenize_chinese_chars', True)!r} with do_lower_case = {lower!r}: "
            "fairseq's --bpe bert strips accents exactly when it lowercases and splits Chinese characters"
        )
    order = fairseq_order(ids, len(tokens))
    return order, [f"{tokens[i]} 1\n" for i in order[4:-1]], {"bpe_cased": not lower}


def roberta_vocabulary(files, config, tokenizer_config):
    """(plugin id -> HF id, dict.txt lines, --bpe hf_byte_bpe settings) of a byte-level BPE vocab.json."""
    text, path = files["vocab.json"]
    vocab = parse_json(text, path)
    check_ids(vocab, path)
    _check_vocab_size(path, len(vocab), config)
    expected = dict(zip(FAIRSEQ_SPECIALS, range(len(FAIRSEQ_SPECIALS))), **{FAIRSEQ_MASK: len(vocab) - 1})
    wrong = [f"{token} is {vocab.get(token)}" for token, i in expected.items() if vocab.get(token) != i]
    if wrong:
        raise HfCheckpointError(
            f"{path}: {', '.join(wrong)}; fairseq needs <s> <pad> </s> <unk> at ids 0-3 and <mask> last, as "
            "RoBERTa has them"
        )
    _check_pad(config, vocab["<pad>"])
    lines = [f"{i} 1\n" for i in range(len(FAIRSEQ_SPECIALS), len(vocab) - 1)]
    settings = {"bpe_add_prefix_space": bool(tokenizer_config.get("add_prefix_space"))}
    return list(range(len(vocab))), lines, settings


def _check_vocab_size(path, size, config):
    if size != config["vocab_size"]:
        raise HfCheckpointError(f"{path} holds {size} tokens but config.json vocab_size is "
                                f"{config['vocab_size']}: pass the tokenizer files saved with the model")


def _check_pad(config, pad):
    if config.get("pad_token_id", pad) != pad:
        raise HfCheckpointError(f"config.json pad_token_id = {config['pad_token_id']} but the tokenizer's "
                                f"padding token has id {pad}")


VOCABULARIES = {"bert": bert_vocabulary, "roberta": roberta_vocabulary}


# ---------------------------------------------------------------- weights

def position_offset(model_type, config):
    """The HF position row of input position 0: 0 for BERT, pad_token_id + 1 for RoBERTa."""
    return config.get("pad_token_id", 1) + 1 if model_type == "roberta" else 0


def required_keys(family, layers):
    """The HF keys the plugin model is made of."""
    embeddings = family.base + "embeddings."
    keys = [embeddings + name for name in ("word_embeddings.weight", "position_embeddings.weight",
                                           "token_type_embeddings.weight", "LayerNorm.weight",
                                           "LayerNorm.bias")]
    for layer in range(layers):
        prefix = f"{family.base}encoder.layer.{layer}."
        for _, part in LAYER_PARTS:
            keys += [prefix + part + "weight", prefix + part + "bias"]
        for part in QKV_PARTS:
            keys += [prefix + part + "weight", prefix + part + "bias"]
    for part in (family.head_dense, family.head_norm):
        keys += [family.head + part + "weight", family.head + part + "bias"]
    return keys + [family.head + "bias"]


def map_state_dict(hf, family, config, order, offset, expected_shapes, weights_path):
    """The plugin state dict of the HF weights; errors name missing, unexpected and misshapen keys."""
    layers = config["num_hidden_layers"]
    required = required_keys(family, layers)
    missing = [key for key in required if key not in hf]
    tied = {family.head + "decoder.weight": family.base + "embeddings.word_embeddings.weight",
            family.head + "decoder.bias": family.head + "bias"}
    dropped = {key: why for key in hf for pattern, why in DROPPED if re.search(pattern, key)}
    unexpected = sorted(set(hf) - set(required) - set(tied) - set(dropped))
    if missing or unexpected:
        problems = []
        if missing:
            problems.append("missing " + ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
                            + " (a BertModel/RobertaModel has no MLM head: convert a *ForMaskedLM or "
                            "*ForPreTraining checkpoint)")
        if unexpected:
            problems.append("no place in the plugin's encoder for " + ", ".join(unexpected[:4])
                            + (", ..." if len(unexpected) > 4 else ""))
        raise HfCheckpointError(f"{weights_path}: {'; '.join(problems)}")
    for copy, kept in tied.items():
        if copy in hf and not torch.equal(hf[copy], hf[kept]):
            raise HfCheckpointError(f"{weights_path}: {copy} differs from {kept}; the plugin's MLM head "
                                    "ties them")
    for why in sorted(set(dropped.values())):
        logger.info("dropped %s: %s", why, ", ".join(sorted(k for k in dropped if dropped[k] == why)))

    embeddings = family.base + "embeddings."
    positions = hf[embeddings + "position_embeddings.weight"]
    token_types = hf[embeddings + "token_type_embeddings.weight"]
    _check_rows(weights_path, embeddings + "position_embeddings.weight", positions, config,
                "max_position_embeddings")
    _check_rows(weights_path, embeddings + "token_type_embeddings.weight", token_types, config,
                "type_vocab_size")
    if token_types.size(0) > 1:
        logger.info("token_type_embeddings: row 0 added to every position row; rows 1-%d (other segments) "
                    "dropped: fairseq encodes every token as segment 0", token_types.size(0) - 1)
    words = hf[embeddings + "word_embeddings.weight"]
    if words.size(0) != len(order):
        raise HfCheckpointError(f"{weights_path}: {embeddings}word_embeddings.weight has {words.size(0)} "
                                f"rows but config.json vocab_size is {config['vocab_size']}")
    mapped = {
        PLUGIN + "embed_tokens.weight": words[order],
        PLUGIN + "embed_positions.weight": positions[offset:] + token_types[0],
        PLUGIN + "layernorm_embedding.weight": hf[embeddings + "LayerNorm.weight"],
        PLUGIN + "layernorm_embedding.bias": hf[embeddings + "LayerNorm.bias"],
        HEAD + "weight": words[order],
        HEAD + "bias": hf[family.head + "bias"][order],
    }
    for name in ("weight", "bias"):
        mapped[HEAD + "dense." + name] = hf[family.head + family.head_dense + name]
        mapped[HEAD + "layer_norm." + name] = hf[family.head + family.head_norm + name]
        for layer in range(layers):
            hf_layer, plugin_layer = f"{family.base}encoder.layer.{layer}.", f"{PLUGIN}layers.{layer}."
            mapped[plugin_layer + "self_attn.in_proj." + name] = torch.cat([hf[hf_layer + part + name]
                                                                             for part in QKV_PARTS])
            for plugin_part, hf_part in LAYER_PARTS:
                mapped[plugin_layer + plugin_part + name] = hf[hf_layer + hf_part + name]
    misshapen = [f"{key}: {tuple(tensor.shape)}, config.json gives {tuple(expected_shapes[key])}"
                 for key, tensor in mapped.items() if tensor.shape != expected_shapes[key]]
    if misshapen:
        raise HfCheckpointError(f"{weights_path}: {len(misshapen)} sizes differ from config.json's (plugin "
                                "key: checkpoint, config) " + "; ".join(misshapen[:3])
                                + ("; ..." if len(misshapen) > 3 else ""))
    return mapped


def _check_rows(weights_path, key, table, config, field):
    if table.size(0) != config.get(field, table.size(0)):
        raise HfCheckpointError(f"{weights_path}: {key} has {table.size(0)} rows but config.json {field} is "
                                f"{config[field]}")


# ---------------------------------------------------------------- command line and checks

def size_name(dims):
    """The name in SIZES of (layers, dim, heads, ffn), or None."""
    return next((name for name, preset in SIZES.items() if preset == dims), None)


def choose_arch(dims, requested, family="bert_a"):
    """(the ``family``_* arch written, the arch to swap into or None) for ``--arch requested``."""
    size = size_name(dims) or "base"  # a size outside SIZES: the flags set it
    written = f"{family}_{size}"
    if requested in (None, written):
        return written, None
    if requested not in ARCHITECTURES:
        raise HfCheckpointError(f"--arch {requested} is not a plugin architecture: give one of "
                                f"tupe_plugin/models/architectures.py, e.g. {written} or tupe_r_{size}")
    requested_size = requested.rsplit("_", 1)[1]
    if requested_size != size:
        raise HfCheckpointError(
            f"--arch {requested} is {requested_size} size {SIZES[requested_size]} but config.json describes "
            f"(layers, hidden, heads, FFN) = {dims}: give a {size} architecture (e.g. {written}) or leave "
            "--arch out"
        )
    return written, requested


def size_flags(opts):
    return ["--encoder-layers", opts["encoder_layers"], "--encoder-embed-dim", opts["encoder_embed_dim"],
            "--encoder-attention-heads", opts["encoder_attention_heads"],
            "--encoder-ffn-embed-dim", opts["encoder_ffn_embed_dim"]]


def model_options(config):
    """The plugin's model options of a checked ``config.json``."""
    hidden_dropout = config.get("hidden_dropout_prob", 0.1)
    classifier_dropout = config.get("classifier_dropout")
    return dict(
        encoder_layers=config["num_hidden_layers"],
        encoder_embed_dim=config["hidden_size"],
        encoder_attention_heads=config["num_attention_heads"],
        encoder_ffn_embed_dim=config["intermediate_size"],
        dropout=hidden_dropout,
        attention_dropout=config.get("attention_probs_dropout_prob", 0.1),
        pooler_dropout=hidden_dropout if classifier_dropout is None else classifier_dropout,
        layer_norm_eps=config.get("layer_norm_eps", 1e-12),
    )


def plugin_command_line(opts, arch, max_positions, data_dir, bpe_flags, position_flags=()):
    """The fairseq-train command line (after ``fairseq-train``) of the converted model."""
    line = [
        data_dir, "--user-dir", PLUGIN_DIR, "--task", "masked_lm", "--criterion", "masked_lm", "--arch", arch,
        "--tokens-per-sample", max_positions, "--max-positions", max_positions, *size_flags(opts),
        "--activation-fn", "gelu", "--dropout", opts["dropout"],
        "--attention-dropout", opts["attention_dropout"],
        "--activation-dropout", 0.0, "--pooler-dropout", opts["pooler_dropout"],
        "--pooler-activation-fn", "tanh", "--layer-norm-eps", repr(opts["layer_norm_eps"]), *bpe_flags,
        *position_flags,
    ]
    return [str(arg) for arg in line]


def bpe_flags(model_type, out_dir, settings):
    """The fairseq --bpe flags that encode text as the HF tokenizer, with the tokenizer files of OUT."""
    if model_type == "bert":
        flags = ["--bpe", "bert", "--bpe-vocab-file", os.path.join(out_dir, "vocab.txt")]
        return flags + (["--bpe-cased"] if settings["bpe_cased"] else [])
    flags = ["--bpe", "hf_byte_bpe", "--bpe-vocab", os.path.join(out_dir, "vocab.json"),
             "--bpe-merges", os.path.join(out_dir, "merges.txt")]
    return flags + (["--bpe-add-prefix-space"] if settings["bpe_add_prefix_space"] else [])


def check_out_is_not_the_model(out_dir, hf_dir):
    if os.path.realpath(out_dir) == os.path.realpath(hf_dir):
        raise HfCheckpointError(f"--out {out_dir} is the --hf-model folder, whose tokenizer files the "
                                "converted ones would replace: give another --out")


class Conversion(NamedTuple):
    """What a model type's conversion reads and writes: ``check(config, path)`` refuses what the plugin
    cannot represent; ``tokenizer(hf_dir)`` gives the tokenizer files ``{name: (text or bytes, where)}``
    copied into OUT; ``vocabulary(files, config, tokenizer_config)`` gives (plugin id -> HF id, dict.txt
    lines, BPE settings); ``bpe_flags(out_dir, settings)`` the fairseq --bpe flags; ``model_flags(config)``
    the position flags; ``max_positions(config)``; ``state_dict(hf, config, order, expected_shapes,
    weights_path)`` the plugin state dict; ``arch_family`` the presets written (bert_a, deberta)."""

    check: Callable
    tokenizer: Callable
    vocabulary: Callable
    bpe_flags: Callable
    model_flags: Callable
    max_positions: Callable
    state_dict: Callable
    arch_family: str
    bpe: str


def _bert_or_roberta(model_type):
    family = FAMILIES[model_type]
    return Conversion(
        check=check_config,
        tokenizer=lambda hf_dir: tokenizer_files(hf_dir, family.tokenizer_files, model_type),
        vocabulary=VOCABULARIES[model_type],
        bpe_flags=lambda out_dir, settings: bpe_flags(model_type, out_dir, settings),
        model_flags=lambda config: [],
        max_positions=lambda config: config["max_position_embeddings"] - position_offset(model_type, config),
        state_dict=lambda hf, config, order, expected, path: map_state_dict(
            hf, family, config, order, position_offset(model_type, config), expected, path),
        arch_family="bert_a",
        bpe=family.bpe,
    )


CONVERSIONS = {model_type: _bert_or_roberta(model_type) for model_type in FAMILIES}


def conversion_of(config, path, conversions):
    """The :class:`Conversion` of the model type of ``config`` (read from ``path``), its config checked."""
    model_type = config.get("model_type")
    if model_type not in conversions:
        raise HfCheckpointError(f"{path}: model_type {model_type!r} is not supported; tupe-convert-hf "
                                f"converts {', '.join(repr(t) for t in conversions)} masked language models "
                                f"and the folders of tupe-export-hf ({EXPORT_MODEL_TYPE!r})")
    conversions[model_type].check(config, path)
    return conversions[model_type]


def convert(hf_dir, out_dir, arch=None, force=False, conversions=CONVERSIONS):
    """Write ``out_dir/model.pt``, ``dict.txt`` and the tokenizer files; return the checkpoint path.

    ``conversions``: {model_type: :class:`Conversion`} of the model types accepted. Written into a folder
    beside ``out_dir`` first and moved into place only when the conversion succeeded; files already in
    ``out_dir`` are replaced only with ``force``.
    """
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    out_dir = os.path.abspath(out_dir)
    check_out_is_not_the_model(out_dir, hf_dir)
    config = read_json(hf_dir, CONFIG)
    if hf_import.is_export(config):  # a folder of tupe-export-hf
        return hf_import.convert_export(hf_dir, out_dir, config, *load_weights(hf_dir), arch=arch,
                                        force=force)
    conversion = conversion_of(config, os.path.join(hf_dir, CONFIG), conversions)
    tokenizer = conversion.tokenizer(hf_dir)
    names = (CHECKPOINT_NAME, "dict.txt", *tokenizer)
    check_output_folder(out_dir, force, names)
    opts = model_options(config)
    max_positions = conversion.max_positions(config)
    if max_positions < 1:
        raise HfCheckpointError(f"{CONFIG}: max_position_embeddings = {config['max_position_embeddings']} "
                                "leaves no position after RoBERTa's offset of pad_token_id + 1")
    dims = tuple(opts[k] for k in ("encoder_layers", "encoder_embed_dim", "encoder_attention_heads",
                                   "encoder_ffn_embed_dim"))
    written, swap = choose_arch(dims, arch, conversion.arch_family)
    tokenizer_config = read_json(hf_dir, TOKENIZER_CONFIG, required=False)
    order, lines, bpe_settings = conversion.vocabulary(tokenizer, config, tokenizer_config)
    hf, weights_path = load_weights(hf_dir)
    folder = make_sibling_folder(out_dir)
    try:
        with open(os.path.join(folder, "dict.txt"), "w", encoding="utf-8") as f:
            f.writelines(lines)
        for name, (content, _) in tokenizer.items():
            binary = isinstance(content, bytes)
            with open(os.path.join(folder, name), "wb" if binary else "w",
                      **({} if binary else {"encoding": "utf-8"})) as f:
                f.write(content)
        train_args = options.parse_args_and_arch(options.get_training_parser(), plugin_command_line(
            opts, written, max_positions, folder, conversion.bpe_flags(out_dir, bpe_settings),
            conversion.model_flags(config)))
        cfg = convert_namespace_to_omegaconf(train_args)
        task = tasks.setup_task(cfg.task)
        assert len(task.source_dictionary) == len(order), "dictionary rows"
        model = task.build_model(cfg.model)
        expected = {key: value.shape for key, value in model.state_dict().items()}
        model.load_state_dict(conversion.state_dict(hf, config, order, expected, weights_path), strict=True)
        cfg.task.data = out_dir
        state = converted_state(cfg, model, hf_dir, hf_token_ids=order)
        torch.save(state, os.path.join(folder, CHECKPOINT_NAME))
        move_into_place(folder, out_dir, force, names)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    target = os.path.join(out_dir, CHECKPOINT_NAME)
    if order[:4] != list(range(4)):
        logger.info("dict.txt: the HF ids %s are <s> <pad> </s> <unk> (ids 0-3), HF id %d is <mask> (id %d), "
                    "the other tokens follow in the HF order", order[:4], order[-1], len(order) - 1)
    logger.info("wrote %s (%s, --bpe %s, %d tensors), dict.txt and %s", target, written, conversion.bpe,
                len(state["model"]), " ".join(tokenizer))
    if swap is not None:
        continuation = ["fairseq-train", "DATA", "--user-dir", PLUGIN_DIR, "--task", "masked_lm",
                        "--arch", swap, SWAP_FLAG, target, "--tokens-per-sample", str(max_positions)]
        if size_name(dims) is None:
            continuation += [str(arg) for arg in size_flags(opts)]
        logger.info("to continue as %s (its position encoding swapped in): %s ...", swap,
                    " ".join(continuation))
    return target
