"""Native exports: a plugin model that one of transformers' own classes computes is written as that class
(its ``model_type``, its weight names, no ``auto_map`` and no code), so that it loads without
``trust_remote_code``; and read back by ``tupe-convert-hf``.

Which class: every position encoding the model uses declares it (``hf_native`` of its registry entry,
:mod:`tupe_plugin.encodings.encoding`); a model without position encoding is RoBERTa with a zero position
table. Each class here says what else of the model it computes (:meth:`NativeClass.differences`): a model
that differs from it in anything that changes outputs (pre-LN, no embedding LayerNorm, an activation the
class does not apply, a head the class does not have) is exported with the remote code instead, and the
export says why.

RoBERTa (Liu et al., arXiv 1907.11692, as transformers' ``RobertaModel``): post-LN BERT layers, q, k, v
projected apart (the plugin's ``in_proj`` split in three), a learned position table read at ``pad + 1 + t``
for the t-th token of a right-padded row (fairseq's offset), a token-type table (one row of zeros: fairseq
feeds none), the embedding LayerNorm; the masked-LM head (dense, GELU, LayerNorm, the word embeddings tied,
a bias), the classification head (dense, tanh, projection on the first token) and the span head (one linear
map to start and end logits, ``qa_outputs``). The plugin's absolute encoding, learned or sinusoidal, is
written as the rows of that table (rows 0 and 1 zeros); without one the table is zeros. RoFormer for the
fixed RoPE: :class:`RoFormer`; DeBERTa-v2 for DeBERTa without the Enhanced Mask Decoder: :class:`DebertaV2`.

The plugin's settings go into ``config.json`` as ``fairseq_model_args`` (with the heads' names and the
tensors the native weights do not hold, such as learned sinusoid frequencies, under ``fairseq_tensors``), so
that ``tupe-convert-hf`` rebuilds the same plugin architecture from the folder.
"""

import torch

from tupe_plugin.conversion.hf_names import LAYER_PARTS, LM_HEAD, QKV_PARTS, exported_head
from tupe_plugin.models.model_flags import value_in_use

PLUGIN = "encoder.sentence_encoder."
POSITIONS = PLUGIN + "embed_positions."
# fairseq's padding index: RoBERTa's position of the t-th token is PAD + 1 + t
PAD = 1
# a model without any position encoding: RoBERTa with a table of zeros
NO_POSITION_TYPE = "roberta"
# the plugin's activations (--activation-fn) that transformers applies as the same function (ACT2FN)
ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "tanh": "tanh", "linear": "linear"}


def absolute_module(position):
    """The plugin module of ``position``'s absolute encoding (the registry's ``absolute`` kind), or None."""
    encoding = next((encoding for encoding in position.encodings() if encoding.kind == "absolute"), None)
    return None if encoding is None else encoding.build(position)


def absolute_table(position, state_dict, rows):
    """(rows, C) float32: what the absolute encoding adds at positions 0..rows-1 (zeros without one), and
    {plugin key: tensor} of its tensors that are not that table (sinusoid frequencies)."""
    module = absolute_module(position)
    if module is None:
        return torch.zeros(rows, position.embed_dim), {}
    own = {key[len(POSITIONS):]: value for key, value in state_dict.items() if key.startswith(POSITIONS)}
    module.load_state_dict(own)
    with torch.no_grad():
        table = module(rows).float()
    return table, {POSITIONS + key: value for key, value in own.items() if key != "weight"}


