"""Hugging Face DeBERTa (``deberta``, v1) and DeBERTa-v2/v3 (``deberta-v2``) masked-LM checkpoints, converted
into plugin ``deberta_*`` checkpoints by :func:`tupe_plugin.conversion.hf.convert` (He, Liu, Gao, Chen,
"DeBERTa: Decoding-enhanced BERT with Disentangled Attention", arXiv 2006.03654; v2/v3 from their released
configurations). The mapping is written from transformers' ``DebertaModel`` and ``DebertaV2Model``:

* Attention: the released form the plugin builds by default, the p2c term reading delta(i, j)
  (``--deberta-p2c released``). v1 projects q, k, v with one ``in_proj`` whose rows are laid out head by
  head (q, k, v of head 0, then of head 1, ...) plus ``q_bias`` and ``v_bias`` (k has none); its relative
  projections are ``pos_q_proj`` (with a bias: ``--deberta-rel-proj-bias query``) and ``pos_proj``
  (without). v2/v3 project q, k, v separately, with biases, and the table by ``pos_query_proj`` /
  ``pos_key_proj`` (both biased: ``--deberta-rel-proj-bias both``) or, with ``share_att_key``, by the
  content projections (``--deberta-share-att-key``); ``norm_rel_ebd = layer_norm`` normalises the table by
  the encoder's ``LayerNorm`` (``--deberta-table-norm``); ``position_buckets`` are ``--deberta-buckets``.
* Distances: ``max_relative_positions`` (``max_position_embeddings`` when < 1) is
  ``--deberta-max-distance``. The plugin clips |i - j| to K - 1 before the log buckets, as Microsoft's
  code does; transformers does not, and their tables differ for a distance of K or more, that is for inputs
  longer than K tokens (512 with the released settings): the converted model follows Microsoft's code there.
* Positions: ``position_biased_input`` adds a learned table at the input (``--abs-pos learned``; the
  released v1 and v3 add none); row 0 of ``token_type_embeddings`` is added to its rows (fairseq feeds no
  segment ids).
* Ids: ``[CLS] [PAD] [SEP] [UNK]`` become fairseq's ``<s> <pad> </s> <unk>`` (ids 0-3) and ``[MASK]`` the
  last id, the other tokens follow in their HF order. v1's byte-level BPE (``vocab.json`` and
  ``merges.txt``, or the vocabulary of ``tokenizer.json``) is fairseq's ``--bpe hf_byte_bpe`` with HF ids as
  symbols; v2/v3's sentencepiece model ``spm.model`` is ``--bpe sentencepiece`` with its pieces as symbols
  (copied into OUT as ``sentencepiece.bpe.model``).
  Rows of the HF embedding past the tokenizer's tokens (v2/v3 pad it to 128100) are dropped, said in the
  log.
* The masked-LM head: the legacy ``cls.predictions`` or the current ``lm_predictions.lm_head`` (dense, GELU,
  LayerNorm, the word embeddings tied, a bias).
* A v2/v3 tokenizer that lowercases the text or splits it at punctuation before its sentencepiece model
  (``do_lower_case``, ``split_by_punct`` of ``tokenizer_config.json``) is refused naming the option:
  fairseq's ``--bpe sentencepiece`` applies the model alone.
* Refused, in one line naming the file and field: no relative attention, position terms other than c2p
  and p2c together, talking heads, an embedding size other than the hidden size, v2's convolution layer,
  another head size, a table normalisation other than a LayerNorm, token types without an input position
  table.
"""

import logging
import os
import re

import torch

from tupe_plugin.conversion.hf import (CONVERSIONS, FAIRSEQ_MASK, FAIRSEQ_SPECIALS, HEAD, LAYER_PARTS, PLUGIN,
                                       SPECIAL_FIELDS, TOKENIZER_CONFIG, Conversion, HfCheckpointError,
                                       check_ids, check_sizes, convert, fairseq_order, parse_json,
                                       special_token, tokenizer_files)
from tupe_plugin.user_input.memory_limits import beyond_memory

logger = logging.getLogger("convert_hf")

DEBERTA_V1, DEBERTA_V2 = "deberta", "deberta-v2"
SPM = "spm.model"
FAIRSEQ_SPM = "sentencepiece.bpe.model"  # the name fairseq's examples and the plugin's hub look for
BASE = "deberta."
V1_TOKENIZER_FILES = ("vocab.json", "merges.txt")
# the two masked-LM heads transformers has had: (prefix, transform dense, transform LayerNorm)
HEADS = (("cls.predictions.", "transform.dense.", "transform.LayerNorm."),
         ("lm_predictions.lm_head.", "dense.", "LayerNorm."))


