"""Transformer-XL's relative position encoding (Dai, Yang, Yang, Carbonell, Le, Salakhutdinov,
"Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context", arXiv 1901.02860, §3.3), in the
bidirectional form of XLNet (Yang, Dai, Yang, Carbonell, Salakhutdinov, Le, "XLNet: Generalized
Autoregressive Pretraining for Language Understanding", arXiv 1906.08237):

    A_ij = [(q_i + u) . k_j + (q_i + v) . W_R R_(i-j)] / sqrt(d_h),

R_d = [sin(d w_0), .., sin(d w_(C/2-1)), cos(d w_0), .., cos(d w_(C/2-1))] the sinusoids of the signed
distance d = i - j, w_k = 10000^(-2k/C) over the model width C, shared by all layers; W_R (C x C, no bias)
each layer's own; u and v one vector per head, shared by the layers (Transformer-XL's default; XLNet's
``untie_r`` gives each layer its own, not offered here). ``--xl-max-distance K`` clamps d to [-K, K]
(XLNet's ``clamp_len``; 0: no clamp, the default).

Its parts of the per-forward term are two the term already has: a query shift u (:class:`Shift`, on the
query of every product) and a table each layer projects (:class:`ProjectedTable`: R by the offset j - i,
W_R the layer's projection, v - u on the query of that product), so that (q_i + u) + (v - u) = q_i + v
multiplies W_R R_(i-j).
"""

from dataclasses import dataclass

import torch
from torch import nn

from ..terms.parts import ProjectedTable, Shift
from .encoding import Encoding, option
from .sinusoid import initial_frequencies


@dataclass(frozen=True)
class TransformerXLOptions:
    xl_max_distance: int = option(
        0, refused_unused=True, metavar="K",
        help="Transformer-XL: the distances i - j are clamped to [-K, K] before their sinusoids (XLNet's "
        "clamp_len); 0 = no clamp (default)")


class TransformerXLPosition(nn.Module):
    """u and v (H, d_h) and the sinusoids R of the distances, shared by all layers."""

    def __init__(self, embed_dim, num_heads, max_distance=0):
        super().__init__()
        self.max_distance = max_distance
        self.content_bias = nn.Parameter(torch.empty(num_heads, embed_dim // num_heads))
        self.position_bias = nn.Parameter(torch.empty(num_heads, embed_dim // num_heads))
        self.register_buffer("frequencies", initial_frequencies(embed_dim), persistent=False)
        for bias in (self.content_bias, self.position_bias):
            nn.init.normal_(bias, mean=0.0, std=0.02)

    def sinusoids(self, seq_len):
        """(2T - 1, C): row r holds R_d of the distance d = i - j of the offset j - i = r - (T - 1)."""
        distances = torch.arange(seq_len - 1, -seq_len, -1, device=self.frequencies.device)
        if self.max_distance:
            distances = distances.clamp(-self.max_distance, self.max_distance)
        angles = distances[:, None].float() * self.frequencies[None]
        return torch.cat([angles.sin(), angles.cos()], -1)

    def contribute(self, term, forward):
        """Add u on the query and R by offset, whose product each layer takes with v - u on the query."""
        seq_len = forward.seq_len
        table = self.sinusoids(seq_len)
        term.add(Shift(self.content_bias[:, None]))
        term.add(ProjectedTable(table, torch.arange(2 * seq_len - 1, device=table.device),
                                query_shift=(self.position_bias - self.content_bias)[:, None]))

    @staticmethod
    def layer_projection(config):
        """A layer's W_R."""
        return RelativeKeyProjection(config.embed_dim)


class RelativeKeyProjection(nn.Module):
    """A layer's W_R: K^r = R W_R, no bias (Transformer-XL); no position-to-content rows."""

    def __init__(self, embed_dim):
        super().__init__()
        self.key = nn.Linear(embed_dim, embed_dim, bias=False)

    def forward(self, table):
        return None, self.key(table)


def build_transformer_xl(config):
    """The shared u, v and sinusoids of a :class:`~.position_config.PositionConfig` that uses them."""
    return TransformerXLPosition(config.embed_dim, config.num_heads, config.xl_max_distance)


def check_transformer_xl(config):
    errors = []
    if config.xl_max_distance < 0:
        errors.append(f"--xl-max-distance must be >= 0 (0: no clamp), got {config.xl_max_distance}")
    if config.embed_dim % 2:
        errors.append("--rel-pos xl needs an even --encoder-embed-dim (its sinusoids), got "
                      f"{config.embed_dim}")
    return errors


TRANSFORMER_XL = Encoding(
    name="transformer_xl", label="Transformer-XL's relative encoding", kind="relative_vectors",
    family="rel_pos", choices=("xl",),
    choices_help="xl = Transformer-XL's (q_i + u) . k_j + (q_i + v) . W_R R_(i-j), R the sinusoids of i - j, "
    "u, v per head shared by the layers, W_R per layer (Dai et al. 2019 §3.3; bidirectional as XLNet)",
    summary="(q_i + u) . k_j + (q_i + v) . W_R R_(i-j): sinusoids of the distance projected per layer, "
    "learned content and position biases u, v per head",
    citation="Dai, Yang, Yang, Carbonell, Le, Salakhutdinov, Transformer-XL: Attentive Language Models "
    "Beyond "
    "a Fixed-Length Context, arXiv 1901.02860",
    slot="transformer_xl", options=TransformerXLOptions, build=build_transformer_xl,
    check=check_transformer_xl, exported=False, parts=(Shift, ProjectedTable),
    export_names=(("content_bias", "xl_content_bias"), ("position_bias", "xl_position_bias")),
)
