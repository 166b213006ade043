"""CoPE, contextual position encoding (Golovneva, Wang, Weston, Sukhbaatar, "Contextual Position Encoding:
Learning to Count What's Important", arXiv 2405.18719, Eq. 3-5), as the authors' released code computes it
(facebookresearch/RAM, ``ContextPosSelfAttn``, its default flags), in a bidirectional form for encoders.

Each layer counts, for the query i, the keys its gates open between the key j and i:

    g_ij = sigmoid(q_i . k_j / sqrt(d_h)),  0 at padded keys,
    p_ij = sum_{t=j..i} g_it (j <= i),  sum_{t=i..j} g_it (j >= i),  then min(p_ij, P),
    z_ij = w q_i . e[ceil(p_ij)] + (1 - w) q_i . e[floor(p_ij)],  w = p_ij - floor(p_ij),
    A_ij = (q_i . k_j + z_ij) / sqrt(d_h).

The gates are the sigmoid of the scaled logits the layer hands (q . k / sqrt(d_h) where CoPE is the only
term: the released code's gates). e is the layer's own table of P + 1 rows of d_h (positions 0..P), shared by
its heads, zeros at the start as released; P is ``--cope-max-position``, 512 by default (the presets'
``--max-positions``, as the released code's context length; fixed, so that the table keeps its shape when an
evaluation at another length changes ``--max-positions``: the positions are clipped to P at any length).
The position logits are divided by sqrt(d_h) as the q . k they join, the released default (A = (q k^T + z) /
sqrt(d); its ``--cope-nodiv`` form, unscaled z, is not offered); the gradient reaches p through w alone, as
released.

Adaptation: the released code is causal (its sums stop at the query, p_ij = 0 for j > i). An encoder counts in
both directions, from the query to the key on either side, the query's own gate g_ii counted once; the keys
j <= i get the released positions and logits exactly, the keys after the query the same count mirrored
(one table for both sides). Its part of the per-forward term is a
:class:`~tupe_plugin.terms.parts.LayerTerm`: each layer computes it from its own logits, on the explicit
attention path.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..terms.parts import LayerTerm
from ..user_input.memory_limits import FLOAT32, trained_bytes
from .encoding import Encoding, option


@dataclass(frozen=True)
class CopeOptions:
    cope_max_position: int = option(
        512, refused_unused=True, metavar="P",
        help="CoPE: the contextual positions are clipped to P, each layer's table has P + 1 rows (default "
        "512, the presets' --max-positions; it does not follow --max-positions, so a model validates at any "
        "length)")


def contextual_positions(gates):
    """p_ij (B, H, T, T) of the gates g_it (B, H, T, T): sum_{t=j..i} g_it for j <= i (a suffix sum of the
    row up to the query, as released), sum_{t=i..j} g_it for j > i (a prefix sum from the query)."""
    before = gates.tril().flip(-1).cumsum(-1).flip(-1)
    after = gates.triu().cumsum(-1)
    seq_len = gates.size(-1)
    index = torch.arange(seq_len, device=gates.device)
    return torch.where(index[None] <= index[:, None], before, after)


def interpolated(position_logits, positions):
    """z_ij = w Z[i, ceil(p_ij)] + (1 - w) Z[i, floor(p_ij)], w = p_ij - floor(p_ij), of the logits
    ``position_logits`` Z (B, H, T, P + 1) of the positions 0..P and ``positions`` p (B, H, T, T)."""
    floor = positions.floor()
    weight = positions - floor
    below = position_logits.gather(-1, floor.long())
    above = position_logits.gather(-1, positions.ceil().long())
    return above * weight + below * (1 - weight)


class ContextualPositions(nn.Module):
    """One layer's CoPE: its table e (P + 1, d_h), shared by the heads; called on the layer's scaled logits it
    returns z / sqrt(d_h) (B, H, T, T), what CoPE adds to them."""

    def __init__(self, head_dim, max_position):
        super().__init__()
        self.max_position = max_position
        self.table = nn.Parameter(torch.zeros(max_position + 1, head_dim))

    def forward(self, logits, q, k, bias, padding):
        """``logits`` (B, H, T, T) the scaled q . k, float32; q (B, H, T, d_h); ``padding`` (B, T), True at
        padding, or None (k and the content-free ``bias`` are not read: the gates are of q . k alone)."""
        gates = torch.sigmoid(logits)
        if padding is not None:
            gates = gates.masked_fill(padding[:, None, None, :], 0.0)
        positions = contextual_positions(gates).clamp(max=self.max_position)
        position_logits = torch.matmul(q, self.table.to(q.dtype).t()).to(logits.dtype)
        return interpolated(position_logits, positions) / math.sqrt(q.size(-1))


class CopePosition(nn.Module):
    """What CoPE adds to the per-forward term: its :class:`~tupe_plugin.terms.parts.LayerTerm`, which each
    layer computes with its own :class:`ContextualPositions` (no parameters shared by the layers)."""

    def contribute(self, term, forward):
        term.add(LayerTerm(COPE.name))


def build_cope(config):
    return CopePosition()


def cope_layer(config):
    """A fresh layer's table, zeros."""
    return ContextualPositions(config.head_dim, config.cope_max_position)


def check_cope(config):
    if config.cope_max_position < 1:
        return [f"--cope-max-position must be >= 1, got {config.cope_max_position}"]
    return []


def cope_sizes(config, forward):
    """Each layer's table in training, and the queries' products with its rows, (B, H, T, P + 1) a layer."""
    rows = config.cope_max_position + 1
    tables = forward.layers * rows * config.head_dim
    products = forward.tokens * config.num_heads * rows
    return [("cope_max_position", config.cope_max_position,
             f"CoPE tables ({forward.layers} layers x {rows} rows of {config.head_dim}) and the queries' "
             f"products with their rows ({forward.describe()} x {config.num_heads} heads x {rows})",
             trained_bytes(tables) + products * FLOAT32, "512 is the default")]


COPE = Encoding(
    name="cope", label="CoPE", kind="layer", family="rel_pos", choices=("cope",),
    choices_help="cope = contextual positions: sigmoid gates of q.k counted between key and query, "
    "interpolated rows of a table per layer (Golovneva et al. 2024, counted in both directions)",
    summary="positions counted by gates sigmoid(q_i . k_j / sqrt(d_h)) between key and query (both "
    "directions), q_i . e[p_ij] interpolated, a table per layer",
    citation="Golovneva, Wang, Weston, Sukhbaatar, Contextual Position Encoding: Learning to Count What's "
    "Important, arXiv 2405.18719",
    slot="cope", options=CopeOptions, build=build_cope, check=check_cope, sizes=cope_sizes,
    exported=False, parts=(LayerTerm,), layer_module=cope_layer,
)