def max_distance(config):
    """k of the plugin: ``max_relative_positions``, or ``max_position_embeddings`` when it is < 1."""
    distance = config.get("max_relative_positions", -1)
    return distance if isinstance(distance, int) and distance >= 1 else config["max_position_embeddings"]


def buckets(config):
    """``position_buckets`` of a v2 config, 0 for none."""
    value = config.get("position_buckets", -1)
    return value if isinstance(value, int) and value > 0 else 0


def attention_types(config):
    value = config.get("pos_att_type") or []
    return sorted(t.strip() for t in (value.lower().split("|") if isinstance(value, str) else value))


def table_norms(config):
    return [x.strip() for x in str(config.get("norm_rel_ebd", "none")).lower().split("|")]


def check_deberta_config(config, path):
    """Refuse a DeBERTa ``config.json`` (HF's defaults where a field is absent) the plugin cannot build."""
    v2 = config.get("model_type") == DEBERTA_V2
    check_sizes(config, path)
    heads = config["num_attention_heads"]
    refusals = (
        ("relative_attention", False, True,
         "without it DeBERTa is BERT with learned positions: convert it as a BERT model"),
        ("talking_head", False, False, "the plugin's heads attend independently"),
        ("hidden_act", "gelu", "gelu", "the plugin's layers and MLM head apply fairseq's exact GELU"),
        ("embedding_size", config["hidden_size"], config["hidden_size"],
         "the plugin's embeddings have the model dimension (no embed_proj)"),
        ("conv_kernel_size", 0, 0, "the plugin has no convolution layer beside the first layer"),
        ("attention_head_size", config["hidden_size"] // heads, config["hidden_size"] // heads,
         "the plugin's heads divide the model dimension"),
        ("tie_word_embeddings", True, True, "the plugin's MLM head shares the word embeddings"),
    )
    for field, default, supported, why in refusals:
        if config.get(field, default) != supported:
            raise HfCheckpointError(f"{path}: {field} = {config.get(field, default)!r} is not supported "
                                    f"({why})")
    if attention_types(config) != ["c2p", "p2c"]:
        raise HfCheckpointError(f"{path}: pos_att_type = {config.get('pos_att_type')!r} is not supported: "
                                "the plugin's DeBERTa adds both position terms, c2p and p2c")
    norms = table_norms(config)
    if v2 and set(norms) - {"none", "layer_norm"}:
        raise HfCheckpointError(f"{path}: norm_rel_ebd = {config.get('norm_rel_ebd')!r} is not supported: "
                                "the plugin normalises the relative table by a LayerNorm or not at all")
    if config.get("type_vocab_size", 0) > 0 and not config.get("position_biased_input", True):
        raise HfCheckpointError(f"{path}: type_vocab_size = {config['type_vocab_size']} without "
                                "position_biased_input: the plugin adds a token type row to the input "
                                "position table, and this model has none")
    field, rows = ("position_buckets", buckets(config)) if buckets(config) else \
        ("max_relative_positions", max_distance(config))
    dim = config["hidden_size"]
    if problem := beyond_memory(f"{field} = {rows}", f"relative table (2 x {rows} rows of {dim})",
                                2 * rows * dim * 4):
        raise HfCheckpointError(f"{path}: {problem} (512, as released): correct {field}")
    half = buckets(config) // 2
    if buckets(config) and (buckets(config) % 2 or max_distance(config) - 1 <= half):
        raise HfCheckpointError(f"{path}: position_buckets = {buckets(config)} with max_relative_positions "
                                f"{max_distance(config)}: the plugin's log buckets need an even number and "
                                "a largest distance beyond half of them")


def model_flags(config):
    """The plugin's position flags of a checked DeBERTa config."""
    v2 = config.get("model_type") == DEBERTA_V2
    shared = v2 and bool(config.get("share_att_key", False))
    flags = ["--rel-pos", "deberta", "--deberta-p2c", "released",
             "--deberta-max-distance", str(max_distance(config)),
             "--abs-pos", "learned" if config.get("position_biased_input", True) else "none"]
    if buckets(config):
        flags += ["--deberta-buckets", str(buckets(config))]
    if shared:
        flags.append("--deberta-share-att-key")
    else:
        flags += ["--deberta-rel-proj-bias", "both" if v2 else "query"]
    if v2 and "layer_norm" in table_norms(config):
        flags.append("--deberta-table-norm")
    return flags


