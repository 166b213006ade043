"""The position flags belong to the encodings' modules and their composition, PositionConfig: no module
outside tupe_plugin/encodings/ compares their strings."""

import ast
import pathlib
from dataclasses import FrozenInstanceError

import pytest
from conftest import REPO, build_model
from tupe_plugin.encodings.position_config import (
    ABS_POS_CHOICES,
    CLS_RESET_CHOICES,
    DEFAULTS,
    REL_POS_CHOICES,
    UNTIED_CHOICES,
    PositionConfig,
    PositionFlagError,
)

pytestmark = pytest.mark.smoke

OWNERS = pathlib.Path(REPO, "tupe_plugin", "encodings")
SHAW_PREFIX = "shaw-"
FLAG_NAMES = set(DEFAULTS)
# choice strings that mean a position flag wherever they appear ("none", "learned" and "sinusoidal"
# also name other things: module kinds, other flags' values)
FLAG_VALUES = (set(ABS_POS_CHOICES + REL_POS_CHOICES + UNTIED_CHOICES + CLS_RESET_CHOICES)
               - {"none", "learned", "sinusoidal"})


def _names(node):
    return {n.attr if isinstance(n, ast.Attribute) else n.id
            for n in ast.walk(node) if isinstance(n, (ast.Attribute, ast.Name))}


def _strings(node):
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def flag_string_comparisons(path):
    """(line, source) of every comparison of a position flag or of one of its values in ``path``."""
    source = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            strings = set().union(*(_strings(o) for o in operands))
            if (strings and any(_names(o) & FLAG_NAMES for o in operands)) or strings & FLAG_VALUES:
                found.append((node.lineno, ast.get_source_segment(source, node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "endswith") \
                and any(s.startswith(SHAW_PREFIX) or s in FLAG_VALUES for s in _strings(node)):
            found.append((node.lineno, ast.get_source_segment(source, node)))
    return found


# transformers code that tupe-export-hf copies into its folders: it runs without the plugin and reads the
# exported config.json, the plugin's flags written as they are
EXPORTED_CODE = pathlib.Path(REPO, "tupe_plugin", "conversion", "hf_remote")


def test_no_module_outside_the_encodings_compares_position_flag_strings():
    sources = [p for p in pathlib.Path(REPO).glob("tupe_plugin/**/*.py")
               if OWNERS not in p.parents and EXPORTED_CODE not in p.parents]
    sources += list(pathlib.Path(REPO).glob("scripts/*.py"))
    offenders = {str(p.relative_to(REPO)): found for p in sources if (found := flag_string_comparisons(p))}
    assert offenders == {}


def test_the_scan_finds_a_flag_string_comparison(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('def f(args):\n    return args.rel_pos.startswith("shaw-") or args.cls_reset == "x"\n')
    assert [line for line, _ in flag_string_comparisons(planted)] == [2, 2]


def test_config_is_frozen():
    config = PositionConfig(embed_dim=8, num_heads=2, max_positions=8)
    with pytest.raises(FrozenInstanceError):
        config.rel_pos = "t5"


@pytest.mark.parametrize("flags, facts", [
    (dict(untied_pos="tupe", cls_reset="paper", rel_pos="t5"),
     dict(untied=True, t5_bias=True, zero_cls_bias=True, release=False, learned_tables=True)),
    (dict(untied_pos="tupe", cls_reset="release", rel_pos="t5"),
     dict(untied=True, release=True, zero_cls_bias=False, cls_reset_applies=True)),
    (dict(rel_pos="shaw-learnable-sinusoidal", shaw_keys_only=True),
     dict(shaw_table="learnable-sinusoidal", shaw_values=False, shaw_learnable_frequencies=True,
          learned_dense_bias=True, learned_tables=False)),
    (dict(abs_pos="learnable-sinusoidal"),
     dict(absolute="learnable-sinusoidal", learnable_absolute_frequencies=True, learned_tables=False)),
    (dict(untied_pos="four-term"), dict(four_term=True, untied=False, untied_table=True)),
])
def test_derived_facts_follow_the_flags(flags, facts):
    config = PositionConfig(embed_dim=8, num_heads=2, max_positions=8, **flags)
    assert {name: getattr(config, name) for name in facts} == facts


@pytest.mark.parametrize("untied_pos, terms", [("none", 1), ("tupe", 2), ("four-term", 4)])
def test_scale_is_one_over_sqrt_of_the_summed_terms_times_d_h(untied_pos, terms):
    config = PositionConfig(embed_dim=64, num_heads=4, max_positions=8, untied_pos=untied_pos)
    assert config.scale == pytest.approx((terms * 16) ** -0.5)


@pytest.mark.parametrize("flags, message", [
    (dict(rel_pos="fire", fire_threshold=float("nan")), "--fire-threshold must be a finite number, got nan"),
    (dict(rel_pos="sandwich", sandwich_scale=float("inf")),
     "--sandwich-scale must be a finite number, got inf"),
    (dict(rel_pos="deberta", deberta_p2c="printed"),
     "--deberta-p2c must be one of released, paper, got printed"),
])
def test_a_float_setting_that_is_not_finite_is_refused_however_it_came(flags, message):
    """A config that did not come through the parser (--model-overrides, a saved config) is checked as the
    parser checks: finite floats, values among the choices."""
    with pytest.raises(PositionFlagError, match=message):
        PositionConfig(embed_dim=8, num_heads=2, max_positions=8, **flags).check()


def test_two_encodings_that_each_add_a_part_of_one_type_are_refused_naming_both_flags(dictionary):
    with pytest.raises(PositionFlagError, match=r"--untied-pos four-term and --rel-pos xl each add query/key "
                                                r"shifts \(Shift\) to the attention logits"):
        build_model("bert_xl_tiny", dictionary, untied_pos="four-term")
