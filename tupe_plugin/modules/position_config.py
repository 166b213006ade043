"""Every position-encoding choice of the model, parsed and checked once: :class:`PositionConfig`.

The flags name one family each (``--abs-pos``, ``--rel-pos``, ``--untied-pos``, ``--cls-reset``
and their options); this module owns their choices, their defaults, the rules that combine them and
the facts derived from them (the attention scale, which tables are learned, the released [CLS]
semantics). Code elsewhere asks the config (``config.t5_bias``, ``config.shaw_table``, ...) and
never compares flag strings. The RoBERTa flags the encoder does not implement are refused here too,
by name, instead of being accepted and ignored.
"""

import math
import os
from dataclasses import dataclass
from fairseq.utils import safe_getattr
from ..user_errors import UserError

ABS_POS_CHOICES = ("none", "learned", "sinusoidal", "learnable-sinusoidal")
SHAW_TABLES = ("learned", "sinusoidal", "learnable-sinusoidal")
SHAW_PREFIX = "shaw-"
REL_POS_CHOICES = ("none", "t5", "alibi") + tuple(SHAW_PREFIX + table for table in SHAW_TABLES)
UNTIED_CHOICES = ("none", "tupe", "four-term")
CLS_RESET_CHOICES = ("none", "paper", "release")
ROTARY_CHOICES = ("none", "fixed", "learnable")

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
)

# RoBERTa flags the plugin's encoder does not implement: (flag, value that means "off", why).
UNSUPPORTED_ROBERTA_FLAGS = (
    ("quant_noise_pq", 0, "quantization noise (Fan et al. 2020) is not implemented by the plugin's layers"),
    ("quant_noise_pq_block_size", 8, "it only matters with --quant-noise-pq, which the plugin refuses"),
    ("quant_noise_scalar", 0, "quantization noise is not implemented by the plugin's layers"),
    ("mha_heads_to_keep", -1, "adaptive head pruning is not implemented by the plugin's attention"),
    ("ffn_blocks_to_remove", -1, "adaptive FFN pruning is not implemented by the plugin's layers"),
    ("mha_reg_scale_factor", 0.0, "adaptive pruning regularisation is not implemented"),
    ("ffn_reg_scale_factor", 0.0, "adaptive pruning regularisation is not implemented"),
    ("min_params_to_wrap", int(1e8), "the plugin's layers are not wrapped for --ddp-backend fully_sharded"),
)


class PositionFlagError(UserError, ValueError):
    """A model flag (or combination of flags) that cannot be built."""


def set_defaults(args):
    """Fill every position flag the command line and the preset left unset."""
    for flag, value in DEFAULTS.items():
        setattr(args, flag, safe_getattr(args, flag, value))
    explicit_layernorm = safe_getattr(args, "layernorm_embedding", None)
    no_layernorm = safe_getattr(args, "no_layernorm_embedding", False)
    if explicit_layernorm and no_layernorm:
        raise PositionFlagError(
            "--layernorm-embedding and --no-layernorm-embedding contradict each other; pass one "
            "(the presets use a LayerNorm on the input embeddings, as BERT does)"
        )
    args.layernorm_embedding = not no_layernorm