# ---------------------------------------------------------------- vocabulary

def _order(ids, size, where):
    """:func:`~tupe_plugin.conversion.hf.fairseq_order`, refusing special tokens that share an id."""
    if len(set(ids.values())) != len(SPECIAL_FIELDS):
        raise HfCheckpointError(f"{where}: two of [CLS] [PAD] [SEP] [UNK] [MASK] share an id ({ids})")
    return fairseq_order(ids, size)


def v1_tokenizer(hf_dir):
    return tokenizer_files(hf_dir, V1_TOKENIZER_FILES, DEBERTA_V1)


def v1_vocabulary(files, config, tokenizer_config):
    """(plugin id -> HF id, dict.txt lines of HF ids, --bpe hf_byte_bpe settings) of v1's byte-level BPE."""
    text, path = files["vocab.json"]
    vocab = parse_json(text, path)
    check_ids(vocab, path)
    ids = {}
    for field, default in SPECIAL_FIELDS:
        token = special_token(tokenizer_config.get(field), default)
        if token not in vocab:
            raise HfCheckpointError(f"{path} has no {token} (tokenizer_config.json {field}): pass the "
                                    "tokenizer saved with the model")
        ids[field] = vocab[token]
    order = _order(ids, len(vocab), path)
    _check_rows(path, order, config)
    lines = [f"{i} 1\n" for i in order[4:-1]]
    return order, lines, {"bpe_add_prefix_space": bool(tokenizer_config.get("add_prefix_space"))}


def v1_bpe_flags(out_dir, settings):
    flags = ["--bpe", "hf_byte_bpe", "--bpe-vocab", os.path.join(out_dir, "vocab.json"),
             "--bpe-merges", os.path.join(out_dir, "merges.txt")]
    return flags + (["--bpe-add-prefix-space"] if settings["bpe_add_prefix_space"] else [])


def v2_tokenizer(hf_dir):
    path = os.path.join(hf_dir, SPM)
    if not os.path.isfile(path):
        raise HfCheckpointError(f"--hf-model {hf_dir} has no {SPM}, the sentencepiece model of "
                                "DeBERTa-v2/v3's tokenizer, which fairseq's --bpe sentencepiece reads "
                                f"(tokenizer.json is not enough): copy {SPM} of the model's Hub repository "
                                "into the folder")
    with open(path, "rb") as f:
        return {FAIRSEQ_SPM: (f.read(), path)}


# What transformers' DebertaV2Tokenizer does to the text before the sentencepiece model when its
# tokenizer_config.json sets the option, which fairseq's --bpe sentencepiece (the model alone) does not.
V2_TEXT_OPTIONS = {
    "do_lower_case": ("lowercases the text", "'The' and 'the' are other pieces", "lowercase the text"),
    "split_by_punct": ("splits the text at every punctuation mark", "'began,' is 'began' ','",
                       "put a space around each punctuation mark of the text"),
}


def check_v2_text_options(tokenizer_config):
    """Refuse a DeBERTa-v2/v3 tokenizer that changes the text before its sentencepiece model, naming the
    option: the converted model's encoding would give other ids and lengths than transformers'."""
    for option, (does, example, by_hand) in V2_TEXT_OPTIONS.items():
        if tokenizer_config.get(option):
            raise HfCheckpointError(
                f"{TOKENIZER_CONFIG}: {option} = {tokenizer_config[option]!r}: DeBERTa-v2's tokenizer {does} "
                f"before its sentencepiece model and the converted model's --bpe sentencepiece does not "
                f"({example}), so it would encode text into other ids; to convert anyway, set {option} to "
                f"false in {TOKENIZER_CONFIG} and {by_hand} before encoding it")


