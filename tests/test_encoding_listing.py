"""tupe-encodings: every registered encoding listed from the registry, docs/encodings.md its output, and an
encoding module dropped into the package listed with no other file changed."""

import os
import subprocess
import sys
import textwrap

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
PROBE_MODULE = '''
"""A learned bias per head of the clipped distance |j - i| (a test's encoding, no paper)."""

from dataclasses import dataclass

import torch
from torch import nn

from ..terms.parts import OffsetRows
from .encoding import Encoding, option
from .offset_bias import OffsetBias


@dataclass(frozen=True)
class ProbeOptions:
    probe_max_distance: int = option(16, metavar="K", help="distances beyond K share the bias of K")


class ProbeBias(OffsetBias):
    def __init__(self, num_heads, max_distance, zero_cls=False):
        super().__init__(zero_cls)
        self.max_distance = max_distance
        self.weight = nn.Parameter(torch.zeros(num_heads, max_distance + 1))

    def per_offset(self, seq_len):
        offsets = torch.arange(1 - seq_len, seq_len, device=self.weight.device)
        return offsets, self.weight[:, offsets.abs().clamp(max=self.max_distance)]


PROBE = Encoding(
    name="probe", label="the probe distance bias", kind="distance_bias", family="rel_pos",
    choices=("probe-distance",), choices_help="probe-distance = a learned bias of the clipped distance",
    summary="a learned bias per head of the clipped distance |j - i|", citation="none: a test's encoding",
    slot="relative_bias", options=ProbeOptions, parts=(OffsetRows,),
    build=lambda config: ProbeBias(config.num_heads, config.probe_max_distance, config.zero_cls_bias),
)
'''


def test_an_encoding_module_dropped_into_the_package_is_listed_with_no_other_file_changed():
    path = os.path.join(REPO, "tupe_plugin", "encodings", "listing_probe_position.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join([REPO, *filter(None, [os.environ.get("PYTHONPATH")])]))
    with open(path, "x", encoding="utf-8") as f:
        f.write(textwrap.dedent(PROBE_MODULE))
    try:
        proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "list_encodings.py")], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=300)
    finally:
        os.remove(path)
    assert proc.returncode == 0, proc.stderr
    assert ("the probe distance bias (probe)\n  flag:     --rel-pos probe-distance\n"
            "  summary:  a learned bias per head of the clipped distance |j - i|\n") in proc.stdout
    assert "  parts:    OffsetRows\n  paths:    every path\n  export:   not exported\n" in proc.stdout
    assert "    --probe-max-distance (default 16): distances beyond K share the bias of K\n" in proc.stdout
