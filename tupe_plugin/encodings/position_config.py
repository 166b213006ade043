"""A model's position-encoding choices, declared, parsed and checked once: :class:`PositionConfig`.

The composition of the registered encodings (:mod:`.registry`): one flag per family selects at most one
encoding of it (``--abs-pos``, ``--rel-pos``, ``--untied-pos``, ``--rotary``, their choices those of the
registered encodings), every encoding's own options are its module's (their help, defaults, choices and
checks), and this module holds what is truly between encodings: ``--cls-reset``, the [CLS] reset of
whichever content-free term carries it (TUPE §3.3, Eq. 9-11; Ke, He, Liu, "Rethinking Positional Encoding in
Language Pre-training", arXiv 2006.15595), the exclusivity of encodings that model the same thing twice, the
attention scale from the terms the logits sum, and the facts derived from the families chosen. Code
elsewhere asks the config (``config.t5_bias``, ``config.offset_bias``, ...) and never compares flag
strings.
"""

import math
from dataclasses import dataclass, field, fields
from functools import cached_property

from fairseq.utils import safe_getattr

from ..user_input.cli_types import finite_float
from ..user_input.memory_limits import ForwardShape, beyond_memory, forward_shape
from ..user_input.user_errors import UserError
from ..terms.parts import LayerTerm, OffsetRows
from . import registry
from .encoding import flag_name, option

ABS_POS_CHOICES = registry.family_choices("abs_pos")
REL_POS_CHOICES = registry.family_choices("rel_pos")
UNTIED_CHOICES = registry.family_choices("untied_pos")
ROTARY_CHOICES = registry.family_choices("rotary")
CLS_RESET_CHOICES = ("none", "paper", "release")

# What a preset leaves unset: TUPE-R (the base architecture of the model), the encodings' options at their
# defaults.
DEFAULTS = dict(abs_pos="none", rel_pos="t5", untied_pos="tupe", cls_reset="paper", rotary="none",
                **{flag.name: flag.default for _, flag in registry.option_fields()})

# The options whose default changed to follow the encoding's released code: {option: its value in the
# checkpoints saved before it existed}; such a checkpoint records none and is rebuilt as it was trained.
BEFORE_RELEASED_FORMS = registry.options_before_released_forms()


class PositionFlagError(UserError, ValueError):
    """A model flag (or combination of flags) that cannot be built."""


def set_defaults(args, saved=False):
    """Fill every position flag the command line and the preset left unset; ``saved``: ``args`` are a
    checkpoint's, whose unrecorded options take the value they had when it was trained
    (:func:`~.registry.value_as_trained`)."""
    for flag, value in DEFAULTS.items():
        if safe_getattr(args, flag, None) is None:
            if saved and flag in BEFORE_RELEASED_FORMS:
                value = registry.value_as_trained(flag, lambda name: safe_getattr(args, name, None))
            setattr(args, flag, value)


def _family(name):
    return option("none", choices=registry.family_choices(name), help=registry.family_help(name))


