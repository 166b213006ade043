"""tupe-encodings: every registered position encoding, its flag, parts, attention paths, export and presets.

    tupe-encodings                                  # a text listing
    tupe-encodings --markdown > docs/encodings.md   # the documentation page

For each encoding (:data:`~tupe_plugin.encodings.registry.ENCODINGS`): the flag and the values that select
it, its label, summary and citation, the types of the parts it adds to the per-forward term
(:mod:`tupe_plugin.terms.parts`), the attention paths that read them all as the attention plan hands them
over (:data:`~tupe_plugin.attention.paths.PATH_READS`), its own options with their defaults, its export form
(the ``model_type`` of transformers' own class where its default options give one, else the export's remote
code, else not exported) and the presets whose flags select it
(:data:`~tupe_plugin.models.architectures.POSITION_PRESETS`). Everything is read from the registry: a new
``encodings/*_position.py`` module is listed as it is. The parts, paths and export form are those of each
value of the flag at the encoding's default options, named by value where the values differ. A listing:
nothing is trained, no data is read.
"""

import argparse
import functools
import re
import sys

import torch

from ..attention.paths import PATH_READS, AttentionPath, fold_untied_term, offset_bias_as_rows
from ..encodings import registry
from ..encodings.encoding import flag_name
from ..encodings.position_config import PositionConfig
from ..encodings.positional_term import SharedPositionalTerm
from ..terms.parts import PART_TYPES
from .architectures import POSITION_PRESETS, SIZES

REGENERATE = "tupe-encodings --markdown > docs/encodings.md"
# The shape the encodings are built at to read their parts and export form: the _base presets'
_, EMBED_DIM, HEADS, _ = SIZES["base"]
MAX_POSITIONS = 512
# The length of the forward whose term is built to read its parts
PROBE_LENGTH = 8


def shaped(**flags):
    """The :class:`~tupe_plugin.encodings.position_config.PositionConfig` of ``flags`` (the others at their
    defaults: no encoding) at the _base shape."""
    return PositionConfig(embed_dim=EMBED_DIM, num_heads=HEADS, max_positions=MAX_POSITIONS, **flags)


def selecting_values(encoding):
    """The values of the encoding's flag that select it: its choices, or ``True`` for a switch (a flag of its
    own with no choices)."""
    return encoding.choices or (True,)


def config_of(encoding, value):
    return shaped(**{encoding.family: value})


@functools.lru_cache(maxsize=None)
def shared_term(config):
    """The model's :class:`~tupe_plugin.encodings.positional_term.SharedPositionalTerm` at ``config``, built
    once."""
    return SharedPositionalTerm(config).eval()


def term_of(config, path=None):
    """The per-forward term of a model of ``config`` for one short sequence: as its encodings add it, or as
    the attention plan hands it to ``path``: a bias of the offset as its rows or expanded into the dense bias,
    TUPE's untied factors as they are or multiplied out into it
    (:func:`~tupe_plugin.attention.paths.offset_bias_as_rows`,
    :func:`~tupe_plugin.attention.paths.fold_untied_term`)."""
    module = shared_term(config)
    forward = module.forward_of(1, PROBE_LENGTH)
    with torch.no_grad():
        if path is None:
            return module.content_free(forward)
        return module.build(forward, fold_untied=fold_untied_term(path, config),
                            offset_bias_as_rows=offset_bias_as_rows(path, PROBE_LENGTH, config))


def part_types(encoding, config):
    """The types of the parts the encoding adds to the per-forward term: those its module adds and those it
    declares (a layer's own term), in the order of :data:`~tupe_plugin.terms.parts.PART_TYPES`."""
    added = {type(part) for part in term_of(config).parts()}
    return [kind for kind in PART_TYPES if kind in added or kind in encoding.part_types(config)]


def part_names(encoding, config):
    return ", ".join(kind.kind for kind in part_types(encoding, config)) or "none"


def reads_all(path, encoding, config):
    """Whether ``path`` reads every part of the encoding's term as the attention plan hands it over, and the
    declared parts its module does not add (:data:`~tupe_plugin.attention.paths.PATH_READS`)."""
    added = {type(part) for part in term_of(config).parts()}
    kinds = {kind.kind for kind in encoding.part_types(config) if kind not in added}
    kinds.update(kind for part in term_of(config, path).parts() for kind in part.reads())
    return PATH_READS[path].issuperset(kinds)


