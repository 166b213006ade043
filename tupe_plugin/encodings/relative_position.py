"""T5 relative position bias (TUPE Eq. 5 and 8): one scalar b[h, bucket(j - i)] per head and bucket.

TUPE is Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training", arXiv 2006.15595; the
buckets are T5's (Raffel et al., "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer", arXiv 1910.10683). :class:`ReleaseT5RelativeBias` is the bias with the [CLS] reset of the
authors' released code (``--cls-reset release``, see docs/official_tupe.md): the table has
``num_buckets + 1`` rows and is reset on its own, the bucket of every pair (i, 0) becoming the extra
bucket ``num_buckets``, then the bucket of every pair (0, j) ``num_buckets // 2`` (a bucket no ordinary
pair uses); the reset thus applies to each term separately, not to their sum as in Eq. 11.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..user_input.memory_limits import trained_bytes
from .encoding import Encoding, option
from ..terms.parts import OffsetRows
from .offset_bias import OffsetBias


@dataclass(frozen=True)
class T5Options:
    rel_pos_buckets: int = option(32, metavar="N", help="T5 buckets (both directions)")
    rel_pos_max_distance: int = option(128, metavar="N",
                                       help="T5 distance beyond which all offsets share the last bucket")


def relative_position_bucket(
    relative_position, num_buckets=32, max_distance=128, bidirectional=True
):
    """Map ``relative_position = key - query`` to T5's buckets.

    Bidirectional: half of the buckets for keys before the query (and the query itself), half
    (offset ``num_buckets // 2``) for keys after it. Within a half, the first half of its buckets
    hold exact distances, the rest are log-spaced up to ``max_distance`` and clipped to the last.

    Computed on the CPU in float64 and returned on the input's device: at distances such as 16, 32
    and 64 (defaults) the logarithm lands exactly on a bucket boundary, where a float32 logarithm on
    another device can round to the bucket below. The CPU result is the one the TUPE authors'
    released model was trained with.
    """
    device = relative_position.device
    relative_position = relative_position.cpu()
    if bidirectional and num_buckets % 2:
        raise ValueError(f"bidirectional T5 buckets need an even num_buckets, got {num_buckets}")
    n = -relative_position
    bucket = torch.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = n.clamp(min=0)
    max_exact = num_buckets // 2
    if max_exact < 1 or max_distance <= max_exact:
        raise ValueError(
            f"T5 buckets need max_distance ({max_distance}) > exact buckets ({max_exact}) >= 1"
        )
    log_ratio = torch.log(n.clamp(min=1).double() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return (bucket + torch.where(n < max_exact, n, large)).to(device)


class T5RelativeBias(OffsetBias):
    """The (H, T, T) bias b[h, bucket(j - i)], shared by all layers (TUPE Eq. 5 / 8)."""

    def __init__(self, num_heads, num_buckets=32, max_distance=128, zero_cls=False):
        super().__init__(zero_cls)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)
        zero_offset = relative_position_bucket(torch.zeros(1, dtype=torch.long), num_buckets, max_distance)
        self.register_buffer("_offset_buckets", zero_offset, persistent=False)

    def offset_buckets(self, seq_len):
        """Buckets of the offsets j - i = -(T-1)..T-1, cached for the longest length seen."""
        longest = (self._offset_buckets.numel() + 1) // 2
        if longest < seq_len:
            offsets = torch.arange(1 - seq_len, seq_len)
            buckets = relative_position_bucket(offsets, self.num_buckets, self.max_distance)
            self._offset_buckets = buckets.to(self._offset_buckets.device)
            longest = seq_len
        return self._offset_buckets[longest - seq_len: longest + seq_len - 1]

    def per_offset(self, seq_len):
        """(offsets (2T-1,), bias (H, 2T-1)): b[h, bucket(j - i)] for j - i = -(T-1)..T-1."""
        offsets = torch.arange(1 - seq_len, seq_len, device=self._offset_buckets.device)
        return offsets, self.relative_attention_bias(self.offset_buckets(seq_len)).t()


class ReleaseT5RelativeBias(T5RelativeBias):
    """T5 bias with one extra bucket: pairs (i, 0) use it, pairs (0, j) bucket ``num_buckets // 2``."""

    def __init__(self, num_heads, num_buckets=32, max_distance=128):
        super().__init__(num_heads, num_buckets, max_distance)
        self.relative_attention_bias = nn.Embedding(num_buckets + 1, num_heads)
        self.register_buffer("_buckets", torch.zeros(0, 0, dtype=torch.long), persistent=False)

    def buckets(self, seq_len):
        """Bucket index of every (query i, key j) pair, cached for the longest length seen."""
        if self._buckets.size(0) < seq_len:
            positions = torch.arange(seq_len, device=self._buckets.device)
            relative = positions[None, :] - positions[:, None]
            buckets = relative_position_bucket(relative, self.num_buckets, self.max_distance)
            buckets[:, 0] = self.num_buckets
            buckets[0, :] = self.num_buckets // 2
            self._buckets = buckets
        return self._buckets[:seq_len, :seq_len]

    def forward(self, seq_len):
        return self.relative_attention_bias(self.buckets(seq_len)).permute(2, 0, 1)

    def contribute(self, term, forward):
        """Add the rows of the ordinary buckets to ``term`` and, as its [CLS] reset, the rows of the
        buckets of the pairs (0, j) and (i, 0)."""
        cls = self.relative_attention_bias.weight[[self.num_buckets // 2, self.num_buckets]].t()
        term.add(OffsetRows(self.per_offset(forward.seq_len)[1], cls))


def build_t5_bias(config):
    """The T5 bias of a :class:`~.position_config.PositionConfig` that uses it."""
    if config.release:
        return ReleaseT5RelativeBias(config.num_heads, config.rel_pos_buckets, config.rel_pos_max_distance)
    return T5RelativeBias(config.num_heads, config.rel_pos_buckets, config.rel_pos_max_distance,
                          zero_cls=config.zero_cls_bias)


def check_t5_bias(config):
    buckets, distance = config.rel_pos_buckets, config.rel_pos_max_distance
    if buckets < 4 or buckets % 2:
        return [f"--rel-pos-buckets must be even and >= 4, got {buckets}"]
    if distance <= buckets // 4:
        return [f"--rel-pos-max-distance ({distance}) must exceed the exact-distance buckets per direction "
                f"(--rel-pos-buckets / 4 = {buckets // 4})"]
    return []


def t5_sizes(config, forward):
    """Its table in training (a forward reads one row per distance bucket of T: nothing more per bucket)."""
    buckets = config.rel_pos_buckets
    return [("rel_pos_buckets", buckets,
             f"T5 table ({buckets} rows of {config.num_heads}, with their gradients and Adam's moments)",
             trained_bytes(buckets * config.num_heads), "32, T5's")]


def exact_distances(config):
    """The distances each direction's buckets hold exactly: --rel-pos-buckets / 4, at least 1."""
    return max(1, config.rel_pos_buckets // 4)


T5_BIAS = Encoding(
    name="t5", label="the T5 bias", kind="bias", family="rel_pos", choices=("t5",),
    choices_help="t5 = one bias per head and distance bucket, shared by all layers (TUPE Eq. 5/8)",
    summary="one learned bias per head and T5 distance bucket of j - i, shared by all layers (TUPE Eq. 5/8)",
    citation="Raffel et al., arXiv 1910.10683 (T5's relative bias, as TUPE Eq. 5)",
    slot="relative_bias", options=T5Options, build=build_t5_bias, check=check_t5_bias, sizes=t5_sizes,
    export_names=(("relative_attention_bias.", "relative_bias."),),
    exported=True, parts=(OffsetRows,),
)
