"""Every position-encoding choice of the model, declared, parsed and checked once: :class:`PositionConfig`.

The flags name one family each (``--abs-pos``, ``--rel-pos``, ``--untied-pos``, ``--cls-reset``,
``--rotary`` and their options); this module owns their names, choices and help texts
(:meth:`PositionConfig.add_args`), their defaults, the rules that combine them and the facts derived
from them (the attention scale, which tables are learned, the released [CLS] semantics). Code elsewhere
asks the config (``config.t5_bias``, ``config.shaw_table``, ...) and never compares flag strings.

Papers: TUPE is Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training", arXiv
2006.15595; the APE/RPE variants are Wang, Shang, Lioma, Jiang, Yang, Liu, Simonsen, "On Position
Embeddings in BERT", ICLR 2021 (openreview.net/forum?id=onxoVA9FxMw); RoPE is Su, Lu, Pan, Murtadha,
Wen, Liu, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864; ALiBi is
Press, Smith, Lewis, "Train Short, Test Long: Attention with Linear Biases Enables Input Length
Extrapolation", arXiv 2108.12409; KERPLE is Chi, Fan, Ramadge, Rudnicky, "KERPLE: Kernelized Relative
Positional Embedding for Length Extrapolation", arXiv 2205.09921; Sandwich is Chi, Fan, Rudnicky, Ramadge,
"Dissecting Transformer Length Extrapolation via the Lens of Receptive Field Analysis", arXiv 2212.10356;
FIRE is Li et al., "Functional Interpolation for Relative Positions Improves Long Context Transformers",
arXiv 2310.04418; DeBERTa is He, Liu, Gao, Chen, "DeBERTa: Decoding-enhanced BERT with Disentangled
Attention", arXiv 2006.03654.
"""

import math
from dataclasses import dataclass, field, fields

import torch
from fairseq.utils import safe_getattr

from ..user_input.cli_types import finite_float
from ..user_input.memory_limits import beyond_memory
from ..user_input.user_errors import UserError

ABS_POS_CHOICES = ("none", "learned", "sinusoidal", "learnable-sinusoidal")
SHAW_TABLES = ("learned", "sinusoidal", "learnable-sinusoidal")
SHAW_PREFIX = "shaw-"
KERPLE_PREFIX = "kerple-"
REL_POS_CHOICES = (("none", "t5", "alibi", KERPLE_PREFIX + "log", KERPLE_PREFIX + "power", "sandwich", "fire",
                    "deberta")
                   + tuple(SHAW_PREFIX + table for table in SHAW_TABLES))
UNTIED_CHOICES = ("none", "tupe", "four-term")
CLS_RESET_CHOICES = ("none", "paper", "release")
ROTARY_CHOICES = ("none", "fixed", "learnable")
ROTARY_SCALING_CHOICES = ("none", "linear", "ntk")
DEBERTA_P2C_CHOICES = ("released", "paper")
DEBERTA_REL_PROJ_BIAS_CHOICES = ("query", "both", "none")
KERPLE_PARAM_CHOICES = ("clamped", "softplus")
FIRE_NORMALISER_CHOICES = ("largest-distance", "length")
SANDWICH_FREQUENCY_CHOICES = ("one-based", "zero-based")

# What a preset leaves unset: TUPE-R (the base architecture of the model).
DEFAULTS = dict(
    abs_pos="none",
    rel_pos="t5",
    rel_pos_buckets=32,
    rel_pos_max_distance=128,
    shaw_max_distance=64,
    shaw_keys_only=False,
    untied_pos="tupe",
    cls_reset="paper",
    untied_proj_bias=False,
    rotary="none",
    rotary_base=10000.0,
    rotary_scaling="none",
    rotary_scaling_factor=1.0,
    alibi_asymmetric=False,
    alibi_learned_slopes=False,
    sandwich_dim=128,
    sandwich_scale=1.0,
    sandwich_frequencies="one-based",
    kerple_param="clamped",
    fire_hidden=32,
    fire_threshold=512.0,
    fire_signed=False,
    fire_normaliser="largest-distance",
    deberta_max_distance=512,
    deberta_buckets=0,
    deberta_share_att_key=False,
    deberta_p2c="released",
    deberta_rel_proj_bias="query",
    deberta_table_norm=False,
    deberta_emd=False,
    deberta_emd_layers=2,
)

# The options whose default changed to follow the encoding's released code: {flag: (the --rel-pos family
# it belongs to, its value in the checkpoints saved before the option existed)}. A checkpoint saved before
# then records no value for it and is rebuilt with that value, as it was trained.
BEFORE_RELEASED_FORMS = dict(
    deberta_p2c=("deberta", "paper"),
    deberta_rel_proj_bias=("deberta", "none"),
    kerple_param=(KERPLE_PREFIX, "softplus"),
    fire_normaliser=("fire", "length"),
    sandwich_frequencies=("sandwich", "zero-based"),
)