def path_names(encoding, config):
    """The attention paths that run the encoding (:func:`reads_all`), or "every path"."""
    paths = [path for path in AttentionPath if reads_all(path, encoding, config)]
    if len(paths) == len(AttentionPath):
        return "every path"
    return ", ".join(path.value for path in paths) or "none"


def export_form(encoding, config):
    """transformers' ``model_type`` that computes the encoding with these options, else "remote code" where
    the export's code computes it, else "not exported"."""
    types, _ = encoding.native_types(config)
    if types:
        return types[0]
    return "remote code" if encoding.exported else "not exported"


def by_value(encoding, describe):
    """``describe(encoding, config)`` for each value of its flag that selects it: one text where they agree,
    else ``value: text`` for each."""
    texts = {value: describe(encoding, config_of(encoding, value)) for value in selecting_values(encoding)}
    if len(set(texts.values())) == 1:
        return next(iter(texts.values()))
    return "; ".join(f"{value}: {text}" for value, text in texts.items())


def presets_using(encoding):
    """The position presets whose flags select the encoding, in their order."""
    return [name for name, flags in POSITION_PRESETS.items() if encoding in registry.used(shaped(**flags))]


def options_of(encoding):
    """(flag, default, help) of each of the encoding's own options; a switch's default is "off"."""
    return [(flag_name(flag.name), "off" if flag.default is False else f"{flag.default}",
             flag.metadata["help"]) for flag in encoding.option_fields()]


def facts(encoding):
    """{what: text} of one encoding, in the listing's order."""
    return {
        "flag": encoding.describe_selection(),
        "summary": encoding.summary,
        "citation": encoding.citation,
        "parts": by_value(encoding, part_names),
        "paths": by_value(encoding, path_names),
        "export": by_value(encoding, export_form),
        "presets": ", ".join(presets_using(encoding)) or "none",
    }


def text_listing(encodings):
    """The listing for a terminal: one block per encoding."""
    blocks = []
    for encoding in encodings:
        lines = [f"{encoding.label} ({encoding.name})"]
        lines += [f"  {what + ':':<10}{text}" for what, text in facts(encoding).items()]
        options = options_of(encoding)
        lines.append(f"  {'options:':<10}none" if not options else "  options:")
        lines += [f"    {flag} (default {default}): {help_text}" for flag, default, help_text in options]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


PAGE_INTRO = (
    f"Generated by `{REGENERATE}` from the registry of encodings; do not edit: a new "
    "`tupe_plugin/encodings/*_position.py` module appears here once the page is regenerated. **parts**: the "
    "types of the parts an encoding adds to the per-forward term (`tupe_plugin/terms/parts.py`); **paths**: "
    "the attention paths that read them all as the attention plan hands them over (`PATH_READS` of "
    "`tupe_plugin/attention/paths.py`); **export**: transformers' own `model_type` that `tupe-export-hf` "
    "writes it as, else its remote code, else not exported; **presets**: the `--arch` presets (`_tiny` to "
    "`_large`) that use it. Where the values of its flag differ, each is named; options at their defaults.")


def slug(heading):
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def sentence(text):
    return text if text.endswith(".") else text + "."


def cell(text):
    return text.replace("|", "\\|")


def markdown(encodings):
    """The page docs/encodings.md: a table of the encodings, then each one's summary, citation and
    options."""
    lines = [f"<!-- generated by `{REGENERATE}`; do not edit -->", "# Position encodings", "", PAGE_INTRO, "",
             "| encoding | flag | parts | paths | export | presets |",
             "|---|---|---|---|---|---|"]
    for encoding in encodings:
        listed = facts(encoding)
        lines.append("| " + " | ".join(cell(text) for text in (
            f"[{encoding.label}](#{slug(encoding.label)})", f"`{listed['flag']}`", listed["parts"],
            listed["paths"], listed["export"], listed["presets"])) + " |")
    for encoding in encodings:
        lines += ["", f"## {encoding.label}", "",
                  f"`{encoding.describe_selection()}` — {sentence(encoding.summary)}", "",
                  f"Citation: {sentence(encoding.citation)}", ""]
        options = options_of(encoding)
        lines += [f"- `{flag}` (default {default}): {help_text}" for flag, default, help_text in options]
        if not options:
            lines.append("No options of its own.")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true",
                        help=f"write the markdown page instead of the text listing ({REGENERATE})")
    args = parser.parse_args(argv)
    sys.stdout.write((markdown if args.markdown else text_listing)(registry.ENCODINGS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
