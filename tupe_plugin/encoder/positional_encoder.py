"""BERT-style encoder stack: word embeddings (+ absolute PE), then layers sharing one PositionalTerm."""

import logging
from dataclasses import replace

from fairseq.modules import LayerDropModuleList, LayerNorm
from torch import nn

from ..attention.paths import SHARED_MASK_GRADIENT_PATHS, backend_note, backend_problem, plan_attention
from ..attention.shared_mask_gradient import gather_mask_gradient
from ..encodings.absolute_position import build_absolute_position
from ..encodings.position_config import PositionConfig, PositionFlagError
from ..encodings.positional_term import SharedPositionalTerm
from ..terms.parts import OffsetRows
from ..user_input.command_hints import model_setting
from .encoder_layer import PositionalEncoderLayer
from .enhanced_mask_decoder import build_enhanced_mask_decoder


logger = logging.getLogger(__name__)


class PositionalTransformerEncoder(nn.Module):
    """Encodes right-padded token batches; the content-free term is built once per forward.

    Hidden states are kept batch-first; ``inner_states`` are returned (T, B, C) as fairseq's
    RoBERTa does. ``--encoder-layerdrop p`` skips each layer with probability p in training
    (LayerDrop: Fan, Grave, Joulin, "Reducing Transformer Depth on Demand with Structured Dropout",
    arXiv 1909.11556); evaluation runs every layer, and the shared term is built once per forward
    either way. The attention dropout in effect is decided here, once, with the attention plan. With
    ``--deberta-emd`` the masked-LM features are the Enhanced Mask Decoder's (:mod:`.enhanced_mask_decoder`).
    """

    def __init__(self, args, embed_tokens):
        super().__init__()
        self.config = PositionConfig.from_args(args)
        embed_dim = args.encoder_embed_dim
        self.padding_idx = embed_tokens.padding_idx
        self.max_positions = args.max_positions
        self.attention_dropout = args.attention_dropout
        self.attention_backend = getattr(args, "attention_backend", "auto")
        problem = backend_problem(self.attention_backend, self.config, self.attention_dropout, model_setting)
        if problem:
            raise PositionFlagError(problem)
        note = backend_note(self.attention_backend)
        if note:
            logger.warning(note)
        self.embed_tokens = embed_tokens
        self.embed_positions = build_absolute_position(self.config)
        self.layernorm_embedding = LayerNorm(embed_dim) if args.layernorm_embedding else None
        self.dropout = nn.Dropout(args.dropout)
        self.positional_term = SharedPositionalTerm(self.config)
        layers = (
            PositionalEncoderLayer(
                embed_dim,
                args.encoder_ffn_embed_dim,
                args.encoder_attention_heads,
                dropout=args.dropout,
                activation_dropout=args.activation_dropout,
                activation_fn=args.activation_fn,
                normalize_before=args.encoder_normalize_before,
                layer_projection=self.positional_term.layer_projection,
                layer_terms=self.positional_term.layer_terms,
            )
            for _ in range(args.encoder_layers)
        )
        layerdrop = args.encoder_layerdrop
        self.layers = LayerDropModuleList(layerdrop, layers) if layerdrop > 0 else nn.ModuleList(layers)
        self.layer_norm = LayerNorm(embed_dim) if args.encoder_normalize_before else None
        self.enhanced_mask_decoder = build_enhanced_mask_decoder(self.config)

    def embed_tokens_checked(self, src_tokens):
        try:
            return self.embed_tokens(src_tokens)
        except IndexError as err:
            size = self.embed_tokens.num_embeddings
            bad = src_tokens[(src_tokens < 0) | (src_tokens >= size)]
            token = int(bad[0]) if bad.numel() else int(src_tokens.max())
            raise ValueError(
                f"token id {token} is outside the dictionary of {size} symbols (ids 0..{size - 1}): "
                "the input was encoded with another dict.txt than the model's"
                + (" or is not token ids" if token < 0 else "")
            ) from err

    def embed(self, src_tokens, token_embeddings=None, forward=None):
        """The input of the first layer; ``forward``: the :class:`~tupe_plugin.terms.forward.Forward` whose
        positions an absolute embedding adds (by default 0..T-1)."""
        x = self.embed_tokens_checked(src_tokens) if token_embeddings is None else token_embeddings
        if self.embed_positions is not None:
            per_sequence = forward is not None and forward.per_sequence
            x = x + self.embed_positions(forward.positions if per_sequence else src_tokens.size(1))
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return self.dropout(x)

    def padding_mask(self, src_tokens):
        """(B, T) True at padding, or None; refuses left-padded input (positions count from token 0)."""
        mask = src_tokens.eq(self.padding_idx)
        if not mask.any():
            return None
        if mask[:, 0].any():  # an all-padding row starts with padding too: told apart only here
            empty = mask.all(dim=1).nonzero().flatten().tolist()
            if empty:
                raise ValueError(
                    f"row {empty[0]} of the batch is all padding ({len(empty)} such rows): an empty sequence "
                    "has no <s> and nothing to encode; drop empty examples from the input"
                )
            raise ValueError(
                "a sequence starts with padding: the plugin counts positions from the first token "
                "and needs right-padded batches (fairseq's masked_lm / sentence_prediction "
                "default; with translation-style data pass --left-pad-source False)"
            )
        return mask

    def attention_plan(self, device, need_attn, seq_len, per_sequence=False):
        """The forward's :class:`~tupe_plugin.attention.paths.AttentionPlan`, the same for every layer: the
        attention dropout in effect (0 in evaluation) and the path and kernels that run it; ``per_sequence``:
        each sequence has positions of its own (:attr:`~tupe_plugin.terms.forward.Forward.per_sequence`)."""
        dropout = self.attention_dropout if self.training else 0.0
        return plan_attention(device, dropout, need_attn, self.config, seq_len, self.attention_backend,
                              per_sequence)

    def forward(self, src_tokens, return_all_hiddens=False, need_attn=False, token_embeddings=None,
                masked_lm=False):
        """Returns (features (B, T, C), inner_states list of (T, B, C) or None, attn list or None).

        ``masked_lm``: the features are those of the masked-LM head, with ``--deberta-emd`` the Enhanced Mask
        Decoder's query stream (:mod:`.enhanced_mask_decoder`); inner_states and attn are the layers' own.
        """
        padding_mask = self.padding_mask(src_tokens)
        forward = self.positional_term.forward_of(*src_tokens.shape, src_tokens.device)
        x = self.embed(src_tokens, token_embeddings, forward)
        if padding_mask is not None:
            x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
        plan = self.attention_plan(x.device, need_attn, forward.seq_len, forward.per_sequence)
        term = self.positional_term.build(forward, plan.fold_untied, padding_mask, x.dtype,
                                          plan.padding_as_lengths, plan.offset_bias_as_rows)
        plan.check_reads(term.parts())
        if plan.path in SHARED_MASK_GRADIENT_PATHS:  # one buffer takes every layer's mask gradient
            rows = term.get(OffsetRows)
            offset = () if rows is None else (rows.rows, rows.cls)
            mask, mask_gradient = gather_mask_gradient(term.attn_mask, *offset)
            term = replace(term, attn_mask=mask, mask_gradient=mask_gradient)
        inner_states = [x.transpose(0, 1)] if return_all_hiddens else None
        attentions = [] if need_attn else None
        decoder = self.enhanced_mask_decoder if masked_lm else None
        before_last = None
        for layer in self.layers:
            if decoder is not None and layer is self.layers[-1]:
                before_last = x
            x, attn = layer(x, term, plan, need_weights=need_attn)
            if return_all_hiddens:
                inner_states.append(x.transpose(0, 1))
            if need_attn:
                attentions.append(attn)
        # H enters the last layer; with LayerDrop skipping it, H is the output of the layers that ran
        hidden = x if before_last is None else before_last
        if self.layer_norm is not None:
            x = self.layer_norm(x)
            if return_all_hiddens:
                inner_states[-1] = x.transpose(0, 1)
        if decoder is not None:
            x = decoder(self.layers[-1], hidden, term, plan)
            x = x if self.layer_norm is None else self.layer_norm(x)
        return x, inner_states, attentions
