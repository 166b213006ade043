"""The content-free part of the attention logits, built once per forward and shared by all layers.

This is the one place that turns the position flags into what attention consumes (TUPE Eq.
7-11, §4.3). Terms that are low-rank products are handed over in factored form so that each layer
keeps a fused attention kernel:

* TUPE untied absolute term (Eq. 7): per head, ``q_extra = p U^Q_h`` and ``k_extra = p U^K_h`` are
  appended to the word query/key; with the shared scale 1/sqrt(2 d_h) the kernel computes exactly
  ``(x W^Q)(x W^K)^T / sqrt(2 d_h) + (p U^Q)(p U^K)^T / sqrt(2 d_h)``.
* [CLS] reset (Eq. 9): row 0 becomes theta_1 and column 0 (rows i != 0) theta_2. Two more
  dimensions do it: one that is 1 in every query but the [CLS] one and theta_2 in the [CLS] key,
  one that is theta_1 in the [CLS] query and 1 in every key (thetas before the shared scale, which
  the kernel applies); the positional parts of
  the [CLS] query and key are zeroed. (theta_1 is constant along its row, so it has no effect
  after the softmax; it is kept for fidelity to the equation and for the analysis pictures.)
* ``--cls-reset release`` (the authors' released code, :mod:`release_position`): the same
  factors, with theta_1/theta_2 read off the untied table's rows 0 and 1; the T5 bias keeps its
  row 0 and column 0, which point at buckets of their own (the reset applied to each term).
* BERT-A^d (§4.3): ``(xW^Q + pU^Q)(xW^K + pU^K)^T / sqrt(4 d_h)`` — the four terms of the
  ablation — is handed over as ``q_shift``/``k_shift`` added to the word query/key.
* The T5 bucket bias (Eq. 5 / 8 / 11) is not low-rank: it is a dense (H, T, T) ``bias``; under the
  paper's reset its row 0 and column 0 are zeroed, because the reset replaces the whole content-free term.
* Shaw relative vectors (Wang et al. 2021 Eq. 4) depend on the query, so they are not content-free: the
  shared (2K+1, d_h) ``rel_table`` and (T, T) ``rel_index`` are handed over and each layer adds
  q . a_{j-i} (and, unless keys-only, the value term) itself.
"""

from dataclasses import dataclass, replace
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .alibi_position import AlibiBias
from .attention_kernels import AttentionPath, fold_untied_term
from .relative_position import T5RelativeBias
from .release_position import ReleaseT5RelativeBias, ReleaseUntiedPositionalCorrelation
from .rotary_position import RotaryPosition
from .shaw_position import ShawRelativePosition
from .untied_position import UntiedPositionalCorrelation

KERNEL_HEAD_DIM_MULTIPLE = 8


@dataclass
class PositionalTerm:
    """What every layer's attention adds to its logits; tensors are per head, shape (H, T, .)."""

    scale: float
    q_extra: Optional[torch.Tensor] = None
    k_extra: Optional[torch.Tensor] = None
    q_shift: Optional[torch.Tensor] = None
    k_shift: Optional[torch.Tensor] = None
    bias: Optional[torch.Tensor] = None
    rel_table: Optional[torch.Tensor] = None
    rel_index: Optional[torch.Tensor] = None
    rel_values: bool = False
    rotary_cos: Optional[torch.Tensor] = None
    rotary_sin: Optional[torch.Tensor] = None
    path: AttentionPath = AttentionPath.SDPA
    attn_mask: Optional[torch.Tensor] = None

    def dense(self):
        """The content-free logits as one (H, T, T) matrix (for analysis and tests); Shaw terms excluded."""
        parts = []
        for q, k in ((self.q_extra, self.k_extra), (self.q_shift, self.k_shift)):
            if q is not None:
                # scaled before the product, as the kernels do: in fp16 the unscaled product of
                # large factors overflows (65504) where the scaled logits do not
                parts.append(torch.einsum("hid,hjd->hij", q * self.scale, k))
        if self.bias is not None:
            parts.append(self.bias)
        return sum(parts) if parts else None

    def folded(self):
        """The same term with the untied factors multiplied out into ``bias``, once per forward: for
        the explicit path, and wherever a dense bias (the T5 term) is added in every layer anyway —
        there the untied product joins it for free, while widened heads (d_h -> 2 d_h + 2, padded to
        a multiple of 8) would double every layer's attention matmuls."""
        if self.q_extra is None:
            return self
        untied = torch.bmm(self.q_extra * self.scale, self.k_extra.transpose(1, 2))
        # an addition, not baddbmm: under autocast the product may be bf16, the T5 bias stays float32
        bias = untied if self.bias is None else self.bias + untied
        return replace(self, q_extra=None, k_extra=None, bias=bias)

    def attention_mask(self, key_padding_mask, dtype):
        """The mask handed to every layer's fused attention, built once per forward.

        ``key_padding_mask`` is (B, T), True at padding. Returns None, a boolean (B, 1, 1, T) mask
        (True = attend) or a float (1 or B, H, T, T) additive mask with padded keys at the most
        negative value of ``dtype``.
        """
        if self.bias is None:
            if key_padding_mask is None:
                return None
            return ~key_padding_mask[:, None, None, :]
        mask = self.bias.to(dtype)[None]
        if key_padding_mask is not None:
            mask = mask.masked_fill(key_padding_mask[:, None, None, :], torch.finfo(dtype).min)
        return mask