# What each size flag checked against the machine's memory usually is, for the message of a typo.
USUAL_SIZES = {
    "deberta_max_distance": "512, as released", "deberta_buckets": "256 in the released v2/v3",
    "shaw_max_distance": "64 is the default", "sandwich_dim": "128 is the default",
    "fire_hidden": "32, the paper's", "rel_pos_buckets": "32, T5's",
}


class PositionFlagError(UserError, ValueError):
    """A model flag (or combination of flags) that cannot be built."""


def set_defaults(args, saved=False):
    """Fill every position flag the command line and the preset left unset; ``saved``: ``args`` are a
    checkpoint's, whose unrecorded options take the value they had when it was trained
    (:func:`value_as_trained`)."""
    for flag, value in DEFAULTS.items():
        if safe_getattr(args, flag, None) is None:
            setattr(args, flag, value_as_trained(flag, args.rel_pos,
                                                 safe_getattr(args, "deberta_share_att_key", False))
                    if saved and flag in BEFORE_RELEASED_FORMS else value)


def value_as_trained(flag, rel_pos, deberta_share_att_key=False):
    """The value of the option ``flag`` of :data:`BEFORE_RELEASED_FORMS` for a checkpoint of
    ``--rel-pos rel_pos`` that records none: the value before the option existed when it is an option of
    that family, the default otherwise. (DeBERTa's layers with --deberta-share-att-key have no relative
    projections of their own, so no bias of them to mark.)"""
    family, before = BEFORE_RELEASED_FORMS[flag]
    shared = flag == "deberta_rel_proj_bias" and deberta_share_att_key
    applies = isinstance(rel_pos, str) and rel_pos.startswith(family) and not shared
    return before if applies else DEFAULTS[flag]


def _flag(default, help, choices=None, metavar=None):
    """A config field that is also a command-line flag: its metadata declare the flag."""
    return field(default=default, metadata=dict(help=help, choices=choices, metavar=metavar))


def _flag_is(flag, value, doc=None, negate=False):
    """A derived fact declared as a property: whether ``flag`` is ``value`` (is not, with ``negate``)."""
    return property(lambda self: (getattr(self, flag) == value) != negate,
                    doc=doc or f"--{flag.replace('_', '-')} {'is not' if negate else 'is'} {value}")