class NativeClass:
    """One transformers architecture a plugin model may be exported as."""

    model_type = None
    name = None  # e.g. "RoBERTa"
    classes = {}  # {"masked_lm"/"classification"/"span": transformers class name}
    base = None  # the base model's prefix in the weights ("roberta.")
    qkv = QKV_PARTS  # its q, k, v projections' names in a layer

    def architecture(self, heads):
        """config.json's ``architectures``: the class of the exported head."""
        kind = "classification" if heads["classification"] else "span" if heads["span"] else "masked_lm"
        return [self.classes[kind]]

    def differences(self, args, position, heads, tensors):
        """What of the plugin model the class does not compute, each a phrase naming the flag; [] when it
        computes the plugin's outputs."""
        differences = []
        if args.encoder_normalize_before:
            differences.append(f"the model is pre-LN (--encoder-normalize-before) and {self.name} post-LN")
        if not args.layernorm_embedding:
            differences.append(f"the model has no embedding LayerNorm (--no-layernorm-embedding) and "
                               f"{self.name} normalises the embeddings")
        if args.activation_fn not in ACTIVATIONS:
            differences.append(f"--activation-fn {args.activation_fn}: {self.name} has no such activation")
        if position.cls_reset_applies:
            differences.append(f"--cls-reset {position.cls_reset}: {self.name} has no [CLS] reset")
        if heads["classification"] and heads["span"]:
            rows = tensors["classifier.out_proj.weight"].size(0)
            if rows != 2:
                differences.append(f"the classification head has {rows} classes and a span head is "
                                   f"exported too: {self.classes['span']} reads num_labels as its 2 outputs")
        return differences

    def notes(self, args, position):
        """What a user of the export should know (the model card's notes)."""
        return []

    def config(self, args, vocabulary, position):
        """config.json's fields of the model (the sizes, the dropouts, the ids)."""
        return dict(
            model_type=self.model_type, vocab_size=len(vocabulary), hidden_size=args.encoder_embed_dim,
            num_hidden_layers=args.encoder_layers, num_attention_heads=args.encoder_attention_heads,
            intermediate_size=args.encoder_ffn_embed_dim, hidden_act=ACTIVATIONS[args.activation_fn],
            hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.attention_dropout,
            classifier_dropout=args.pooler_dropout, type_vocab_size=1, pad_token_id=PAD, bos_token_id=0,
            eos_token_id=2, tie_word_embeddings=True, is_decoder=False, add_cross_attention=False,
        )

    def layer_tensors(self, state_dict, layers):
        """{transformers name: tensor} of the encoder layers."""
        tensors = {}
        for n in range(layers):
            plugin, hf = f"{PLUGIN}layers.{n}.", f"{self.base}encoder.layer.{n}."
            for name in ("weight", "bias"):
                for part, value in zip(self.qkv, state_dict[plugin + "self_attn.in_proj." + name].chunk(3)):
                    tensors[hf + part + name] = value
                for plugin_part, hf_part in LAYER_PARTS:
                    tensors[hf + hf_part + name] = state_dict[plugin + plugin_part + name]
        return tensors

    def plugin_layers(self, weights, layers):
        """The plugin's layer tensors of the exported ones (:meth:`layer_tensors` read back)."""
        state = {}
        for n in range(layers):
            plugin, hf = f"{PLUGIN}layers.{n}.", f"{self.base}encoder.layer.{n}."
            for name in ("weight", "bias"):
                state[plugin + "self_attn.in_proj." + name] = torch.cat([weights[hf + part + name]
                                                                         for part in self.qkv])
                for plugin_part, hf_part in LAYER_PARTS:
                    state[plugin + plugin_part + name] = weights[hf + hf_part + name]
        return state


