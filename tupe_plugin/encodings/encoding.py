"""What one position encoding declares about itself: :class:`Encoding`, the entry of the registry
(:mod:`.registry`), and :func:`option`, a field of its options that is also a command-line flag.

An encoding's module holds every fact of it: its options (a small frozen dataclass of :func:`option`
fields: help, default, choices, the value a checkpoint saved before the option existed was trained with,
whether an evaluation may change it, which stored tensor replaces what it computes), the checks of those
options, its parameters (``build``), the part it adds to the per-forward term (the module ``build``
returns), its one-line description and citation, how a flag of its family selects it, and its export
names. The model's config (:mod:`.position_config`) is the composition of the registered encodings' options;
presets, analysis, ``--model-overrides``, fine-tuning and the export read an encoding's facts through the
registry.
"""

from dataclasses import dataclass, field, fields
from typing import Callable, Optional


def option(default, help, choices=None, metavar=None, before=None, at_evaluation=False, stored_as=None,
           refused_unused=False):
    """A field of an encoding's options that is also a command-line flag (``--name-with-dashes``).

    ``before``: the value the checkpoints saved before this option existed were trained with (its default
    changed then to follow the encoding's released code); ``at_evaluation``: an evaluation or a fine-tuning
    may change it (the weights keep their meaning); ``stored_as``: (the suffix of the tensor key that holds
    what it starts, why) for an option that only gives a stored tensor its starting value;
    ``refused_unused``: given another value than its default where its encoding is not used, it is refused
    (as an option with ``before`` is; the others are ignored there, as in the checkpoints saved with them)."""
    return field(default=default, metadata=dict(help=help, choices=choices, metavar=metavar, before=before,
                                                 at_evaluation=at_evaluation, stored_as=stored_as,
                                                 refused_unused=refused_unused))