def v2_vocabulary(files, config, tokenizer_config):
    """(plugin id -> HF id, dict.txt lines of pieces, {}) of v2/v3's sentencepiece model; [MASK] is the
    tokenizer's added token (after the pieces) or a piece."""
    import sentencepiece

    check_v2_text_options(tokenizer_config)

    proto, path = files[FAIRSEQ_SPM]
    try:
        model = sentencepiece.SentencePieceProcessor(model_proto=proto)
    except RuntimeError as error:
        raise HfCheckpointError(f"{path} is not a sentencepiece model ({error}): download it "
                                "again") from error
    pieces = [model.id_to_piece(i) for i in range(model.get_piece_size())]
    index = {piece: i for i, piece in enumerate(pieces)}
    added = {entry.get("content"): int(i) for i, entry in (tokenizer_config.get("added_tokens_decoder") or {})
             .items() if isinstance(entry, dict) and str(i).isdigit()}
    ids = {}
    for field, default in SPECIAL_FIELDS:
        token = special_token(tokenizer_config.get(field), default)
        found = index.get(token, added.get(token))
        if found is None and field == "mask_token":
            found = len(pieces)  # transformers adds [MASK] right after the pieces
        if found is None:
            raise HfCheckpointError(f"{path} has no piece {token} (tokenizer_config.json {field}): pass the "
                                    "spm.model saved with the model")
        ids[field] = found
    order = _order(ids, len(pieces), path)
    _check_rows(path, order, config)
    bad = [pieces[i] for i in order[4:-1] if pieces[i] in FAIRSEQ_SPECIALS + (FAIRSEQ_MASK,)
           or pieces[i].split() != [pieces[i]]]
    if bad:
        raise HfCheckpointError(f"{path}: the piece {bad[0]!r} is one of fairseq's special symbols or holds "
                                "whitespace; fairseq's dict.txt cannot hold it")
    return order, [f"{pieces[i]} 1\n" for i in order[4:-1]], {}


def v2_bpe_flags(out_dir, settings):
    return ["--bpe", "sentencepiece", "--sentencepiece-model", os.path.join(out_dir, FAIRSEQ_SPM)]


def _check_rows(path, order, config):
    """Refuse a tokenizer with ids past the embedding; log the rows no token uses (v2/v3's padding)."""
    if max(order) >= config["vocab_size"]:
        raise HfCheckpointError(f"{path} holds ids up to {max(order)} but config.json vocab_size is "
                                f"{config['vocab_size']}: pass the tokenizer saved with the model")
    if len(order) < config["vocab_size"]:
        logger.info("%d rows of the word embeddings belong to no token of the tokenizer's %d (unused): "
                    "dropped", config["vocab_size"] - len(order), len(order))


# ---------------------------------------------------------------- weights

def _head(hf, weights_path):
    for prefix, dense, norm in HEADS:
        if prefix + "bias" in hf:
            return prefix, dense, norm
    raise HfCheckpointError(f"{weights_path}: no masked-LM head (cls.predictions.bias or "
                            "lm_predictions.lm_head.bias): convert a DebertaForMaskedLM / "
                            "DebertaV2ForMaskedLM checkpoint")


def _v1_in_proj(weight, q_bias, v_bias, heads):
    """v1's in_proj (rows laid out head by head: q, k, v of each) as the plugin's [q; k; v] and its bias."""
    per_head = weight.view(heads, 3, -1, weight.size(-1))
    stacked = per_head.transpose(0, 1).reshape(weight.shape)
    return stacked, torch.cat([q_bias, torch.zeros_like(q_bias), v_bias])