class SharedPositionalTerm(nn.Module):
    """Owns the content-free tables of a :class:`~.position_config.PositionConfig` and builds the
    :class:`PositionalTerm` of each forward.

    The term is built by :meth:`build` rather than ``forward``: it is not a tensor, and module hooks
    that walk outputs (fairseq's NaN detector, torch's backward hooks) then see only the tables'
    own tensor outputs.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.head_dim = config.head_dim
        if not config.untied_table:
            self.untied_position = None
        elif config.release:
            self.untied_position = ReleaseUntiedPositionalCorrelation(
                config.max_positions, config.embed_dim, config.num_heads, config.untied_proj_bias
            )
        else:
            self.untied_position = UntiedPositionalCorrelation(
                config.max_positions, config.embed_dim, config.num_heads,
                config.cls_reset_applies, config.untied_proj_bias,
            )
        relative_bias = ReleaseT5RelativeBias if config.release else T5RelativeBias
        if config.t5_bias:
            self.relative_bias = relative_bias(
                config.num_heads, config.rel_pos_buckets, config.rel_pos_max_distance
            )
        else:
            self.relative_bias = AlibiBias(config.num_heads) if config.alibi else None
        self.rotary = (
            RotaryPosition(self.head_dim, config.rotary_base, config.learnable_rotary_frequencies)
            if config.rotary_applies
            else None
        )
        self.shaw = (
            ShawRelativePosition(
                self.head_dim, config.shaw_max_distance, config.shaw_learned,
                config.shaw_learnable_frequencies,
            )
            if config.shaw_table is not None
            else None
        )

    def build(self, seq_len, path, key_padding_mask=None, dtype=torch.float32):
        """The term every layer of this forward consumes on ``path``: the untied factors folded or
        not (:func:`~.attention_kernels.fold_untied_term`), the mask with key padding built once.

        ``key_padding_mask`` is (B, T), True at padding; ``dtype`` the dtype of the hidden states.
        """
        term = self.content_free(seq_len)
        if fold_untied_term(path, self.config):
            term = term.folded()
        return replace(term, path=path, attn_mask=term.attention_mask(key_padding_mask, dtype))

    def content_free(self, seq_len):
        """The unfolded term for positions 0..seq_len-1, no mask (for :meth:`build` and the analysis)."""
        config = self.config
        term = PositionalTerm(scale=config.scale)
        if self.untied_position is not None:
            q_pos, k_pos = self.untied_position.projections(seq_len)
            if config.four_term:
                term.q_shift, term.k_shift = q_pos, k_pos
            elif config.cls_reset_applies:
                term.q_extra, term.k_extra = self._reset_factors(q_pos, k_pos)
            else:
                term.q_extra, term.k_extra = q_pos, k_pos
            if term.q_extra is not None:
                term.q_extra, term.k_extra = self._pad_to_kernel_width(term.q_extra, term.k_extra)
        if self.relative_bias is not None:
            bias = self.relative_bias(seq_len)
            if config.zero_cls_bias:  # in place: T5RelativeBias returns a fresh tensor
                bias[:, 0, :] = 0
                bias[:, :, 0] = 0
            term.bias = bias
        if self.rotary is not None:
            term.rotary_cos, term.rotary_sin = self.rotary(seq_len)
        if self.shaw is not None:
            term.rel_table = self.shaw.table()
            term.rel_index = self.shaw.index(seq_len, term.rel_table.device)
            term.rel_values = config.shaw_values
        return term

    def _reset_factors(self, q_pos, k_pos):
        """Factors whose product is Eq. 9's reset of the untied term (see the module docstring)."""
        num_heads, seq_len, _ = q_pos.shape
        is_cls = torch.zeros(seq_len, 1, dtype=q_pos.dtype, device=q_pos.device)
        is_cls[0] = 1
        not_cls = 1 - is_cls
        theta = self.untied_position.cls_thetas().to(q_pos.dtype)
        theta_1 = theta[:, 0, None, None] * is_cls
        theta_2 = theta[:, 1, None, None] * is_cls
        q_extra = torch.cat([q_pos * not_cls, not_cls.expand(num_heads, -1, -1), theta_1], -1)
        k_extra = torch.cat([k_pos * not_cls, theta_2, torch.ones_like(theta_2)], -1)
        return q_extra, k_extra

    def _pad_to_kernel_width(self, q_extra, k_extra):
        width = self.head_dim + q_extra.size(-1)
        pad = -width % KERNEL_HEAD_DIM_MULTIPLE
        return F.pad(q_extra, (0, pad)), F.pad(k_extra, (0, pad))
