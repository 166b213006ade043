"""DeBERTa's disentangled attention (He, Liu, Gao, Chen, "DeBERTa: Decoding-enhanced BERT with Disentangled
Attention", arXiv 2006.03654, Eq. 3-4 and §3.1; v2/v3 options from the released configurations).

The logit of query i and key j is the sum of three terms, scaled together by 1/sqrt(3 d_h):

    q^c_i . k^c_j  +  q^c_i . K^r_delta(i,j)  +  k^c_j . Q^r_delta(i,j)

(content-to-content, content-to-position, position-to-content), with Q^r = P W^{q,r} + b^{q,r},
K^r = P W^{k,r} and P one table of 2k relative embeddings shared by all layers
(:class:`DisentangledRelativeTable`). This is the authors' released code (microsoft/DeBERTa
``disentangled_attention.py``, v1 to v3) and Hugging Face's ``DebertaModel`` / ``DebertaV2Model``; it
differs from Eq. 4 as printed in two places, both options: the p2c term of Eq. 4 reads the row
delta(j, i) = delta(i, j) mirrored (``--deberta-p2c paper``), and has no projection biases
(``--deberta-rel-proj-bias none``; v1 releases a bias on the query side only, the default, v2/v3 on
both sides, ``both``). Each layer projects P with W^{q,r}, W^{k,r} of its own
(:class:`DisentangledProjections`) or, with ``--deberta-share-att-key`` (v2/v3's ``share_att_key``), with
its content projections W^q, W^k and their biases. With ``--deberta-table-norm`` (v2/v3's
``norm_rel_ebd``) P passes a LayerNorm before the layers project it. delta(i, j) = clip(i - j, -k, k - 1)
+ k (Eq. 3): note the sign, query minus key. With ``--deberta-buckets N`` (v2's ``position_buckets``)
i - j is first mapped to its log bucket (:func:`log_bucket`) and the table has 2N rows: delta(i, j) =
clip(bucket(i - j) + N, 0, 2N - 1).

The terms depend on the content, as Shaw keys do: each layer multiplies q (and k) by the rows of the
table this length reaches, laid out by offset, by bands of query (key) rows, never building a (T, T, d)
tensor (:mod:`tupe_plugin.attention.toeplitz_scores`). The table and the offsets are handed over in the
forward's positional term; the layer adds their sum to the mask.
No absolute position enters the encoder; with ``--deberta-emd`` the Enhanced Mask Decoder (§3.2) adds them
before the masked-LM head (:mod:`tupe_plugin.encoder.enhanced_mask_decoder`).
"""

import math
from dataclasses import dataclass

import torch
from fairseq.modules import LayerNorm
from torch import nn

from ..terms.parts import ProjectedTable
from ..user_input.memory_limits import FLOAT32, trained_bytes
from .encoding import Encoding, option