class BertLike(NativeClass):
    """A transformers BERT variant: embeddings (words, a token-type row of zeros where ``token_types``,
    LayerNorm), the layers, the masked-LM head (``lm_head_parts``: the plugin's dense and LayerNorm,
    ``lm_bias``: its bias; only in a masked-LM export, :func:`~.hf_names.exported_head`), the classifier
    (``classifier_parts``: the plugin head's dense and out_proj) and ``qa_outputs``; the position encoding's
    tensors from :meth:`position_tensors`."""

    lm_head_parts = ()
    lm_bias = None
    token_types = True
    classifier_parts = (("dense.", "classifier.dense."), ("out_proj.", "classifier.out_proj."))

    @property
    def embeddings(self):
        return self.base + "embeddings."

    def position_tensors(self, state_dict, args, position):
        """({transformers name: tensor} of the position encoding, {plugin key: tensor} the weights do not
        hold)."""
        raise NotImplementedError

    def plugin_positions(self, weights, args, position):
        """The plugin's position tensors that come back from the exported weights."""
        return {}

    def tensors(self, state_dict, args, position, heads):
        """({transformers name: tensor}, {plugin key: tensor} the weights do not hold)."""
        tensors, kept = self.position_tensors(state_dict, args, position)
        tensors[self.embeddings + "word_embeddings.weight"] = state_dict[PLUGIN + "embed_tokens.weight"]
        lm_head_parts = self.lm_head_parts if exported_head(heads) == "masked_lm" else ()
        if lm_head_parts:
            tensors[self.lm_bias] = state_dict[LM_HEAD + "bias"]
        if self.token_types:
            tensors[self.embeddings + "token_type_embeddings.weight"] = torch.zeros(1, args.encoder_embed_dim)
        for name in ("weight", "bias"):
            tensors[self.embeddings + "LayerNorm." + name] = \
                state_dict[PLUGIN + "layernorm_embedding." + name]
            for plugin, hf in lm_head_parts:
                tensors[hf + name] = state_dict[LM_HEAD + plugin + name]
            if heads["classification"]:
                for part, hf in self.classifier_parts:
                    tensors[hf + name] = \
                        state_dict[f"classification_heads.{heads['classification']}.{part}{name}"]
            if heads["span"]:
                tensors["qa_outputs." + name] = state_dict[f"span_heads.{heads['span']}.out_proj.{name}"]
        tensors.update(self.layer_tensors(state_dict, args.encoder_layers))
        return tensors, kept

    def plugin_state(self, weights, args, position, heads, kept):
        """The plugin state dict of the exported ``weights`` and the ``kept`` tensors of config.json; the
        masked-LM head's weight is the word embeddings, its other tensors those of the weights where they
        hold them (the export of a classifier or a span head holds none: ``tupe-convert-hf`` initialises
        them)."""
        words = weights[self.embeddings + "word_embeddings.weight"]
        state = {PLUGIN + "embed_tokens.weight": words, LM_HEAD + "weight": words, **kept,
                 **self.plugin_positions(weights, args, position)}
        lm_head_parts = self.lm_head_parts if self.lm_bias in weights else ()
        if lm_head_parts:
            state[LM_HEAD + "bias"] = weights[self.lm_bias]
        for name in ("weight", "bias"):
            state[PLUGIN + "layernorm_embedding." + name] = weights[self.embeddings + "LayerNorm." + name]
            for plugin, hf in lm_head_parts:
                state[LM_HEAD + plugin + name] = weights[hf + name]
            if heads.get("classification"):
                for part, hf in self.classifier_parts:
                    state[f"classification_heads.{heads['classification']}.{part}{name}"] = \
                        weights[hf + name]
            if heads.get("span"):
                state[f"span_heads.{heads['span']}.out_proj.{name}"] = weights["qa_outputs." + name]
        state.update(self.plugin_layers(weights, args.encoder_layers))
        return state