def flag_name(name):
    """The command-line option of the setting ``name``: ``--`` and dashes."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class NoOptions:
    """The options of an encoding that has none of its own."""


# What an encoding's term is, in the order the terms are added to the per-forward term: a vector added at the
# input; TUPE's untied term (or BERT-A^d's shifts); the T5 bias of the offset; a bias of the distance made for
# length extrapolation; a rotation of q and k; vectors of the offset that depend on the query (Shaw, DeBERTa).
# Then the kinds that change another encoding's input or output: positions sampled per sequence (read by the
# encodings indexed by position), and a term each layer computes from its own logits.
KINDS = ("positions", "absolute", "untied", "bias", "distance_bias", "rotation", "relative_vectors", "layer")


def _no_errors(config):
    return []


def _nothing_sized(config, forward):
    return []


@dataclass(frozen=True)
class Encoding:
    """One position encoding, as the registry lists it.

    ``family`` is the flag that selects it (``abs_pos``, ``rel_pos``, ``untied_pos``, ``rotary``) and
    ``choices`` the values of that flag that do, with ``choices_help`` the text of those choices in the
    flag's help; ``slot`` the attribute of the shared term (or the encoder) that holds its module, whose name
    is the prefix of its checkpoint keys; ``options`` the dataclass of its own flags; ``build(config)`` its
    module or None; ``check(config)`` the errors of its options when it is used; ``sizes(config)`` the
    ``(flag, value, what it sizes, float32 bytes, usual value)`` of each size flag at the
    :class:`~tupe_plugin.user_input.memory_limits.ForwardShape` ``forward``: what the model holds for it in
    training (its tensors with their gradients and Adam's moments) and what one forward of that batch
    computes for it; ``kind`` what its
    term is, for the rules between encodings (:data:`KINDS`); ``learned`` (or ``learned(config)``) whether
    that term has parameters; ``logit_terms`` (or ``logit_terms(config)``) the number of dot products its
    attention logits sum (the scale is 1/sqrt(terms d_h)); ``export_names`` the
    (checkpoint key prefix under the shared term's slot, transformers name) of its tensors;
    ``trained_value(name, before, default, saved)`` refines :meth:`value_as_trained`;
    ``unused_errors(config)`` the errors of its options where it is not used (by default each option
    declared ``refused_unused`` or with a ``before`` value, given another value than its default, is named
    as this encoding's); ``exported``: the transformers code of ``tupe-export-hf`` computes it (else the
    export refuses a model that uses it, naming it); ``hf_native(config)``: (the ``model_type`` of
    transformers' own class that computes it with these options, or a tuple of those that do, the first
    the one it is exported as alone, None) or (None, why not): ``tupe-export-hf`` writes such a model as the
    class every encoding of it names, without remote code (None: transformers has no class computing
    it).

    ``parts`` (or ``parts(config)``): the types of the parts (:mod:`tupe_plugin.terms.parts`) its module adds
    to the per-forward term, which decide the attention paths that can run it; ``layer_module(config)``: the
    module each layer holds for its :class:`~tupe_plugin.terms.parts.LayerTerm` (a fresh one a layer), or
    None; ``positions(config, forward)``: the (B, T) positions of each sequence it samples in training (for
    the :class:`~tupe_plugin.terms.forward.Forward` of positions 0..T-1), or None; ``reads_positions``: its
    term is built from the forward's positions, per sequence where they are sampled; ``selects(value)``:
    whether the value of its flag ``family`` selects it, for an encoding whose flag is one of its own options
    (a switch on top of the others, ``--dape``), by default the value is one of ``choices``."""

    name: str
    label: str
    kind: str
    family: str
    choices: tuple
    choices_help: str
    summary: str
    citation: str
    slot: Optional[str] = None
    options: type = NoOptions
    build: Optional[Callable] = None
    check: Callable = _no_errors
    sizes: Callable = _nothing_sized
    logit_terms: object = 1
    learned: object = True
    export_names: tuple = ()
    trained_value: Optional[Callable] = None
    unused_errors: Optional[Callable] = None
    exported: bool = False
    hf_native: Optional[Callable] = None
    parts: object = ()
    layer_module: Optional[Callable] = None
    positions: Optional[Callable] = None
    reads_positions: bool = False
    selects: Optional[Callable] = None

    def is_learned(self, config):
        return self.learned(config) if callable(self.learned) else self.learned

    def terms(self, config):
        return self.logit_terms(config) if callable(self.logit_terms) else self.logit_terms

    def native_types(self, config):
        """(the model types of transformers' classes that compute it with ``config``'s options, a tuple, the
        first the one it is exported as alone; why none does, or None): ``hf_native``'s answer as a tuple."""
        if self.hf_native is None:
            return (), None
        types, why = self.hf_native(config)
        return ((types,) if isinstance(types, str) else tuple(types or ())), why

    def part_types(self, config):
        """The types of the parts it adds to the term of a model of ``config``."""
        return tuple(self.parts(config) if callable(self.parts) else self.parts)

    def option_fields(self):
        """The dataclass fields of its options."""
        return fields(self.options)

    def option_names(self):
        return tuple(flag.name for flag in self.option_fields())

    def selected_by(self, value):
        """Whether ``--family value`` selects this encoding."""
        return value in self.choices if self.selects is None else bool(self.selects(value))

    def selection(self, config):
        """How the command line of a model of ``config`` selected it, for messages: ``--rel-pos t5``,
        ``--randomized-positions 4096``, or a switch's flag alone (``--dape``)."""
        value = getattr(config, self.family)
        return flag_name(self.family) + ("" if value is True else f" {value}")

    def describe_selection(self):
        """How a command line selects it, for messages: ``--rel-pos fire``, or the flag of a switch."""
        return f"{flag_name(self.family)} {' or '.join(self.choices)}".rstrip()

    def value_as_trained(self, name, saved):
        """The value of its option ``name`` for a checkpoint whose settings (``saved(setting)``: its value or
        None) record none: the value before the option existed when the checkpoint used this encoding, the
        default otherwise (an encoding may refine when the older value applies: ``trained_value``)."""
        flag = next(flag for flag in self.option_fields() if flag.name == name)
        before = flag.metadata["before"]
        if before is None or not self.selected_by(saved(self.family)):
            return flag.default
        if self.trained_value is not None:
            return self.trained_value(name, before, flag.default, saved)
        return before