@dataclass(frozen=True)
class DebertaOptions:
    deberta_max_distance: int = option(
        512, refused_unused=True, metavar="K",
        help="DeBERTa: k, the table has 2k rows and i - j is clipped to [-k, k-1] (He et al. 2021 Eq. 3; "
        "default 512, the released max_relative_positions); with --deberta-buckets, the distance at "
        "which the log buckets reach the last")
    deberta_buckets: int = option(
        0, refused_unused=True, metavar="N",
        help="DeBERTa v2's log buckets (position_buckets, 256 in the released v2/v3): the table has 2N "
        "rows, distances up to N/2 exact, log-spaced beyond up to --deberta-max-distance; 0 = none, "
        "distances clipped (v1, default)")
    deberta_share_att_key: bool = option(
        False, refused_unused=True,
        help="DeBERTa v2/v3's share_att_key: the relative table is projected by the layer's own content "
        "query and key projections (W^q, W^k with their biases), not by W^{q,r}, W^{k,r} of its own")
    deberta_p2c: str = option(
        "released", choices=("released", "paper"), before="paper",
        help="DeBERTa: the row the position-to-content term k_j . Q^r reads; released = delta(i, j), the "
        "content-to-position term's, as the authors' released code and Hugging Face's (default); paper = "
        "delta(j, i), Eq. 4 as printed (checkpoints saved before this option)")
    deberta_rel_proj_bias: str = option(
        "query", choices=("query", "both", "none"), before="none",
        help="DeBERTa: biases of a layer's own projections of the relative table (without "
        "--deberta-share-att-key); query = on Q^r = P W^{q,r} + b only, as the released v1 (default); "
        "both = on Q^r and K^r, as the released v2/v3; none = Eq. 4 as printed (checkpoints saved before "
        "this option)")
    deberta_table_norm: bool = option(
        False, refused_unused=True,
        help="DeBERTa v2/v3's norm_rel_ebd: a LayerNorm of the encoder's normalises the relative table "
        "before the layers project it")
    deberta_emd: bool = option(
        False, refused_unused=True,
        help="DeBERTa's Enhanced Mask Decoder (He et al. 2021 §3.2, as released): the masked-LM head reads"
        " the last layer applied again --deberta-emd-layers times, its queries the second-to-last "
        "layer's output plus a learned absolute position table (--max-positions rows), its keys and "
        "values that output; needs --rel-pos deberta and --abs-pos none; features (heads, analysis) "
        "are unchanged")
    deberta_emd_layers: int = option(
        2, refused_unused=True, metavar="N",
        help="passes of the Enhanced Mask Decoder (--deberta-emd), the last layer's weights shared "
        "(default 2, as released)")

    @property
    def deberta_released_p2c(self):
        """DeBERTa's p2c term reads delta(i, j), as released."""
        return self.deberta_p2c == "released"

    @property
    def deberta_own_projections(self):
        """The biases of the W^{q,r}, W^{k,r} by which every layer projects DeBERTa's shared table
        (``--deberta-rel-proj-bias``: query, both or none), or None: no DeBERTa, or its table projected by
        the content projections (``--deberta-share-att-key``)."""
        return self.deberta_rel_proj_bias if self.deberta and not self.deberta_share_att_key else None

    @property
    def enhanced_mask_decoder_passes(self):
        """How many times the Enhanced Mask Decoder applies the last layer, or None: no decoder."""
        return self.deberta_emd_layers if self.deberta and self.deberta_emd else None


def log_bucket(relative, buckets, max_distance):
    """DeBERTa v2's log bucket of the signed distance ``relative`` (an integer tensor), clipped first to
    +-(K - 1), K = ``max_distance``: itself up to N/2 = ``buckets // 2`` in absolute value, beyond that
    sign * (N/2 + ceil((N/2 - 1) log(|d| / (N/2)) / log((K - 1) / (N/2)))), at most N - 1. The
    logarithms are taken in float64 on the CPU, the result returned on the input's device."""
    device = relative.device
    half = buckets // 2
    clipped = relative.cpu().clamp(1 - max_distance, max_distance - 1)
    distance = clipped.abs()
    scaled = torch.log(distance.clamp(min=half).double() / half) / math.log((max_distance - 1) / half)
    logarithmic = (torch.ceil(scaled * (half - 1)) + half).long()
    return torch.where(distance <= half, clipped, clipped.sign() * logarithmic).to(device)


class DisentangledRelativeTable(nn.Module):
    """P, the 2k relative embeddings of dimension C shared by all layers (k = ``max_distance``, or
    ``buckets`` when log buckets are used), and delta(i, j) of every pair."""

    def __init__(self, embed_dim, max_distance=512, buckets=0, released_p2c=True, norm=False):
        super().__init__()
        self.max_distance = max_distance
        self.buckets = buckets
        self.span = buckets or max_distance
        self.released_p2c = released_p2c
        self.weight = nn.Parameter(torch.empty(2 * self.span, embed_dim))
        nn.init.normal_(self.weight, mean=0.0, std=0.02)
        self.norm = LayerNorm(embed_dim) if norm else None
        self._cached = None  # (seq_len, device, first row used, rows used, index and offsets from the first)

    def index(self, seq_len):
        """(T, T) delta(i, j) of every (query i, key j), on the CPU."""
        positions = torch.arange(seq_len)
        relative = positions[:, None] - positions[None, :]
        if self.buckets:
            relative = log_bucket(relative, self.buckets, self.max_distance)
        return (relative + self.span).clamp(0, 2 * self.span - 1)

    def rows_and_index(self, seq_len):
        """(first, rows, index, offsets): the rows of P that a length T reaches, ``first`` to
        ``first + rows - 1``; ``index`` = delta(i, j) - first of every pair, and ``offsets`` (2T - 1,) the
        same by offset: delta depends on i - j alone, and the pairs with j - i = o have the row
        ``offsets[o + T - 1]``. On the table's device, cached for the last length."""
        device = self.weight.device
        if self._cached is None or self._cached[:2] != (seq_len, device):
            index = self.index(seq_len)
            first = int(index.min())
            index = index.sub(first)
            offsets = torch.cat([index[:, 0].flip(0), index[0, 1:]])
            self._cached = (seq_len, device, first, int(index.max()) + 1, index.to(device),
                            offsets.to(device))
        return self._cached[2:]

    def contribute(self, term, forward):
        """Add the rows of P that T positions reach (normalised with ``norm``) and the offsets into them of
        the c2p term, and those the p2c term reads for the pair (key j, query i): delta(i, j), the offsets
        reversed (released), or delta(j, i), the same offsets (paper), to ``term`` (a
        :class:`~tupe_plugin.terms.parts.ProjectedTable`, which each layer projects with the module of
        :meth:`layer_projection`)."""
        first, rows, _, offsets = self.rows_and_index(forward.seq_len)
        table = self.weight[first: first + rows]
        term.add(ProjectedTable(table if self.norm is None else self.norm(table), offsets,
                                offsets.flip(0) if self.released_p2c else offsets))

    @staticmethod
    def layer_projection(config):
        """A layer's W^{q,r}, W^{k,r} (:class:`DisentangledProjections`, with the biases
        ``--deberta-rel-proj-bias`` names), or None with ``--deberta-share-att-key``: the layer projects the
        table with its content projections."""
        biases = config.deberta_own_projections
        return None if biases is None else DisentangledProjections(config.embed_dim, biases)