@dataclass(frozen=True, kw_only=True)
class PositionChoices:
    """The model's shape, the family flags and ``--cls-reset``; the rules between encodings and the facts
    derived from the families chosen."""

    embed_dim: int = field(metadata={})
    num_heads: int = field(metadata={})
    max_positions: int = field(metadata={})
    abs_pos: str = _family("abs_pos")
    rel_pos: str = _family("rel_pos")
    rotary: str = _family("rotary")
    untied_pos: str = _family("untied_pos")
    cls_reset: str = option(
        "none", choices=CLS_RESET_CHOICES,
        help="paper = reset the content-free correlations from/to [CLS] to learned theta_1/theta_2 "
        "(TUPE Eq. 9-11): built with U^Q/U^K under --untied-pos tupe, two scalars per head reset in the "
        "--rel-pos bias otherwise; release = as the authors' released code: theta_1/theta_2 from the "
        "untied table's rows 0 and 1 (the table gets max_positions + 1 rows), the T5 bias reset on its "
        "own to two extra buckets",
    )

    @classmethod
    def add_args(cls, group):
        """Declare every position flag on ``group`` (argparse), without defaults: the preset and
        :func:`set_defaults` fill what the command line leaves unset; a float flag refuses nan and inf. The
        family flags and --cls-reset come first, then each encoding's options in the registry's order."""
        for flag in [*fields(PositionChoices), *(flag for _, flag in registry.option_fields())]:
            if "help" not in flag.metadata:
                continue
            declared = {key: flag.metadata[key] for key in ("help", "choices", "metavar")
                        if flag.metadata[key] is not None}
            if flag.type is bool:
                group.add_argument(flag_name(flag.name), action="store_true", help=flag.metadata["help"])
            else:
                flag_type = finite_float if flag.type is float else flag.type
                group.add_argument(flag_name(flag.name), type=flag_type, **declared)

    @classmethod
    def from_args(cls, args):
        """The config of fairseq model ``args`` (argparse or DictConfig); raises
        :class:`PositionFlagError` listing every flag that cannot be built, or whose tensors and work in one
        forward of the configured batch (:func:`~tupe_plugin.user_input.memory_limits.forward_shape`) exceed
        the machine's memory."""
        config = cls(embed_dim=args.encoder_embed_dim, num_heads=args.encoder_attention_heads,
                     max_positions=args.max_positions, **{flag: getattr(args, flag) for flag in DEFAULTS})
        config.check(forward_shape(args))
        return config

    # -- the encodings used, and the facts derived from them (read these, never the flag strings) ----

    @cached_property
    def _used(self):
        return tuple(registry.used(self))

    def encodings(self):
        """The registered encodings this model uses (:class:`~.encoding.Encoding`), in registry order."""
        return self._used

    def uses(self, name):
        """Whether the model uses the encoding registered as ``name``."""
        return any(encoding.name == name for encoding in self.encodings())

    def _uses_kind(self, kind):
        return any(encoding.kind == kind for encoding in self.encodings())

    @property
    def head_dim(self):
        return self.embed_dim // max(self.num_heads, 1)

    @property
    def absolute(self):
        """The absolute PE added at the input (learned / sinusoidal / learnable-sinusoidal), or None."""
        return None if self.abs_pos == "none" else self.abs_pos

    learned_absolute_table = property(lambda self: self.abs_pos == "learned")
    learnable_absolute_frequencies = property(lambda self: self.abs_pos == "learnable-sinusoidal")
    untied = property(lambda self: self.untied_pos == "tupe",
                      doc="TUPE's untied (pU^Q)(pU^K)^T term (Eq. 7), factored into widened heads.")
    four_term = property(lambda self: self.untied_pos == "four-term",
                         doc="The BERT-A^d ablation: positions shift the word query and key (TUPE §4.3).")
    untied_table = property(lambda self: self.untied_pos != "none",
                            doc="An untied table with U^Q/U^K (TUPE or BERT-A^d).")
    t5_bias = property(lambda self: self.uses("t5"))
    alibi = property(lambda self: self.uses("alibi"))
    kerple = property(lambda self: self.uses("kerple"))
    sandwich = property(lambda self: self.uses("sandwich"))
    fire = property(lambda self: self.uses("fire"))
    deberta = property(lambda self: self.uses("deberta"))
    rotary_applies = property(lambda self: self.rotary != "none", doc="RoPE: q, k rotated by position.")
    distance_bias = property(lambda self: self._uses_kind("distance_bias"),
                             doc="A bias of the distance, made for length extrapolation (ALiBi, KERPLE, "
                             "Sandwich, FIRE).")
    relative_vectors = property(lambda self: self._uses_kind("relative_vectors"),
                                doc="Relative vectors that depend on the query (Shaw, DeBERTa).")
    cls_reset_applies = property(lambda self: self.cls_reset != "none")
    release = property(lambda self: self.cls_reset == "release",
                       doc="The authors' released [CLS] semantics (extra table row, per-term T5 reset).")
    zero_cls_bias = property(lambda self: self.cls_reset == "paper",
                             doc="Eq. 11: the paper's reset replaces row/column 0 of the whole content-free "
                             "term.")

    def part_types(self):
        """The types of the parts the encodings used add to the per-forward term
        (:mod:`tupe_plugin.terms.parts`), in the order they add them."""
        return tuple(dict.fromkeys(part for encoding in self.encodings()
                                   for part in encoding.part_types(self)))

    @property
    def layer_terms(self):
        """The labels of the encodings whose term each layer computes from its own logits (a
        :class:`~tupe_plugin.terms.parts.LayerTerm`: CoPE, DAPE), joined for messages, or "" (none)."""
        return ", ".join(encoding.label for encoding in self.encodings()
                         if LayerTerm in encoding.part_types(self))

    @property
    def offset_bias(self):
        """A content-free bias of the offset j - i (T5, ALiBi, KERPLE, Sandwich, FIRE): an encoding adds
        :class:`~tupe_plugin.terms.parts.OffsetRows`."""
        return OffsetRows in self.part_types()

    @property
    def own_cls_thetas(self):
        """The paper's [CLS] reset without TUPE's untied term: theta_1/theta_2 are learned per head and
        reset the --rel-pos bias."""
        return self.zero_cls_bias and not self.untied

    @property
    def learned_tables(self):
        """A learned table fixes the longest input (the Enhanced Mask Decoder's: of the masked-LM output)."""
        return (self.learned_absolute_table or self.untied_table
                or self.deberta and self.enhanced_mask_decoder_passes is not None)

    @property
    def learned_dense_bias(self):
        """A learned (H, T, T) bias: on CPU it needs BiasedFlashAttention."""
        return self.own_cls_thetas or any(encoding.kind in ("bias", "distance_bias", "relative_vectors")
                                          and encoding.is_learned(self) for encoding in self.encodings())

    @property
    def scale(self):
        """1/sqrt(terms d_h), for the dot products the logits sum: 1 but for TUPE's untied term (2), BERT-A^d
        (4) and DeBERTa's three terms (He et al. 2021 Eq. 4)."""
        terms = max([encoding.terms(self) for encoding in self.encodings()], default=1)
        return 1.0 / math.sqrt(terms * max(self.head_dim, 1))

    def describe(self):
        """The position flags as they would be passed on the command line."""
        return (f"--abs-pos {self.abs_pos}, --untied-pos {self.untied_pos}, "
                f"--rel-pos {self.rel_pos}, --rotary {self.rotary}, --cls-reset {self.cls_reset}")

    # -- checks --------------------------------------------------------------------------------

    def check(self, forward=None):
        """Raise :class:`PositionFlagError` listing every flag that cannot be built; ``forward``: the
        :class:`~tupe_plugin.user_input.memory_limits.ForwardShape` the sizes are counted at (by default one
        sequence of ``max_positions`` tokens)."""
        errors = []
        for flag in fields(self):  # what the parser checks, for a config that did not come through it
            value, choices = getattr(self, flag.name), flag.metadata.get("choices")
            if choices and value not in choices:
                errors.append(f"{flag_name(flag.name)} must be one of {', '.join(choices)}, got {value}")
            elif flag.type is float and not math.isfinite(value):
                errors.append(f"{flag_name(flag.name)} must be a finite number, got {value}")
        if errors:
            raise PositionFlagError("invalid model flags:\n  " + "\n  ".join(errors))
        errors = (self._between_encodings_errors() + registry.option_errors(self)
                  + self._sizes_beyond_memory(forward or ForwardShape(1, self.max_positions)))
        if errors:
            raise PositionFlagError("invalid model flags:\n  " + "\n  ".join(errors))

    def _between_encodings_errors(self):
        """Encodings that model the same thing twice, and the [CLS] reset of whichever term carries it."""
        errors = []
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
        if self.distance_bias and self.release:
            errors.append("--cls-reset release reproduces the released TUPE-R's T5 bias; use "
                          f"--cls-reset paper (or none) with --rel-pos {self.rel_pos}")
        if self.deberta and self.untied_table:
            errors.append(f"--rel-pos deberta with --untied-pos {self.untied_pos}: DeBERTa's position terms "
                          "depend on the content and are scaled by 1/sqrt(3 d_h), TUPE's untied term is "
                          "content-free and scaled by 1/sqrt(2 d_h); their sum is defined by neither paper, "
                          "use --untied-pos none")
        if self.rotary_applies:
            errors += self._rotary_errors()
        return errors + self._parts_held_twice()

    def _parts_held_twice(self):
        """Two encodings that each add a part of one type, which the per-forward term holds once (e.g. the
        query shifts of Transformer-XL and BERT-A^d), named by their flags."""
        errors = []
        for part in self.part_types():
            owners = [encoding for encoding in self.encodings() if part in encoding.part_types(self)]
            if len(owners) > 1:
                flags = " and ".join(encoding.selection(self) for encoding in owners)
                errors.append(f"{flags} each add {part.words} to the attention logits, which one model holds "
                              "once; choose one of them")
        return errors

    def _rotary_errors(self):
        errors = []
        if self.four_term:
            errors.append(f"--rotary {self.rotary} with --untied-pos four-term: BERT-A^d adds positions to "
                          "the query and key that RoPE would rotate again; use --untied-pos tupe (TUPE's "
                          "untied term beside a rotary word term) or none")
        if self.relative_vectors and not self.deberta:
            errors.append(f"--rotary {self.rotary} with --rel-pos {self.rel_pos}: two query-dependent "
                          "relative encodings; choose one (--rotary may be combined with --rel-pos t5)")
        elif self.distance_bias or self.deberta:
            errors.append(f"--rotary {self.rotary} with --rel-pos {self.rel_pos}: two relative encodings; "
                          "choose one")
        return errors

    def sized_tensors(self, forward=None):
        """(flag, its value, what it sizes, the float32 bytes it needs, its usual value) of each size flag of
        the encodings used, at the model's shape and the
        :class:`~tupe_plugin.user_input.memory_limits.ForwardShape` ``forward`` (by default one sequence of
        ``max_positions`` tokens): the tensors held in training and the work of one forward."""
        forward = forward or ForwardShape(1, self.max_positions)
        return [size for encoding in self.encodings() for size in encoding.sizes(self, forward)]

    def _sizes_beyond_memory(self, forward):
        """A size flag whose tensors and work alone exceed the machine's memory is a typo, refused before
        anything is allocated (as --max-positions is)."""
        errors = []
        for flag, value, tensor, nbytes, usual in self.sized_tensors(forward):
            if problem := beyond_memory(f"{flag_name(flag)} {value}", tensor, nbytes):
                errors.append(f"{problem} ({usual})")
        return errors


def _composed():
    """:class:`PositionChoices` with every registered encoding's options: their fields (flags) and
    derived facts."""
    options = list(dict.fromkeys(encoding.options for encoding in registry.ENCODINGS))
    composed = type("PositionConfig", (PositionChoices, *options), {
        "__doc__": "The checked position-encoding choices of one model, its encodings' options and the facts "
                   "derived from them.", "__module__": __name__})
    return dataclass(frozen=True, kw_only=True)(composed)


PositionConfig = _composed()