def state_dict(hf, config, order, expected_shapes, weights_path):
    """The plugin state dict of DeBERTa's HF weights; errors name missing, unexpected and misshapen keys."""
    v2 = config.get("model_type") == DEBERTA_V2
    head, head_dense, head_norm = _head(hf, weights_path)
    hf = dict(hf)
    used = set()

    def take(key):
        if key not in hf:
            raise HfCheckpointError(f"{weights_path}: missing {key}")
        used.add(key)
        return hf[key]

    embeddings = BASE + "embeddings."
    words = take(embeddings + "word_embeddings.weight")
    mapped = {
        PLUGIN + "embed_tokens.weight": words[order],
        PLUGIN + "layernorm_embedding.weight": take(embeddings + "LayerNorm.weight"),
        PLUGIN + "layernorm_embedding.bias": take(embeddings + "LayerNorm.bias"),
        PLUGIN + "positional_term.disentangled.weight": take(BASE + "encoder.rel_embeddings.weight"),
        HEAD + "weight": words[order],
        HEAD + "bias": take(head + "bias")[order],
    }
    if config.get("position_biased_input", True):
        positions = take(embeddings + "position_embeddings.weight")
        if config.get("type_vocab_size", 0) > 0:
            positions = positions + take(embeddings + "token_type_embeddings.weight")[0]
        mapped[PLUGIN + "embed_positions.weight"] = positions
    if v2 and "layer_norm" in table_norms(config):
        for name in ("weight", "bias"):
            norm = take(BASE + "encoder.LayerNorm." + name)
            mapped[PLUGIN + "positional_term.disentangled.norm." + name] = norm
    for name in ("weight", "bias"):
        mapped[HEAD + "dense." + name] = take(head + head_dense + name)
        mapped[HEAD + "layer_norm." + name] = take(head + head_norm + name)
    shared = v2 and bool(config.get("share_att_key", False))
    for layer in range(config["num_hidden_layers"]):
        source, target = f"{BASE}encoder.layer.{layer}.", f"{PLUGIN}layers.{layer}."
        attention = source + "attention.self."
        if v2:
            for name in ("weight", "bias"):
                mapped[target + "self_attn.in_proj." + name] = torch.cat(
                    [take(f"{attention}{part}.{name}") for part in ("query_proj", "key_proj", "value_proj")])
            relative = None if shared else (attention + "pos_query_proj.", attention + "pos_key_proj.")
        else:
            weight, bias = _v1_in_proj(take(attention + "in_proj.weight"), take(attention + "q_bias"),
                                       take(attention + "v_bias"), config["num_attention_heads"])
            mapped[target + "self_attn.in_proj.weight"] = weight
            mapped[target + "self_attn.in_proj.bias"] = bias
            relative = (attention + "pos_q_proj.", attention + "pos_proj.")
        if relative is not None:
            projections = target + "self_attn.relative_projections."
            for side, key in zip(("query.", "key."), relative):
                for name in ("weight", "bias"):
                    if key + name in hf:
                        mapped[projections + side + name] = take(key + name)
        for plugin_part, hf_part in LAYER_PARTS:
            for name in ("weight", "bias"):
                mapped[target + plugin_part + name] = take(source + hf_part + name)
    tied = {head + "decoder.weight": words, head + "decoder.bias": hf[head + "bias"]}
    for key, kept in tied.items():
        if key in hf and not torch.equal(hf[key], kept):
            raise HfCheckpointError(f"{weights_path}: {key} differs from the weights it is tied to; the "
                                    "plugin's MLM head ties them")
    unexpected = sorted(key for key in set(hf) - used - set(tied) if not re.search(r"\.position_ids$", key))
    if unexpected:
        raise HfCheckpointError(f"{weights_path}: no place in the plugin's DeBERTa for "
                                + ", ".join(unexpected[:4]) + (", ..." if len(unexpected) > 4 else ""))
    missing = sorted(set(expected_shapes) - set(mapped))
    if missing:
        raise HfCheckpointError(f"{weights_path}: the plugin's DeBERTa needs {', '.join(missing[:4])}, which "
                                "the checkpoint does not give")
    misshapen = [f"{key}: {tuple(tensor.shape)}, config.json gives {tuple(expected_shapes[key])}"
                 for key, tensor in mapped.items() if tensor.shape != expected_shapes.get(key, tensor.shape)]
    if misshapen:
        raise HfCheckpointError(f"{weights_path}: {len(misshapen)} sizes differ from config.json's (plugin "
                                "key: checkpoint, config) " + "; ".join(misshapen[:3]))
    if buckets(config):
        logger.info("the converted model clips distances to %d - 1 before the log buckets, as Microsoft's "
                    "DeBERTa code does; transformers' port does not, and differs from it for inputs longer "
                    "than %d tokens", max_distance(config), max_distance(config))
    return mapped


DEBERTA_CONVERSIONS = {
    DEBERTA_V1: Conversion(check_deberta_config, v1_tokenizer, v1_vocabulary, v1_bpe_flags, model_flags,
                           lambda config: config["max_position_embeddings"], state_dict, "deberta",
                           "hf_byte_bpe"),
    DEBERTA_V2: Conversion(check_deberta_config, v2_tokenizer, v2_vocabulary, v2_bpe_flags, model_flags,
                           lambda config: config["max_position_embeddings"], state_dict, "deberta",
                           "sentencepiece"),
}
ALL_CONVERSIONS = dict(CONVERSIONS, **DEBERTA_CONVERSIONS)


def convert_any(hf_dir, out_dir, arch=None, force=False):
    """:func:`tupe_plugin.conversion.hf.convert` of a BERT, RoBERTa or DeBERTa (v1 to v3) folder."""
    return convert(hf_dir, out_dir, arch, force, conversions=ALL_CONVERSIONS)