@dataclass(frozen=True)
class PositionConfig:
    """The checked position-encoding choices of one model and the facts derived from them."""

    embed_dim: int
    num_heads: int
    max_positions: int
    abs_pos: str = "none"
    rel_pos: str = "none"
    untied_pos: str = "none"
    cls_reset: str = "none"
    rel_pos_buckets: int = 32
    rel_pos_max_distance: int = 128
    shaw_max_distance: int = 64
    shaw_keys_only: bool = False
    untied_proj_bias: bool = False
    rotary: str = "none"
    rotary_base: float = 10000.0

    @classmethod
    def from_args(cls, args):
        """The config of fairseq model ``args`` (argparse or DictConfig); raises
        :class:`PositionFlagError` listing every flag that cannot be built."""
        check_model_flags(args)
        config = cls(
            embed_dim=args.encoder_embed_dim,
            num_heads=args.encoder_attention_heads,
            max_positions=args.max_positions,
            **{flag: getattr(args, flag) for flag in DEFAULTS},
        )
        config.check()
        return config

    # -- derived facts (read these, never the flag strings) -------------------------------------

    def __post_init__(self):
        shaw = self.rel_pos[len(SHAW_PREFIX):] if self.rel_pos.startswith(SHAW_PREFIX) else None
        terms = {"none": 1, "tupe": 2, "four-term": 4}.get(self.untied_pos, 1)
        facts = dict(
            head_dim=self.embed_dim // max(self.num_heads, 1),
            # the absolute PE added at the input (learned / sinusoidal / learnable-sinusoidal) or None
            absolute=None if self.abs_pos == "none" else self.abs_pos,
            learned_absolute_table=self.abs_pos == "learned",
            learnable_absolute_frequencies=self.abs_pos == "learnable-sinusoidal",
            # TUPE's untied (pU^Q)(pU^K)^T term (Eq. 7), factored into widened heads
            untied=self.untied_pos == "tupe",
            # the BERT-A^d ablation: positions shift the word query and key (TUPE §4.3)
            four_term=self.untied_pos == "four-term",
            # an untied table with U^Q/U^K (TUPE or BERT-A^d)
            untied_table=self.untied_pos != "none",
            t5_bias=self.rel_pos == "t5",
            # ALiBi (Press et al. 2022): the fixed -m_h |j - i| bias, no parameters
            alibi=self.rel_pos == "alibi",
            # RoPE (Su et al. 2021): q, k rotated by position; learnable = the frequencies are parameters
            rotary_applies=self.rotary != "none",
            learnable_rotary_frequencies=self.rotary == "learnable",
            # the Shaw table kind, or None; with values the probabilities are needed
            shaw_table=shaw,
            shaw_learned=shaw == "learned",
            shaw_learnable_frequencies=shaw == "learnable-sinusoidal",
            shaw_values=shaw is not None and not self.shaw_keys_only,
            cls_reset_applies=self.cls_reset != "none",
            # the authors' released [CLS] semantics (extra table row, per-term T5 reset)
            release=self.cls_reset == "release",
            # Eq. 11: the paper's reset replaces row/column 0 of the whole content-free term
            zero_cls_bias=self.cls_reset == "paper",
        )
        # a learned table fixes the longest input; a learned dense bias needs BiasedFlashAttention
        facts.update(
            learned_tables=facts["learned_absolute_table"] or facts["untied_table"],
            learned_dense_bias=facts["t5_bias"] or shaw is not None,
            # 1/sqrt(d_h); 1/sqrt(2 d_h) with TUPE's untied term; 1/sqrt(4 d_h) for BERT-A^d
            scale=1.0 / math.sqrt(terms * max(facts["head_dim"], 1)),
        )
        for name, value in facts.items():
            object.__setattr__(self, name, value)

    def describe(self):
        """The position flags as they would be passed on the command line."""
        return (f"--abs-pos {self.abs_pos}, --untied-pos {self.untied_pos}, "
                f"--rel-pos {self.rel_pos}, --rotary {self.rotary}, --cls-reset {self.cls_reset}")

    # -- checks --------------------------------------------------------------------------------

    def check(self):
        errors = []
        for flag, choices in (("abs_pos", ABS_POS_CHOICES), ("rel_pos", REL_POS_CHOICES),
                              ("untied_pos", UNTIED_CHOICES), ("cls_reset", CLS_RESET_CHOICES),
                              ("rotary", ROTARY_CHOICES)):
            if getattr(self, flag) not in choices:
                errors.append(f"{_flag(flag)} must be one of {', '.join(choices)}, got {getattr(self, flag)}")
        if errors:
            raise PositionFlagError("invalid model flags:\n  " + "\n  ".join(errors))
        if self.absolute is not None and self.untied_table:
            errors.append(
                f"--abs-pos {self.abs_pos} adds positions to the input while --untied-pos "
                f"{self.untied_pos} models them in attention; choose one absolute encoding "
                "(TUPE: --abs-pos none --untied-pos tupe; BERT-A: --abs-pos learned --untied-pos none)"
            )
        if self.cls_reset_applies and not self.untied:
            errors.append(
                f"--cls-reset {self.cls_reset} needs --untied-pos tupe: theta_1/theta_2 are built "
                "with TUPE's U^Q/U^K (TUPE §3.3)"
            )
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
        errors += self._rotary_and_alibi_errors()
        if self.absolute is not None and not self.learned_absolute_table and self.embed_dim % 2:
            errors.append(f"--abs-pos {self.abs_pos} needs an even --encoder-embed-dim, got {self.embed_dim}")
        if errors:
            raise PositionFlagError("invalid model flags:\n  " + "\n  ".join(errors))

    def _rotary_and_alibi_errors(self):
        errors = []
        if self.rotary_applies:
            if self.head_dim % 2:
                errors.append(f"--rotary {self.rotary} rotates pairs of dimensions: the head "
                              f"dimension must be even, got {self.head_dim}")
            if self.rotary_base <= 1:
                errors.append(f"--rotary-base must be > 1, got {self.rotary_base}")
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
            if self.alibi:
                errors.append(f"--rotary {self.rotary} with --rel-pos alibi: two relative encodings; "
                              "choose one")
        if self.alibi and self.release:
            errors.append("--cls-reset release reproduces the released TUPE-R's T5 bias; use "
                          "--cls-reset paper (or none) with --rel-pos alibi")
        return errors