class DisentangledProjections(nn.Module):
    """A layer's W^{q,r} and W^{k,r} (He et al. 2021 Eq. 4): Q^r = P W^{q,r}, K^r = P W^{k,r}, with the
    ``biases`` named: query (released v1: Q^r = P W^{q,r} + b^{q,r}), both (released v2/v3), none
    (Eq. 4)."""

    def __init__(self, embed_dim, biases="query"):
        super().__init__()
        self.query = nn.Linear(embed_dim, embed_dim, bias=biases in ("query", "both"))
        self.key = nn.Linear(embed_dim, embed_dim, bias=biases == "both")

    def forward(self, table):
        """(Q^r, K^r) of the table rows (R, C): the rows k and q are multiplied by."""
        return self.query(table), self.key(table)


def build_disentangled_table(config):
    """DeBERTa's shared table of a :class:`~.position_config.PositionConfig` that uses it."""
    return DisentangledRelativeTable(config.embed_dim, config.deberta_max_distance, config.deberta_buckets,
                                     released_p2c=config.deberta_released_p2c,
                                     norm=config.deberta_table_norm)


def check_deberta(config):
    errors = _enhanced_mask_decoder_errors(config)
    if config.deberta_share_att_key and config.deberta_rel_proj_bias != "query":
        errors.append(f"--deberta-rel-proj-bias {config.deberta_rel_proj_bias} with "
                      "--deberta-share-att-key: the layers project the table by their content "
                      "projections, with their biases, and have no relative projections of their own; "
                      "drop --deberta-rel-proj-bias")
    if config.deberta_max_distance < 1:
        errors.append(f"--deberta-max-distance must be >= 1, got {config.deberta_max_distance}")
    buckets = config.deberta_buckets
    if buckets and (buckets < 2 or buckets % 2):
        errors.append(f"--deberta-buckets must be 0 (none) or even and >= 2, got {buckets}")
    elif buckets and config.deberta_max_distance - 1 <= buckets // 2:
        errors.append(f"--deberta-max-distance ({config.deberta_max_distance}) must be > --deberta-buckets "
                      f"/ 2 + 1 = {buckets // 2 + 1}: the log buckets span the distances from "
                      f"{buckets // 2} to --deberta-max-distance - 1")
    return errors


def _enhanced_mask_decoder_errors(config):
    if not config.deberta_emd:
        return ["--deberta-emd-layers is an option of the Enhanced Mask Decoder; add --deberta-emd"] \
            if config.deberta_emd_layers != 2 else []
    errors = []
    if config.absolute is not None:
        errors.append(f"--deberta-emd with --abs-pos {config.abs_pos}: the Enhanced Mask Decoder adds the "
                      "absolute positions before the masked-LM head, as the released code does only when "
                      "none enter at the input; use --abs-pos none")
    if config.deberta_emd_layers < 1:
        errors.append(f"--deberta-emd-layers must be >= 1, got {config.deberta_emd_layers}")
    return errors