class Roberta(BertLike):
    model_type = "roberta"
    name = "RoBERTa"
    classes = dict(masked_lm="RobertaForMaskedLM", classification="RobertaForSequenceClassification",
                   span="RobertaForQuestionAnswering")
    base = "roberta."
    lm_head_parts = (("dense.", "lm_head.dense."), ("layer_norm.", "lm_head.layer_norm."))
    lm_bias = "lm_head.bias"

    def differences(self, args, position, heads, tensors):
        differences = super().differences(args, position, heads, tensors)
        if args.activation_fn != "gelu" and args.activation_fn in ACTIVATIONS:
            differences.append(f"--activation-fn {args.activation_fn}: RoBERTa's masked-LM head applies GELU")
        if heads["classification"] and args.pooler_activation_fn != "tanh":
            differences.append(f"--pooler-activation-fn {args.pooler_activation_fn}: RoBERTa's "
                               "classification head applies tanh")
        return differences

    def notes(self, args, position):
        notes = [f"RoBERTa counts positions from pad + 1 = {PAD + 1} (fairseq's offset) over the tokens that "
                 "are not padding: pad on the right, as the plugin does"]
        if absolute_module(position) is None:
            notes.append("the model has no position encoding: its position table is zeros")
        elif "weight" not in absolute_module(position).state_dict():
            notes.append(f"the sinusoids are written out as the rows of the table, for the model's "
                         f"{args.max_positions} positions")
        return notes

    def config(self, args, vocabulary, position):
        return dict(super().config(args, vocabulary, position),
                    max_position_embeddings=args.max_positions + PAD + 1,
                    layer_norm_eps=value_in_use("layer_norm_eps", args.layer_norm_eps),
                    position_embedding_type="absolute")

    def position_tensors(self, state_dict, args, position):
        table, kept = absolute_table(position, state_dict, args.max_positions)
        rows = torch.cat([torch.zeros(PAD + 1, table.size(1)), table])
        return {self.embeddings + "position_embeddings.weight": rows}, kept

    def plugin_positions(self, weights, args, position):
        module = absolute_module(position)
        if module is None or "weight" not in module.state_dict():
            return {}
        rows = weights[self.embeddings + "position_embeddings.weight"][PAD + 1:PAD + 1 + args.max_positions]
        return {POSITIONS + "weight": rows + weights[self.embeddings + "token_type_embeddings.weight"][0]}


class RoFormer(BertLike):
    """RoFormer (Su et al., arXiv 2104.09864, as transformers' ``RoFormerModel``): post-LN BERT layers
    whose q and k are rotated by pairs (2k, 2k+1) by theta_k t, theta_k = 10000^(-2k/d_h), t counted from
    0 over the row, as the plugin's fixed RoPE; no absolute position. Its sinusoid table (sin of the angles,
    then their cos) is written from the plugin's angles. Its masked-LM head applies the layers' activation,
    and so does its classification head."""

    model_type = "roformer"
    name = "RoFormer"
    classes = dict(masked_lm="RoFormerForMaskedLM", classification="RoFormerForSequenceClassification",
                   span="RoFormerForQuestionAnswering")
    base = "roformer."
    lm_head_parts = (("dense.", "cls.predictions.transform.dense."),
                     ("layer_norm.", "cls.predictions.transform.LayerNorm."))
    lm_bias = "cls.predictions.bias"

    def differences(self, args, position, heads, tensors):
        differences = super().differences(args, position, heads, tensors)
        if heads["classification"] and args.pooler_activation_fn != args.activation_fn:
            differences.append(f"--pooler-activation-fn {args.pooler_activation_fn}: RoFormer's "
                               "classification head applies the layers' activation (--activation-fn "
                               f"{args.activation_fn})")
        return differences

    def config(self, args, vocabulary, position):
        return dict(super().config(args, vocabulary, position), max_position_embeddings=args.max_positions,
                    embedding_size=args.encoder_embed_dim, rotary_value=False,
                    layer_norm_eps=value_in_use("layer_norm_eps", args.layer_norm_eps))

    def position_tensors(self, state_dict, args, position):
        encoding = next(encoding for encoding in position.encodings() if encoding.kind == "rotation")
        module = encoding.build(position)
        prefix = f"{PLUGIN}positional_term.{encoding.slot}."
        own = {key[len(prefix):]: value for key, value in state_dict.items() if key.startswith(prefix)}
        module.load_state_dict(own)
        with torch.no_grad():
            angles = module.angles(torch.arange(args.max_positions)).float()
        table = torch.cat([angles.sin(), angles.cos()], -1)
        return {self.base + "encoder.embed_positions.weight": table}, {prefix + key: value
                                                                       for key, value in own.items()}


