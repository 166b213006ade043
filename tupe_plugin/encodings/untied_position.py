"""TUPE's untied absolute positional correlation, its [CLS] reset, and the BERT-A^d ablation.

TUPE is Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training", arXiv 2006.15595
(Eq. 7, 9, 10, §3.3, §4.3). Positions are a learned table P, layer-normalised (p = LayerNorm(P)),
projected by their own U^Q, U^K (one pair for the whole model, split into heads like W^Q / W^K);
``proj_bias`` gives U^Q, U^K a bias, as the authors' released code does. How each module adds its part
to the shared :class:`~.positional_term.PositionalTerm`:

* :class:`UntiedPositionalCorrelation` (Eq. 7): per head, the factors (a ``LowRank`` part) p U^Q_h and
  p U^K_h are appended to the word query/key; with the shared scale 1/sqrt(2 d_h) the
  kernel computes exactly ``(x W^Q)(x W^K)^T / sqrt(2 d_h) + (p U^Q)(p U^K)^T / sqrt(2 d_h)``.
  The paper's [CLS] reset (Eq. 9, ``cls_reset``): row 0 becomes theta_1 and column 0 (rows i != 0)
  theta_2, with theta_k[h] = (p_theta_k U^Q_h)(p_theta_k U^K_h)^T / sqrt(2 d_h) for two learned
  vectors. Two more dimensions do it: one that is 1 in every query but the [CLS] one and theta_2 in the
  [CLS] key, one that is theta_1 in the [CLS] query and 1 in every key (thetas before the shared scale,
  which the kernel applies); the positional parts of the [CLS] query and key are zeroed. (theta_1 is
  constant along its row, so it has no effect after the softmax; it is kept for fidelity to the
  equation and for the analysis pictures.)
* :class:`ReleaseUntiedPositionalCorrelation`, the reset of the authors' released code
  (``--cls-reset release``, see docs/official_tupe.md): the table has ``max_positions + 1`` rows and
  position t uses row t + 1; theta_1[h] is row 0's self-correlation (p_0 U^Q_h)(p_0 U^K_h), theta_2[h]
  the self-correlation of row 1 (the ``<s>`` slot), then the same factors reset row 0 and column 0.
* :class:`FourTermPositionShift`, BERT-A^d (§4.3): ``(xW^Q + pU^Q)(xW^K + pU^K)^T / sqrt(4 d_h)``, the
  four terms of the ablation, handed over as a ``Shift`` of the word query and key.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from fairseq.modules import LayerNorm
from torch import nn

from ..user_input.command_hints import input_length_fix
from .encoding import Encoding, option
from ..terms.parts import LowRank, Shift

# The widened heads (d_h + the untied factors) are padded to a multiple of this for the fused kernels.
KERNEL_HEAD_DIM_MULTIPLE = 8


@dataclass(frozen=True)
class UntiedOptions:
    untied_proj_bias: bool = option(
        False, help="give the untied projections U^Q/U^K a bias, as the authors' released code does")


class UntiedPositionalCorrelation(nn.Module):
    def __init__(self, max_positions, embed_dim, num_heads, cls_reset=False, proj_bias=False):
        super().__init__()
        self.max_positions = max_positions
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.embed_positions = nn.Embedding(max_positions, embed_dim)
        self.layer_norm = LayerNorm(embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=proj_bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=proj_bias)
        self.cls_vectors = nn.Parameter(torch.empty(2, embed_dim)) if cls_reset else None
        self.reset_parameters()

    def reset_parameters(self):
        for weight in (self.embed_positions.weight, self.q_proj.weight, self.k_proj.weight):
            nn.init.normal_(weight, mean=0.0, std=0.02)
        for proj in (self.q_proj, self.k_proj):
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)
        if self.cls_vectors is not None:
            nn.init.normal_(self.cls_vectors, mean=0.0, std=0.02)

    def _heads(self, x):
        return x.view(x.size(0), self.num_heads, self.head_dim).transpose(0, 1)

    def _project(self, vectors):
        p = self.layer_norm(vectors)
        return self._heads(self.q_proj(p)), self._heads(self.k_proj(p))

    def projections(self, seq_len):
        """(p U^Q, p U^K) for positions 0..seq_len-1, each (H, T, d_h), unscaled."""
        if seq_len > self.max_positions:
            raise ValueError(
                f"input of {seq_len} tokens is longer than the {self.max_positions} learned "
                f"positions of the untied positional table; {input_length_fix(self.max_positions)}"
            )
        return self._project(self._rows(seq_len))

    def positions(self, seq_len):
        """p = LayerNorm(P) of positions 0..seq_len-1, (T, d): what U^Q / U^K project."""
        if seq_len > self.max_positions:
            raise ValueError(f"the untied table holds {self.max_positions} positions, not {seq_len}")
        return self.layer_norm(self._rows(seq_len))

    def _rows(self, seq_len):
        """The table rows of positions 0..seq_len-1."""
        return self.embed_positions.weight[:seq_len]

    def cls_thetas(self):
        """(theta_1, theta_2) per head, unscaled: (p_theta U^Q_h) . (p_theta U^K_h), shape (H, 2);
        None without the [CLS] reset."""
        if self.cls_vectors is None:
            return None
        q, k = self._project(self.cls_vectors)
        return (q * k).sum(-1)

    def contribute(self, term, forward):
        """Add the untied factors to ``term`` as a :class:`~tupe_plugin.terms.parts.LowRank`, [CLS]-reset
        when the module resets it, zero-padded so that the widened heads fit the fused kernels."""
        q_extra, k_extra = self.projections(forward.seq_len)
        thetas = self.cls_thetas()
        if thetas is not None:
            q_extra, k_extra = _reset_factors(q_extra, k_extra, thetas.to(q_extra.dtype))
        pad = -(self.head_dim + q_extra.size(-1)) % KERNEL_HEAD_DIM_MULTIPLE
        term.add(LowRank(F.pad(q_extra, (0, pad)), F.pad(k_extra, (0, pad))))


def _reset_factors(q_pos, k_pos, thetas):
    """Factors whose product is Eq. 9's reset of the untied term (see the module docstring)."""
    num_heads, seq_len, _ = q_pos.shape
    is_cls = torch.zeros(seq_len, 1, dtype=q_pos.dtype, device=q_pos.device)
    is_cls[0] = 1
    not_cls = 1 - is_cls
    theta_1 = thetas[:, 0, None, None] * is_cls
    theta_2 = thetas[:, 1, None, None] * is_cls
    q_extra = torch.cat([q_pos * not_cls, not_cls.expand(num_heads, -1, -1), theta_1], -1)
    k_extra = torch.cat([k_pos * not_cls, theta_2, torch.ones_like(theta_2)], -1)
    return q_extra, k_extra