def deberta_sizes(config, forward):
    """Its relative table in training (rows x C), and the rows a forward of length T reaches (at most 2T)
    projected by each layer into K^r and Q^r, kept for the backward."""
    flag = "deberta_buckets" if config.deberta_buckets else "deberta_max_distance"
    value = getattr(config, flag)
    usual = "256 in the released v2/v3" if config.deberta_buckets else "512, as released"
    reached = min(2 * value, 2 * forward.length)
    projected = 2 * forward.layers * reached * config.embed_dim
    return [(flag, value, f"relative table ({2 * value} rows of {config.embed_dim}, with their gradients "
             f"and Adam's moments; {reached} rows projected twice in each of {forward.layers} layers)",
             trained_bytes(2 * value * config.embed_dim) + projected * FLOAT32, usual)]


def trained_value(name, before, default, saved):
    """Layers with --deberta-share-att-key have no relative projections of their own, so no bias of them to
    mark: their --deberta-rel-proj-bias keeps its default."""
    shared = name == "deberta_rel_proj_bias" and saved("deberta_share_att_key") is True
    return default if shared else before


def transformers_log_bucket(relative, buckets, max_distance):
    """The log bucket transformers' DeBERTa-v2 port gives the signed distance ``relative``
    (``make_log_bucket_position``): :func:`log_bucket`'s formula without the clipping to +-(K - 1), its
    logarithms in float32."""
    half = buckets // 2
    distance = torch.where((relative < half) & (relative > -half), torch.tensor(half - 1).type_as(relative),
                           relative.abs())
    scaled = torch.log(distance / half) / torch.log(torch.tensor((max_distance - 1) / half))
    logarithmic = torch.ceil(scaled * (half - 1)) + half
    return torch.where(distance <= half, relative.type_as(logarithmic), logarithmic * relative.sign()).long()


def deberta_native(config):
    """transformers' DeBERTa-v2 computes the released form (p2c reading delta(i, j)) without the Enhanced
    Mask Decoder, with any projection biases (one it lacks is a zero bias there), ``share_att_key``, log
    buckets and the table's LayerNorm; equal for |i - j| < K where its float32 log buckets are the plugin's
    (beyond K the plugin clips, as Microsoft's code, and transformers does not: the export's card says so).
    The absolute table, where the model adds one, is DeBERTa-v2's ``position_biased_input``."""
    if config.deberta_emd:
        return None, "--deberta-emd: DeBERTa-v2 has no Enhanced Mask Decoder before its masked-LM head"
    if not config.deberta_released_p2c:
        return None, (f"--deberta-p2c {config.deberta_p2c}: DeBERTa-v2's p2c term reads delta(i, j), the "
                      "released form")
    if config.deberta_buckets:
        reach = min(config.deberta_max_distance, config.max_positions)
        distances = torch.arange(1 - reach, reach)
        ours = log_bucket(distances, config.deberta_buckets, config.deberta_max_distance)
        theirs = transformers_log_bucket(distances, config.deberta_buckets, config.deberta_max_distance)
        if not torch.equal(ours, theirs):
            first = int(distances[ours != theirs].abs().min())
            return None, (f"--deberta-buckets {config.deberta_buckets} with --deberta-max-distance "
                          f"{config.deberta_max_distance}: DeBERTa-v2's log buckets, computed in float32, "
                          f"put the distance {first} in another bucket than Microsoft's code (float64)")
    return "deberta-v2", None


DEBERTA = Encoding(
    name="deberta", label="DeBERTa", kind="relative_vectors", family="rel_pos", choices=("deberta",),
    choices_help="deberta = DeBERTa's disentangled attention, content-to-position q_i . K^r_d(i,j) and "
    "position-to-content k_j . Q^r_d(j,i) from one relative table shared by all layers, projected per layer "
    "(He et al. 2021 Eq. 4)",
    summary="disentangled attention: content-to-position and position-to-content terms from one relative "
    "table shared by the layers, projected per layer",
    citation="He, Liu, Gao, Chen, DeBERTa: Decoding-enhanced BERT with Disentangled Attention, arXiv "
    "2006.03654",
    slot="disentangled", options=DebertaOptions, build=build_disentangled_table, check=check_deberta,
    sizes=deberta_sizes, logit_terms=3, trained_value=trained_value,
    export_names=(("weight", "deberta_table"), ("norm.", "deberta_table_norm.")),
    hf_native=deberta_native,
    exported=True, parts=(ProjectedTable,),
)
