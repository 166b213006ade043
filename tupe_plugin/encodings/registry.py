"""The registry of the position encodings: :data:`ENCODINGS`, the :class:`~.encoding.Encoding` of every module
``encodings/*_position.py`` (one each), and the facts other code reads of them (which encoding owns an
option, the choices of a family flag, the options an evaluation may change, the values of options older
checkpoints were trained with, the export names, the descriptions and citations). Adding an encoding is
adding its module: nothing here names one.
"""

import importlib
import pkgutil

from .encoding import KINDS, Encoding, flag_name

MODULE_SUFFIX = "_position"


def _discovered():
    """The encodings of this package's ``*_position`` modules, in the order their terms are added to the
    per-forward term (by :data:`~.encoding.KINDS`: absolute, untied, biases, rotation, relative vectors;
    their modules are registered in the model in that order, which an optimizer's saved state follows)."""
    found, package = [], importlib.import_module(__package__)
    for module in pkgutil.iter_modules(package.__path__):
        if module.name.endswith(MODULE_SUFFIX):
            loaded = importlib.import_module(f"{__package__}.{module.name}")
            found += [value for value in vars(loaded).values() if isinstance(value, Encoding)]
    return tuple(sorted(found, key=lambda encoding: (KINDS.index(encoding.kind), encoding.name)))


ENCODINGS = _discovered()

# The flags that select an encoding of their family (one at most each), with the help text before the
# choices: x-transformers' one flag per family.
FAMILIES = dict(
    abs_pos="absolute position embedding added to the word embedding at the input",
    rel_pos="relative position term",
    untied_pos="position-to-position term computed in attention",
    rotary="rotary position embedding: q and k of every layer rotated by position",
)


def of_family(family):
    """The encodings the flag ``family`` selects among."""
    return tuple(encoding for encoding in ENCODINGS if encoding.family == family)


def family_choices(family):
    """The values of the flag ``family``: ``none`` and every registered encoding's."""
    return ("none", *(choice for encoding in of_family(family) for choice in encoding.choices))


def family_help(family):
    """The help of the flag ``family``: what it adds, then each encoding's choices."""
    return FAMILIES[family] + ": " + "; ".join(encoding.choices_help for encoding in of_family(family))


def option_fields():
    """(encoding, field) of every registered option."""
    return [(encoding, flag) for encoding in ENCODINGS for flag in encoding.option_fields()]


def owner(name):
    """The encoding that declares the option ``name``, or None."""
    return next((encoding for encoding, flag in option_fields() if flag.name == name), None)


def _with_metadata(key):
    return {flag.name: flag.metadata[key] for _, flag in option_fields() if flag.metadata[key]}


def options_before_released_forms():
    """{option: the value of the checkpoints saved before it existed}: the options whose default changed to
    follow the encoding's released code."""
    return {name: before for name, before in _with_metadata("before").items() if before is not None}


def value_as_trained(name, saved):
    """The value of the option ``name`` (one of :func:`options_before_released_forms`) for a checkpoint whose
    settings ``saved`` ({name: value}) record none: see :meth:`~.encoding.Encoding.value_as_trained`."""
    return owner(name).value_as_trained(name, saved)


def evaluation_options():
    """The options an evaluation or a fine-tuning may change (the weights keep their meaning)."""
    return tuple(_with_metadata("at_evaluation"))


def starting_values():
    """{option: (the suffix of the tensor key it starts, why)} of the options that only give a stored tensor
    its starting value."""
    return _with_metadata("stored_as")


def export_names(prefix, hf_prefix):
    """(checkpoint key prefix, transformers prefix) of every encoding's tensors in the shared term
    (``prefix`` its checkpoint prefix, ``hf_prefix`` the export's)."""
    return tuple((f"{prefix}{encoding.slot}.{key}", f"{hf_prefix}{name}")
                 for encoding in ENCODINGS if encoding.slot for key, name in encoding.export_names)


def used(config):
    """The encodings a :class:`~.position_config.PositionConfig` uses, in registry order."""
    return [encoding for encoding in ENCODINGS if encoding.selected_by(getattr(config, encoding.family))]


def option_errors(config):
    """The errors of options given to an encoding the config does not use, and of the used encodings' own
    checks."""
    in_use, errors = used(config), []
    for encoding in ENCODINGS:
        if encoding not in in_use and encoding.unused_errors is not None:
            errors += encoding.unused_errors(config)
    for encoding, flag in option_fields():
        refused = flag.metadata["refused_unused"] or flag.metadata["before"] is not None
        if encoding not in in_use and encoding.unused_errors is None and refused \
                and getattr(config, flag.name) != flag.default:
            errors.append(f"{flag_name(flag.name)} is an option of {encoding.label}; add "
                          f"{encoding.describe_selection()} (got {flag_name(encoding.family)} "
                          f"{getattr(config, encoding.family)})")
    for encoding in in_use:
        errors += encoding.check(config)
    return errors