class ReleaseUntiedPositionalCorrelation(UntiedPositionalCorrelation):
    """Untied term over table rows 1..T; theta_1, theta_2 = self-correlations of rows 0 and 1."""

    def __init__(self, max_positions, embed_dim, num_heads, proj_bias=False):
        super().__init__(max_positions + 1, embed_dim, num_heads, proj_bias=proj_bias)
        self.max_positions = max_positions

    def _rows(self, seq_len):
        return self.embed_positions.weight[1 : seq_len + 1]

    def cls_thetas(self):
        """(theta_1, theta_2) per head, unscaled: self-correlations of table rows 0 and 1, (H, 2)."""
        q, k = self._project(self.embed_positions.weight[:2])
        return (q * k).sum(-1)


class FourTermPositionShift(UntiedPositionalCorrelation):
    """BERT-A^d: the untied table's p U^Q, p U^K shift the word query and key of every layer."""

    def contribute(self, term, forward):
        """Add p U^Q, p U^K to ``term`` as a :class:`~tupe_plugin.terms.parts.Shift` of the query and key."""
        term.add(Shift(*self.projections(forward.seq_len)))


def build_untied_position(config):
    """The untied table of a :class:`~.position_config.PositionConfig` that uses it, with its [CLS] reset."""
    sizes = (config.max_positions, config.embed_dim, config.num_heads)
    if config.four_term:
        return FourTermPositionShift(*sizes, proj_bias=config.untied_proj_bias)
    if config.release:
        return ReleaseUntiedPositionalCorrelation(*sizes, proj_bias=config.untied_proj_bias)
    return UntiedPositionalCorrelation(*sizes, cls_reset=config.cls_reset_applies,
                                       proj_bias=config.untied_proj_bias)


def untied_logit_terms(config):
    """TUPE's two terms (word and position, Eq. 7), BERT-A^d's four (§4.3)."""
    return 4 if config.four_term else 2


def untied_parts(config):
    """TUPE's factors (LowRank), BERT-A^d's shifts of the query and key (Shift)."""
    return (Shift,) if config.four_term else (LowRank,)


def unused_untied_errors(config):
    if not config.untied_proj_bias:
        return []
    return ["--untied-proj-bias gives U^Q/U^K a bias but --untied-pos none has no U^Q/U^K; use it with "
            "--untied-pos tupe (or four-term)"]


UNTIED = Encoding(
    name="untied", label="TUPE's untied term", kind="untied", family="untied_pos",
    choices=("tupe", "four-term"),
    choices_help="tupe = untied (pU^Q)(pU^K)^T/sqrt(2d_h) (TUPE Eq. 7); four-term = the BERT-A^d ablation",
    summary="the untied position-to-position correlation (pU^Q)(pU^K)^T of a learned table, shared by the "
    "layers (TUPE Eq. 7); four-term: positions added to the word query and key (BERT-A^d, §4.3)",
    citation="Ke, He, Liu, Rethinking Positional Encoding in Language Pre-training, arXiv 2006.15595",
    slot="untied_position", options=UntiedOptions, build=build_untied_position,
    logit_terms=untied_logit_terms, unused_errors=unused_untied_errors,
    export_names=(("embed_positions.", "untied.position_embeddings."), ("layer_norm.", "untied.LayerNorm."),
                  ("q_proj.", "untied.query."), ("k_proj.", "untied.key."),
                  ("cls_vectors", "untied.cls_vectors")),
    exported=True, parts=untied_parts,
)
