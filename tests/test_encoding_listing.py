"""tupe-encodings: every registered encoding listed from the registry, docs/encodings.md its output (an
encoding module dropped into the package: tests/test_encoding_drop_in.py)."""

import os

import pytest
from conftest import REPO

from tupe_plugin.encodings import registry
from tupe_plugin.encodings.encoding import Encoding
from tupe_plugin.models import encoding_listing
from tupe_plugin.terms.parts import DenseBias, OffsetRows

pytestmark = pytest.mark.smoke

PAGE = os.path.join(REPO, "docs", "encodings.md")


def listing(capsys, *argv):
    assert encoding_listing.main(list(argv)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("encoding", registry.ENCODINGS, ids=lambda encoding: encoding.name)
def test_every_registered_encoding_is_listed_with_its_flag(encoding, capsys):
    text = listing(capsys)
    assert f"{encoding.label} ({encoding.name})\n  flag:     {encoding.describe_selection()}\n" in text


def test_the_markdown_page_has_a_row_per_registered_encoding(capsys):
    rows = [line for line in listing(capsys, "--markdown").splitlines() if line.startswith("| [")]
    assert [row.split("](")[0] for row in rows] == [f"| [{encoding.label}" for encoding in registry.ENCODINGS]


def test_docs_encodings_md_is_what_the_command_writes_now():
    with open(PAGE, encoding="utf-8") as f:
        committed = f.read()
    assert committed == encoding_listing.markdown(registry.ENCODINGS), (
        "docs/encodings.md is not what tupe-encodings writes now; regenerate it: "
        f"{encoding_listing.REGENERATE} (in a checkout: python scripts/list_encodings.py --markdown > "
        "docs/encodings.md)")


def test_an_encoding_whose_parts_depend_on_its_value_names_each_value():
    toy = Encoding(name="toy", label="a toy bias", kind="bias", family="rel_pos",
                   choices=("toy-rows", "toy-dense"), choices_help="", summary="", citation="",
                   parts=lambda config: (OffsetRows,) if config.rel_pos == "toy-rows" else (DenseBias,))
    assert encoding_listing.facts(toy)["parts"] == "toy-rows: OffsetRows; toy-dense: DenseBias"


# A learned bias per head of the clipped distance, as a new encoding's module would declare it