@dataclass(frozen=True)
class PositionConfig:
    """The checked position-encoding choices of one model and the facts derived from them."""

    embed_dim: int
    num_heads: int
    max_positions: int
    abs_pos: str = _flag("none", choices=ABS_POS_CHOICES,
                         help="absolute position embedding added to the word embedding at the input")
    rel_pos: str = _flag(
        "none", choices=REL_POS_CHOICES,
        help="relative position term: t5 = one bias per head and distance bucket, shared by all layers "
        "(TUPE Eq. 5/8); alibi = the fixed bias -m_h|j-i| (Press et al. 2022); kerple-log / "
        "kerple-power = -r1 log(1 + r2|j-i|) / -r1 |j-i|^r2 with r1, r2 > 0 learned per head (Chi et al. "
        "2022); sandwich = the fixed bias (p_i . p_j - d'/2) / (8h/H) of sinusoids p of dimension d', "
        "head h = 1..H compressed as ALiBi's slopes (Chi et al. "
        "2023); fire = f(psi(|j-i|) / psi(max(L, T))), psi(x) = log(cx + 1), f a small MLP, c and L learned "
        "(Li et al. 2023, normalised by the length T for encoders); deberta = DeBERTa's disentangled "
        "attention, content-to-position q_i . K^r_d(i,j) and position-to-content k_j . Q^r_d(j,i) from "
        "one relative table shared by all layers, projected per layer (He et al. 2021 Eq. 4); shaw-* = "
        "Shaw vectors "
        "a_clip(j-i) added to keys and values, one table shared by heads and layers, learned / fixed "
        "sinusoidal / learnable-frequency sinusoidal (Wang et al. 2021 Eq. 4)",
    )
    rotary: str = _flag(
        "none", choices=ROTARY_CHOICES,
        help="rotary position embedding (RoPE, Su et al. 2021): q and k of every layer rotated by "
        "position; learnable = the d_h/2 frequencies are parameters initialised at the fixed ones",
    )
    rotary_base: float = _flag(10000.0, metavar="B", help="RoPE's frequency base (default 10000)")
    rotary_scaling: str = _flag(
        "none", choices=ROTARY_SCALING_CHOICES,
        help="RoPE's angles scaled for inputs longer than in training, by --rotary-scaling-factor F (may be "
        "set when validating or fine-tuning a checkpoint trained without it): linear = position "
        "interpolation, position p rotated as p/F (Chen et al. 2023); ntk = NTK-aware scaling of the fixed "
        "base, base * F^(d_h/(d_h-2)) (bloc97 2023; YaRN, Peng et al. 2023, §3)",
    )
    rotary_scaling_factor: float = _flag(1.0, metavar="F", help="the factor F > 1 of --rotary-scaling, e.g. "
                                         "the evaluation length over the training length")
    rel_pos_buckets: int = _flag(32, metavar="N", help="T5 buckets (both directions)")
    rel_pos_max_distance: int = _flag(128, metavar="N",
                                      help="T5 distance beyond which all offsets share the last bucket")
    alibi_asymmetric: bool = _flag(
        False, help="ALiBi with a slope per side: m_h for keys before the query, the paper's slopes in "
        "reverse head order after it"
    )
    alibi_learned_slopes: bool = _flag(False, help="ALiBi's slopes learned, m = exp(a), from the fixed ones")
    sandwich_dim: int = _flag(128, metavar="D", help="Sandwich: the dimension d' of the sinusoids p_i, p_j")
    sandwich_scale: float = _flag(1.0, metavar="S", help="Sandwich: the bias is S (p_i . p_j - d'/2) / "
                                  "(8h/H) (default 1, the paper's)")
    sandwich_frequencies: str = _flag(
        "one-based", choices=SANDWICH_FREQUENCY_CHOICES,
        help="Sandwich: the frequencies w_k = 10000^(-2k/d') of p, one-based = k = 1..d'/2 (the paper's "
        "equation, as NVIDIA NeMo; default), zero-based = k = 0..d'/2-1 (the sinusoids of Vaswani et al., "
        "as PyTorch attention-gym; checkpoints saved before this option)")
    kerple_param: str = _flag(
        "clamped", choices=KERPLE_PARAM_CHOICES,
        help="KERPLE: how r1, r2 are kept positive; clamped = learned as they are, clamped to >= 0.01 (the "
        "power exponent to [0.01, 2]) before each forward, started at random per head as the authors' "
        "released code (default); softplus = r = softplus(a) (the exponent 2 sigmoid(a)), every head "
        "started at r1 = r2 = 1 (checkpoints saved before this option)")
    fire_hidden: int = _flag(32, metavar="N", help="FIRE: hidden units of the MLP f (default 32)")
    fire_threshold: float = _flag(512.0, metavar="L", help="FIRE: initial value of the learned threshold L")
    fire_signed: bool = _flag(False, help="FIRE: the sign of j - i as a second input of f (keys before and "
                              "after the query may differ)")
    fire_normaliser: str = _flag(
        "largest-distance", choices=FIRE_NORMALISER_CHOICES,
        help="FIRE: psi(|j-i|) divided by largest-distance = psi(max(L, T-1)) + 1e-6, the paper's normaliser "
        "of its last causal row with the appendix code's epsilon (default); length = psi(max(L, T)) "
        "(checkpoints saved before this option)")
    deberta_max_distance: int = _flag(
        512, metavar="K", help="DeBERTa: k, the table has 2k rows and i - j is clipped to [-k, k-1] (He "
        "et al. 2021 Eq. 3; default 512, the released max_relative_positions); with --deberta-buckets, the "
        "distance at which the log buckets reach the last")
    deberta_buckets: int = _flag(
        0, metavar="N", help="DeBERTa v2's log buckets (position_buckets, 256 in the released v2/v3): the "
        "table has 2N rows, distances up to N/2 exact, log-spaced beyond up to --deberta-max-distance; "
        "0 = none, distances clipped (v1, default)")
    deberta_share_att_key: bool = _flag(
        False, help="DeBERTa v2/v3's share_att_key: the relative table is projected by the layer's own "
        "content query and key projections (W^q, W^k with their biases), not by W^{q,r}, W^{k,r} of its own")
    deberta_p2c: str = _flag(
        "released", choices=DEBERTA_P2C_CHOICES,
        help="DeBERTa: the row the position-to-content term k_j . Q^r reads; released = delta(i, j), the "
        "content-to-position term's, as the authors' released code and Hugging Face's (default); paper = "
        "delta(j, i), Eq. 4 as printed (checkpoints saved before this option)")
    deberta_rel_proj_bias: str = _flag(
        "query", choices=DEBERTA_REL_PROJ_BIAS_CHOICES,
        help="DeBERTa: biases of a layer's own projections of the relative table (without "
        "--deberta-share-att-key); query = on Q^r = P W^{q,r} + b only, as the released v1 (default); "
        "both = on Q^r and K^r, as the released v2/v3; none = Eq. 4 as printed (checkpoints saved before "
        "this option)")
    deberta_table_norm: bool = _flag(
        False, help="DeBERTa v2/v3's norm_rel_ebd: a LayerNorm of the encoder's normalises the relative "
        "table before the layers project it")
    deberta_emd: bool = _flag(
        False, help="DeBERTa's Enhanced Mask Decoder (He et al. 2021 §3.2, as released): the masked-LM head "
        "reads the last layer applied again --deberta-emd-layers times, its queries the second-to-last "
        "layer's output plus a learned absolute position table (--max-positions rows), its keys and values "
        "that output; needs --rel-pos deberta and --abs-pos none; features (heads, analysis) are unchanged")
    deberta_emd_layers: int = _flag(
        2, metavar="N", help="passes of the Enhanced Mask Decoder (--deberta-emd), the last layer's weights "
        "shared (default 2, as released)")
    shaw_max_distance: int = _flag(64, metavar="K",
                                   help="Shaw relative distances are clipped to [-K, K] (default 64)")
    shaw_keys_only: bool = _flag(False, help="add the Shaw vectors to the keys only, not to the values")
    untied_pos: str = _flag(
        "none", choices=UNTIED_CHOICES,
        help="position-to-position term computed in attention: tupe = untied (pU^Q)(pU^K)^T/sqrt(2d_h) "
        "(TUPE Eq. 7); four-term = the BERT-A^d ablation",
    )
    cls_reset: str = _flag(
        "none", choices=CLS_RESET_CHOICES,
        help="paper = reset the content-free correlations from/to [CLS] to learned theta_1/theta_2 "
        "(TUPE Eq. 9-11): built with U^Q/U^K under --untied-pos tupe, two scalars per head reset in the "
        "--rel-pos bias otherwise; release = as the authors' released code: theta_1/theta_2 from the "
        "untied table's rows 0 and 1 (the table gets max_positions + 1 rows), the T5 bias reset on its "
        "own to two extra buckets",
    )
    untied_proj_bias: bool = _flag(
        False, help="give the untied projections U^Q/U^K a bias, as the authors' released code does"
    )

    @classmethod
    def add_args(cls, group):
        """Declare every position flag on ``group`` (argparse), without defaults: the preset and
        :func:`set_defaults` fill what the command line leaves unset; a float flag refuses nan and inf."""
        for flag in fields(cls):
            if "help" not in flag.metadata:
                continue
            if flag.type is bool:
                group.add_argument(option(flag.name), action="store_true", help=flag.metadata["help"])
            else:
                declared = {key: value for key, value in flag.metadata.items() if value is not None}
                flag_type = finite_float if flag.type is float else flag.type
                group.add_argument(option(flag.name), type=flag_type, **declared)

    @classmethod
    def from_args(cls, args):
        """The config of fairseq model ``args`` (argparse or DictConfig); raises
        :class:`PositionFlagError` listing every flag that cannot be built."""
        config = cls(
            embed_dim=args.encoder_embed_dim,
            num_heads=args.encoder_attention_heads,
            max_positions=args.max_positions,
            **{flag: getattr(args, flag) for flag in DEFAULTS},
        )
        config.check()
        return config

    # -- derived facts (read these, never the flag strings) -------------------------------------

    @property
    def head_dim(self):
        return self.embed_dim // max(self.num_heads, 1)

    @property
    def absolute(self):
        """The absolute PE added at the input (learned / sinusoidal / learnable-sinusoidal), or None."""
        return None if self.abs_pos == "none" else self.abs_pos

    learned_absolute_table = _flag_is("abs_pos", "learned")
    learnable_absolute_frequencies = _flag_is("abs_pos", "learnable-sinusoidal")
    untied = _flag_is("untied_pos", "tupe", "TUPE's untied (pU^Q)(pU^K)^T term (Eq. 7), factored into "
                      "widened heads.")
    four_term = _flag_is("untied_pos", "four-term", "The BERT-A^d ablation: positions shift the word query "
                         "and key (TUPE §4.3).")
    untied_table = _flag_is("untied_pos", "none", "An untied table with U^Q/U^K (TUPE or BERT-A^d).",
                            negate=True)
    t5_bias = _flag_is("rel_pos", "t5")
    alibi = _flag_is("rel_pos", "alibi", "ALiBi: the bias -m_h |j - i| (slopes per side, learned: options).")
    sandwich = _flag_is("rel_pos", "sandwich", "Sandwich: the fixed bias (p_i . p_j - d'/2) / (8h/H), no "
                        "parameters.")
    fire = _flag_is("rel_pos", "fire", "FIRE: a learned MLP of the normalised log-distance.")
    kerple_power = _flag_is("rel_pos", KERPLE_PREFIX + "power", "KERPLE's power variant -r1 |j - i|^r2.")
    kerple_clamped = _flag_is("kerple_param", "clamped", "KERPLE's r1, r2 learned as they are and clamped, "
                              "as released.")
    fire_largest_distance = _flag_is("fire_normaliser", "largest-distance", "FIRE normalised by "
                                     "psi(max(L, T - 1)) + eps.")
    sandwich_one_based = _flag_is("sandwich_frequencies", "one-based", "Sandwich's frequencies k = 1..d'/2.")
    deberta_released_p2c = _flag_is("deberta_p2c", "released", "DeBERTa's p2c term reads delta(i, j).")
    deberta = _flag_is("rel_pos", "deberta", "DeBERTa's content-to-position and position-to-content terms.")

    @property
    def deberta_own_projections(self):
        """The biases of the W^{q,r}, W^{k,r} by which every layer projects DeBERTa's shared table
        (``--deberta-rel-proj-bias``: query, both or none), or None: no DeBERTa, or its table projected by
        the content projections (``--deberta-share-att-key``)."""
        return self.deberta_rel_proj_bias if self.deberta and not self.deberta_share_att_key else None

    @property
    def kerple(self):
        """KERPLE's learned bias of |j - i| (log or power variant)."""
        return self.rel_pos.startswith(KERPLE_PREFIX)

    @property
    def distance_bias(self):
        """A bias of the distance, made for length extrapolation (ALiBi, KERPLE, Sandwich, FIRE)."""
        return self.alibi or self.kerple or self.sandwich or self.fire
    rotary_applies = _flag_is("rotary", "none", "RoPE: q, k rotated by position.", negate=True)
    learnable_rotary_frequencies = _flag_is("rotary", "learnable")

    @property
    def shaw_table(self):
        """The Shaw table kind (learned / sinusoidal / learnable-sinusoidal), or None."""
        return self.rel_pos[len(SHAW_PREFIX):] if self.rel_pos.startswith(SHAW_PREFIX) else None

    shaw_learned = _flag_is("shaw_table", "learned", "Shaw vectors from a learned table.")
    shaw_learnable_frequencies = _flag_is("shaw_table", "learnable-sinusoidal",
                                          "Shaw vectors from sinusoids of learnable frequencies.")

    @property
    def shaw_values(self):
        """Shaw vectors added to the values too: the probabilities are needed."""
        return self.shaw_table is not None and not self.shaw_keys_only

    cls_reset_applies = _flag_is("cls_reset", "none", negate=True)
    release = _flag_is("cls_reset", "release", "The authors' released [CLS] semantics (extra table row, "
                       "per-term T5 reset).")
    zero_cls_bias = _flag_is("cls_reset", "paper", "Eq. 11: the paper's reset replaces row/column 0 of the "
                             "whole content-free term.")

    @property
    def offset_bias(self):
        """A content-free bias of the offset j - i (every --rel-pos but Shaw's and DeBERTa's, which depend
        on the content)."""
        return self.rel_pos != "none" and self.shaw_table is None and not self.deberta

    @property
    def own_cls_thetas(self):
        """The paper's [CLS] reset without TUPE's untied term: theta_1/theta_2 are learned per head and
        reset the --rel-pos bias."""
        return self.zero_cls_bias and not self.untied

    @property
    def learned_tables(self):
        """A learned table fixes the longest input (the Enhanced Mask Decoder's: of the masked-LM output)."""
        return self.learned_absolute_table or self.untied_table or self.deberta_emd

    @property
    def learned_dense_bias(self):
        """A learned (H, T, T) bias: on CPU it needs BiasedFlashAttention."""
        return (self.t5_bias or self.shaw_table is not None or self.kerple or self.fire or self.deberta
                or self.alibi and self.alibi_learned_slopes or self.own_cls_thetas)

    @property
    def scale(self):
        """1/sqrt(d_h); 1/sqrt(2 d_h) with TUPE's untied term; 1/sqrt(4 d_h) for BERT-A^d; 1/sqrt(3 d_h)
        for DeBERTa's three terms (He et al. 2021 Eq. 4)."""
        terms = 2 if self.untied else 4 if self.four_term else 3 if self.deberta else 1
        return 1.0 / math.sqrt(terms * max(self.head_dim, 1))

    def describe(self):
        """The position flags as they would be passed on the command line."""
        return (f"--abs-pos {self.abs_pos}, --untied-pos {self.untied_pos}, "
                f"--rel-pos {self.rel_pos}, --rotary {self.rotary}, --cls-reset {self.cls_reset}")

    # -- checks --------------------------------------------------------------------------------

    def check(self):
        errors = []
        for flag in fields(self):  # what the parser checks, for a config that did not come through it
            value, choices = getattr(self, flag.name), flag.metadata.get("choices")
            if choices and value not in choices:
                errors.append(f"{option(flag.name)} must be one of {', '.join(choices)}, got {value}")
            elif flag.type is float and not math.isfinite(value):
                errors.append(f"{option(flag.name)} must be a finite number, got {value}")
        if errors:
            raise PositionFlagError("invalid model flags:\n  " + "\n  ".join(errors))
        if self.absolute is not None and self.untied_table:
            errors.append(
                f"--abs-pos {self.abs_pos} adds positions to the input while --untied-pos "
                f"{self.untied_pos} models them in attention; choose one absolute encoding "
                "(TUPE: --abs-pos none --untied-pos tupe; BERT-A: --abs-pos learned --untied-pos none)"
            )
        if self.release and not self.untied:
            errors.append("--cls-reset release needs --untied-pos tupe: theta_1/theta_2 are rows 0 and 1 of "
                          "the released untied table")
        elif self.four_term and self.cls_reset_applies:
            errors.append(f"--cls-reset {self.cls_reset} with --untied-pos four-term: BERT-A^d mixes "
                          "positions into the word query and key, no content-free term to reset; use "
                          "--cls-reset none")
        elif self.zero_cls_bias and not (self.untied or self.offset_bias):
            errors.append("--cls-reset paper resets a content-free term (TUPE §3.3) and there is none: add "
                          "--untied-pos tupe or a --rel-pos bias (t5, alibi, kerple-*, sandwich, fire)")
        if self.untied_proj_bias and not self.untied_table:
            errors.append(
                "--untied-proj-bias gives U^Q/U^K a bias but --untied-pos none has no U^Q/U^K; "
                "use it with --untied-pos tupe (or four-term)"
            )
        if self.t5_bias:
            buckets, distance = self.rel_pos_buckets, self.rel_pos_max_distance
            if buckets < 4 or buckets % 2:
                errors.append(f"--rel-pos-buckets must be even and >= 4, got {buckets}")
            elif distance <= buckets // 4:
                errors.append(
                    f"--rel-pos-max-distance ({distance}) must exceed the exact-distance buckets "
                    f"per direction (--rel-pos-buckets / 4 = {buckets // 4})"
                )
        if self.shaw_table is not None:
            if self.shaw_max_distance < 1:
                errors.append(f"--shaw-max-distance must be >= 1, got {self.shaw_max_distance}")
            if not self.shaw_learned and self.head_dim % 2:
                errors.append(f"--rel-pos {self.rel_pos} needs an even head dimension, got {self.head_dim}")
        for flag in ("alibi_asymmetric", "alibi_learned_slopes"):
            if getattr(self, flag) and not self.alibi:
                errors.append(f"{option(flag)} is an option of ALiBi; add --rel-pos alibi (got --rel-pos "
                              f"{self.rel_pos})")
        if self.fire_signed and not self.fire:
            errors.append(f"--fire-signed is an option of FIRE; add --rel-pos fire (got --rel-pos "
                          f"{self.rel_pos})")
        for flag, (family, _) in BEFORE_RELEASED_FORMS.items():
            if getattr(self, flag) != DEFAULTS[flag] and not self.rel_pos.startswith(family):
                errors.append(f"{option(flag)} is an option of --rel-pos {family.rstrip('-')}"
                              f"{'*' if family.endswith('-') else ''} (got --rel-pos {self.rel_pos})")
        if self.fire and self.fire_hidden < 1:
            errors.append(f"--fire-hidden must be >= 1, got {self.fire_hidden}")
        if self.fire and self.fire_threshold < 1:
            errors.append(f"--fire-threshold must be >= 1, got {self.fire_threshold}")
        if self.sandwich and (self.sandwich_dim < 2 or self.sandwich_dim % 2):
            errors.append(f"--sandwich-dim must be even and >= 2, got {self.sandwich_dim}")
        if self.sandwich and self.sandwich_scale <= 0:
            errors.append(f"--sandwich-scale must be > 0, got {self.sandwich_scale}")
        errors += self._deberta_errors()
        errors += self._sizes_beyond_memory()
        errors += self._rotary_and_alibi_errors()
        errors += self._rotary_scaling_errors()
        if self.absolute is not None and not self.learned_absolute_table and self.embed_dim % 2:
            errors.append(f"--abs-pos {self.abs_pos} needs an even --encoder-embed-dim, got {self.embed_dim}")
        if errors:
            raise PositionFlagError("invalid model flags:\n  " + "\n  ".join(errors))

    def sized_tensors(self):
        """(flag, its value, the tensor it sizes, that tensor's float32 bytes) of each size flag of this
        encoding, at the model's shape: the relative tables (rows x D for DeBERTa, x d_h for Shaw, x H for
        T5), Sandwich's angles and FIRE's hidden layer over the 2P - 1 offsets of P = max_positions."""
        offsets, sizes = 2 * self.max_positions - 1, []
        if self.deberta:
            flag = "deberta_buckets" if self.deberta_buckets else "deberta_max_distance"
            rows = 2 * getattr(self, flag)
            sizes.append((flag, getattr(self, flag), f"relative table ({rows} rows of {self.embed_dim})",
                          rows * self.embed_dim * 4))
        if self.shaw_table is not None:
            rows = 2 * self.shaw_max_distance + 1
            sizes.append(("shaw_max_distance", self.shaw_max_distance,
                          f"Shaw table ({rows} rows of {self.head_dim})", rows * self.head_dim * 4))
        if self.sandwich:
            half = self.sandwich_dim // 2
            sizes.append(("sandwich_dim", self.sandwich_dim, f"Sandwich angles ({offsets} offsets x {half})",
                          offsets * half * 4))
        if self.fire:
            sizes.append(("fire_hidden", self.fire_hidden,
                          f"FIRE hidden layer ({offsets} offsets x {self.fire_hidden})",
                          offsets * self.fire_hidden * 4))
        if self.t5_bias:
            sizes.append(("rel_pos_buckets", self.rel_pos_buckets,
                          f"T5 table ({self.rel_pos_buckets} rows of {self.num_heads})",
                          self.rel_pos_buckets * self.num_heads * 4))
        return sizes

    def _sizes_beyond_memory(self):
        """A size flag whose tensor alone exceeds the machine's memory is a typo, refused before anything
        is allocated (as --max-positions is)."""
        errors = []
        for flag, value, tensor, nbytes in self.sized_tensors():
            if problem := beyond_memory(f"{option(flag)} {value}", tensor, nbytes):
                errors.append(f"{problem} ({USUAL_SIZES[flag]})")
        return errors

    def _deberta_errors(self):
        if not self.deberta:
            changed = [option(flag) for flag in ("deberta_max_distance", "deberta_buckets",
                                                 "deberta_share_att_key", "deberta_table_norm", "deberta_emd",
                                                 "deberta_emd_layers")
                       if getattr(self, flag) != DEFAULTS[flag]]
            return [f"{flag} is an option of DeBERTa; add --rel-pos deberta (got --rel-pos {self.rel_pos})"
                    for flag in changed]
        errors = self._enhanced_mask_decoder_errors()
        if self.untied_table:
            errors.append(f"--rel-pos deberta with --untied-pos {self.untied_pos}: DeBERTa's position terms "
                          "depend on the content and are scaled by 1/sqrt(3 d_h), TUPE's untied term is "
                          "content-free and scaled by 1/sqrt(2 d_h); their sum is defined by neither paper, "
                          "use --untied-pos none")
        if self.deberta_share_att_key and self.deberta_rel_proj_bias != DEFAULTS["deberta_rel_proj_bias"]:
            errors.append(f"--deberta-rel-proj-bias {self.deberta_rel_proj_bias} with "
                          "--deberta-share-att-key: the layers project the table by their content "
                          "projections, with their biases, and have no relative projections of their own; "
                          "drop --deberta-rel-proj-bias")
        if self.deberta_max_distance < 1:
            errors.append(f"--deberta-max-distance must be >= 1, got {self.deberta_max_distance}")
        buckets = self.deberta_buckets
        if buckets and (buckets < 2 or buckets % 2):
            errors.append(f"--deberta-buckets must be 0 (none) or even and >= 2, got {buckets}")
        elif buckets and self.deberta_max_distance - 1 <= buckets // 2:
            errors.append(f"--deberta-max-distance ({self.deberta_max_distance}) must be > --deberta-buckets "
                          f"/ 2 + 1 = {buckets // 2 + 1}: the log buckets span the distances from "
                          f"{buckets // 2} to --deberta-max-distance - 1")
        return errors

    def _enhanced_mask_decoder_errors(self):
        if not self.deberta_emd:
            changed = self.deberta_emd_layers != DEFAULTS["deberta_emd_layers"]
            return ["--deberta-emd-layers is an option of the Enhanced Mask Decoder; add --deberta-emd"] \
                if changed else []
        errors = []
        if self.absolute is not None:
            errors.append(f"--deberta-emd with --abs-pos {self.abs_pos}: the Enhanced Mask Decoder adds the "
                          "absolute positions before the masked-LM head, as the released code does only when "
                          "none enter at the input; use --abs-pos none")
        if self.deberta_emd_layers < 1:
            errors.append(f"--deberta-emd-layers must be >= 1, got {self.deberta_emd_layers}")
        return errors

    def _rotary_scaling_errors(self):
        scaling, factor = self.rotary_scaling, self.rotary_scaling_factor
        if scaling == "none":
            return [] if factor == 1 else [f"--rotary-scaling-factor {factor} with --rotary-scaling none "
                                           "scales nothing; add --rotary-scaling linear (or ntk)"]
        errors = []
        if not self.rotary_applies:
            errors.append(f"--rotary-scaling {scaling} scales RoPE's angles and --rotary is none; add "
                          "--rotary fixed (or learnable) or drop --rotary-scaling")
        if not 1 < factor < math.inf:
            errors.append(f"--rotary-scaling {scaling} needs --rotary-scaling-factor F > 1 (finite), e.g. "
                          f"the evaluation length over the training length; got {factor}")
        if scaling == "ntk" and self.learnable_rotary_frequencies:
            errors.append("--rotary-scaling ntk changes RoPE's fixed base and --rotary learnable has learned "
                          "frequencies, no base; use --rotary-scaling linear (positions divided by F)")
        elif scaling == "ntk" and self.rotary_applies and self.head_dim == 2:
            errors.append("--rotary-scaling ntk needs a head dimension > 2: base^(d_h/(d_h-2)) is undefined "
                          "at d_h = 2; use --rotary-scaling linear")
        elif 1 < factor < math.inf and self.rotary_applies:
            errors += self._overflowing_angles(scaling, factor)
        return errors

    def _overflowing_angles(self, scaling, factor):
        """A factor whose angles leave float32, in which RoPE computes them (Sinusoid.angles): ntk's base
        B F^(d_h/(d_h-2)) beyond float32's largest number (every frequency but the first would be 0), or
        linear's 1/F below its smallest (every position rotated by 0)."""
        largest = torch.finfo(torch.float32).max
        if scaling == "ntk" and self.rotary_base > 1 and self.head_dim > 2 and math.log(self.rotary_base) \
                + self.head_dim / (self.head_dim - 2) * math.log(factor) > math.log(largest):
            return [f"--rotary-scaling ntk with --rotary-scaling-factor {factor:g} makes RoPE's base "
                    f"--rotary-base {self.rotary_base:g} * F^(d_h/(d_h-2)) (d_h = {self.head_dim}) larger "
                    f"than float32's largest number ({largest:.3g}), in which the angles are computed: they "
                    "overflow; use F near the evaluation length over the training length (e.g. 4)"]
        if scaling == "linear" and torch.tensor(1 / factor, dtype=torch.float32).item() == 0:
            return [f"--rotary-scaling linear with --rotary-scaling-factor {factor:g} divides every position "
                    "by F to 0 in float32, in which the angles are computed: all positions would be rotated "
                    "alike; use F near the evaluation length over the training length (e.g. 4)"]
        return []

    def _rotary_and_alibi_errors(self):
        errors = []
        if self.rotary_applies:
            if self.head_dim % 2:
                errors.append(f"--rotary {self.rotary} rotates pairs of dimensions: the head "
                              f"dimension must be even, got {self.head_dim}")
            if self.rotary_base <= 1:
                errors.append(f"--rotary-base must be > 1, got {self.rotary_base}")
            elif self.rotary_base > torch.finfo(torch.float32).max:
                errors.append(f"--rotary-base {self.rotary_base:g} is larger than float32's largest number "
                              f"({torch.finfo(torch.float32).max:.3g}), in which RoPE's angles are computed: "
                              "every frequency but the first would be 0; use 10000 (RoFormer's) or another "
                              "base within float32")
            if self.four_term:
                errors.append(
                    f"--rotary {self.rotary} with --untied-pos four-term: BERT-A^d adds positions to the "
                    "query and key that RoPE would rotate again; use --untied-pos tupe (TUPE's untied "
                    "term beside a rotary word term) or none"
                )
            if self.shaw_table is not None:
                errors.append(
                    f"--rotary {self.rotary} with --rel-pos {self.rel_pos}: two query-dependent relative "
                    "encodings; choose one (--rotary may be combined with --rel-pos t5)"
                )
            if self.distance_bias or self.deberta:
                errors.append(f"--rotary {self.rotary} with --rel-pos {self.rel_pos}: two relative "
                              "encodings; choose one")
        if self.distance_bias and self.release:
            errors.append("--cls-reset release reproduces the released TUPE-R's T5 bias; use "
                          f"--cls-reset paper (or none) with --rel-pos {self.rel_pos}")
        return errors


def option(name):
    """The command-line option of the setting ``name``: ``--`` and dashes."""
    return "--" + name.replace("_", "-")