def relative_table(position, state_dict):
    """(the plugin's module of ``position``'s relative table read by every layer, loaded from
    ``state_dict``; its checkpoint key prefix): DeBERTa's shared table (the registry's ``relative_vectors``
    kind with a table the layers project, :meth:`layer_projection`)."""
    encoding = next(encoding for encoding in position.encodings() if encoding.kind == "relative_vectors")
    module = encoding.build(position)
    prefix = f"{PLUGIN}positional_term.{encoding.slot}."
    if state_dict is not None:
        module.load_state_dict({key[len(prefix):]: value for key, value in state_dict.items()
                                if key.startswith(prefix)})
    return module, prefix


class DebertaV2(BertLike):
    """DeBERTa-v2 (He, Liu, Gao, Chen, arXiv 2006.03654, as transformers' ``DebertaV2Model``) for the
    plugin's DeBERTa without the Enhanced Mask Decoder, in its released form (the p2c term reads
    delta(i, j)): post-LN layers whose q, k, v are projected apart, with c2p and p2c terms from one relative
    table (``rel_embeddings``, 2k rows, or 2N with ``position_buckets``; ``norm_rel_ebd`` its LayerNorm)
    projected by each layer's ``pos_query_proj`` and ``pos_key_proj`` (the plugin's W^{q,r}, W^{k,r}; a
    bias the plugin's projection does not have is written as zeros) or, with ``share_att_key``, by its
    content projections; an absolute table at the input (``position_biased_input``, positions from 0) where
    the plugin adds one, else none; no token types. Its masked-LM head is the released layout
    (``lm_predictions.lm_head``: dense, the layers' activation, LayerNorm, the word embeddings, a bias), its
    classifier a pooler (dense on the first token, ``pooler_hidden_act``) and a linear map. The exported
    classes are transformers' (the inverse of :mod:`.hf_deberta`'s import)."""

    model_type = "deberta-v2"
    name = "DeBERTa-v2"
    classes = dict(masked_lm="DebertaV2ForMaskedLM", classification="DebertaV2ForSequenceClassification",
                   span="DebertaV2ForQuestionAnswering")
    base = "deberta."
    qkv = ("attention.self.query_proj.", "attention.self.key_proj.", "attention.self.value_proj.")
    lm_head_parts = (("dense.", "lm_predictions.lm_head.dense."),
                     ("layer_norm.", "lm_predictions.lm_head.LayerNorm."))
    lm_bias = "lm_predictions.lm_head.bias"
    token_types = False
    classifier_parts = (("dense.", "pooler.dense."), ("out_proj.", "classifier."))
    # the plugin layer's relative projections (W^{q,r}, W^{k,r}) and transformers'
    projections = (("query.", "attention.self.pos_query_proj."), ("key.", "attention.self.pos_key_proj."))

    def differences(self, args, position, heads, tensors):
        differences = super().differences(args, position, heads, tensors)
        if heads["classification"] and args.pooler_activation_fn not in ACTIVATIONS:
            differences.append(f"--pooler-activation-fn {args.pooler_activation_fn}: DeBERTa-v2's pooler has "
                               "no such activation")
        return differences

    def notes(self, args, position):
        table, _ = relative_table(position, None)
        notes = ["the model's masked-LM head is DeBERTa-v2's released layout (`lm_predictions.lm_head`)"]
        if table.buckets and args.max_positions > table.max_distance:
            notes.append(f"equal to the plugin for distances |i - j| < {table.max_distance} "
                         "(max_relative_positions); beyond, Microsoft's DeBERTa code, which the plugin "
                         "follows, clips the distance before its log bucket and transformers' port does not, "
                         f"so inputs longer than {table.max_distance} tokens give other outputs here than in "
                         "the plugin")
        return notes

    def config(self, args, vocabulary, position):
        table, _ = relative_table(position, None)
        config = dict(super().config(args, vocabulary, position), type_vocab_size=0,
                      max_position_embeddings=args.max_positions,
                      layer_norm_eps=value_in_use("layer_norm_eps", args.layer_norm_eps),
                      relative_attention=True, max_relative_positions=table.max_distance,
                      position_buckets=table.buckets or -1, pos_att_type=["p2c", "c2p"],
                      share_att_key=table.layer_projection(position) is None,
                      norm_rel_ebd="none" if table.norm is None else "layer_norm",
                      position_biased_input=absolute_module(position) is not None,
                      pooler_hidden_act=ACTIVATIONS.get(args.pooler_activation_fn, "tanh"),
                      pooler_hidden_size=args.encoder_embed_dim, pooler_dropout=args.pooler_dropout,
                      cls_dropout=args.pooler_dropout, legacy=False)
        del config["classifier_dropout"]
        return config

    def position_tensors(self, state_dict, args, position):
        table, prefix = relative_table(position, state_dict)
        tensors = {self.base + "encoder.rel_embeddings.weight": state_dict[prefix + "weight"]}
        if table.norm is not None:
            for name in ("weight", "bias"):
                tensors[self.base + "encoder.LayerNorm." + name] = state_dict[prefix + "norm." + name]
        projection = table.layer_projection(position)
        for n in range(args.encoder_layers if projection is not None else 0):
            plugin, hf = f"{PLUGIN}layers.{n}.self_attn.relative_projections.", \
                f"{self.base}encoder.layer.{n}."
            for side, hf_side in self.projections:
                weight = state_dict[plugin + side + "weight"]
                tensors[hf + hf_side + "weight"] = weight
                tensors[hf + hf_side + "bias"] = state_dict.get(plugin + side + "bias",
                                                                 torch.zeros(weight.size(0)))
        kept = {}
        if absolute_module(position) is not None:
            rows, kept = absolute_table(position, state_dict, args.max_positions)
            tensors[self.embeddings + "position_embeddings.weight"] = rows
        return tensors, kept

    def plugin_positions(self, weights, args, position):
        table, prefix = relative_table(position, None)
        state = {prefix + "weight": weights[self.base + "encoder.rel_embeddings.weight"]}
        if table.norm is not None:
            for name in ("weight", "bias"):
                state[prefix + "norm." + name] = weights[self.base + "encoder.LayerNorm." + name]
        projection = table.layer_projection(position)
        own = () if projection is None else projection.state_dict()
        for n in range(args.encoder_layers if projection is not None else 0):
            plugin, hf = f"{PLUGIN}layers.{n}.self_attn.relative_projections.", \
                f"{self.base}encoder.layer.{n}."
            for side, hf_side in self.projections:
                for name in ("weight", "bias"):
                    if side + name in own:  # a bias the plugin's projection does not have: zeros
                        state[plugin + side + name] = weights[hf + hf_side + name]
        module = absolute_module(position)
        if module is not None and "weight" in module.state_dict():
            state[POSITIONS + "weight"] = weights[self.embeddings + "position_embeddings.weight"]
        return state


CLASSES = {native.model_type: native for native in (Roberta(), RoFormer(), DebertaV2())}


def native_class(args, position, heads, tensors):
    """(the :class:`NativeClass` the model is exported as, None) or (None, why not: the differences)."""
    every = []
    for encoding in position.encodings():
        types, why = encoding.native_types(position)
        if not types:
            return None, why or f"transformers has no class computing {encoding.label} " \
                                f"({encoding.selection(position)})"
        every.append((encoding, types))
    common = [model_type for model_type in (every[0][1] if every else (NO_POSITION_TYPE,))
              if all(model_type in types for _, types in every)]
    if not common:
        used = ", ".join(f"{encoding.label} ({types[0]})" for encoding, types in every)
        return None, f"the model combines encodings of several transformers classes: {used}"
    native = CLASSES.get(common[0])
    if native is None:
        return None, f"the export has no writer for transformers' {common[0]}"
    differences = native.differences(args, position, heads, tensors)
    if differences:
        return None, "; ".join(differences)
    return native, None