def check_model_flags(args):
    """The sizes, probabilities and RoBERTa flags of ``args`` that no position config could fix."""
    errors = []
    embed_dim, heads = args.encoder_embed_dim, args.encoder_attention_heads
    if heads < 1 or embed_dim < 1 or embed_dim % heads:
        errors.append(
            f"--encoder-embed-dim {embed_dim} must be a positive multiple of "
            f"--encoder-attention-heads {heads}"
        )
    for flag in ("max_positions", "encoder_layers", "encoder_ffn_embed_dim"):
        if getattr(args, flag) < 1:
            errors.append(f"{_flag(flag)} must be positive, got {getattr(args, flag)}")
    tokens_per_sample = safe_getattr(args, "tokens_per_sample", None)
    if tokens_per_sample is not None and 0 < args.max_positions < tokens_per_sample:
        errors.append(
            f"--max-positions {args.max_positions} is below --tokens-per-sample {tokens_per_sample}: "
            "fairseq would silently drop every longer training block; raise --max-positions or lower "
            "--tokens-per-sample"
        )
    for flag in ("dropout", "attention_dropout", "activation_dropout", "encoder_layerdrop"):
        if not 0 <= safe_getattr(args, flag, 0.0) < 1:
            errors.append(f"{_flag(flag)} is a probability in [0, 1), got {getattr(args, flag)}")
    for flag, off, why in UNSUPPORTED_ROBERTA_FLAGS:
        value = safe_getattr(args, flag, off)
        if value is not None and value != off:
            errors.append(f"{_flag(flag)} {value} is not supported: {why}; drop the flag")
    errors += _position_table_memory(args)
    if errors:
        raise PositionFlagError("invalid model flags:\n  " + "\n  ".join(errors))


def _position_table_memory(args):
    """A --max-positions whose position table alone exceeds the machine's memory (a typo) is refused."""
    table = args.max_positions * max(args.encoder_embed_dim, 1) * 4
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return []
    if table <= memory:
        return []
    return [f"--max-positions {args.max_positions} would need a {table / 2**30:,.1f} GiB position table, more "
            f"than the {memory / 2**30:,.1f} GiB of memory of this machine: a typo? (512 is BERT's)"]


def _flag(name):
    return "--" + name.replace("_", "-")
