"""A BERT encoder layer (post-LN, or pre-LN with ``normalize_before``) around PositionalSelfAttention.

The attention dropout is not the layer's: it is carried by the forward's attention plan. A separate
query stream (keys and values from the hidden states) serves DeBERTa's Enhanced Mask Decoder (He, Liu, Gao,
Chen, arXiv 2006.03654, §3.2; :mod:`.enhanced_mask_decoder`).
"""

from fairseq import utils
from fairseq.modules import LayerNorm
from torch import nn

from .self_attention import PositionalSelfAttention


class PositionalEncoderLayer(nn.Module):
    def __init__(
        self,
        embed_dim,
        ffn_embed_dim,
        num_heads,
        dropout=0.1,
        activation_dropout=0.0,
        activation_fn="gelu",
        normalize_before=False,
        layer_projection=None,
        layer_terms=None,
    ):
        super().__init__()
        self.normalize_before = normalize_before
        self.self_attn = PositionalSelfAttention(embed_dim, num_heads, layer_projection, layer_terms)
        self.self_attn_layer_norm = LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, ffn_embed_dim)
        self.fc2 = nn.Linear(ffn_embed_dim, embed_dim)
        self.final_layer_norm = LayerNorm(embed_dim)
        self.activation_fn = utils.get_activation_fn(activation_fn)
        self.dropout = nn.Dropout(dropout)
        self.activation_dropout = nn.Dropout(activation_dropout)

    def _residual_block(self, x, layer_norm, block):
        residual = x
        if self.normalize_before:
            x = layer_norm(x)
        x, extra = block(x)
        x = residual + self.dropout(x)
        if not self.normalize_before:
            x = layer_norm(x)
        return x, extra

    def _feed_forward(self, x):
        x = self.activation_dropout(self.activation_fn(self.fc1(x)))
        return self.fc2(x), None

    def _attention(self, x, term, plan, need_weights, query):
        if query is None:
            return self._residual_block(x, self.self_attn_layer_norm,
                                        lambda h: self.self_attn(h, term, plan, need_weights))
        keys = self.self_attn_layer_norm(x) if self.normalize_before else x
        return self._residual_block(query, self.self_attn_layer_norm,
                                    lambda h: self.self_attn(keys, term, plan, need_weights, query=h))

    def forward(self, x, term, plan, need_weights=False, query=None):
        """x: (B, T, C); ``term`` and ``plan``: the forward's PositionalTerm and AttentionPlan. Returns the
        layer output and, with ``need_weights``, its attention.

        With ``query`` (B, T, C) the attention reads its queries from ``query`` and its keys and values from
        x, and the residual stream is the query's (DeBERTa's Enhanced Mask Decoder).
        """
        x, attn = self._attention(x, term, plan, need_weights, query)
        x, _ = self._residual_block(x, self.final_layer_norm, self._feed_forward)
        return x, attn
