"""An encoding module dropped into the package, with no other file changed: tupe-encodings lists it, it trains
and validates through fairseq's commands, and tupe-analyze analyses it. The module is dropped into a copy of
the package, so that no other test or process sees it."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from cli import run_fairseq_steps, train_args, validate_args
from conftest import REPO
from fairseq import checkpoint_utils

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


@pytest.fixture(scope="module")
def package_with_probe(tmp_path_factory):
    """A folder holding a copy of tupe_plugin with the probe's module dropped into its encodings/."""
    root = tmp_path_factory.mktemp("drop_in")
    shutil.copytree(os.path.join(REPO, "tupe_plugin"), root / "tupe_plugin",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tupe_plugin" / "encodings" / "probe_position.py").write_text(textwrap.dedent(PROBE_MODULE))
    return root


def run_python(root, *argv):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(root))
    return subprocess.run([sys.executable, *map(str, argv)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)


def test_a_dropped_in_encoding_is_listed_with_its_flag_parts_paths_export_and_options(package_with_probe):
    proc = run_python(package_with_probe, os.path.join(REPO, "scripts", "list_encodings.py"))
    assert proc.returncode == 0, proc.stderr
    assert ("the probe distance bias (probe)\n  flag:     --rel-pos probe-distance\n"
            "  summary:  a learned bias per head of the clipped distance |j - i|\n") in proc.stdout
    assert "  parts:    OffsetRows\n  paths:    every path\n  export:   not exported\n" in proc.stdout
    assert "    --probe-max-distance (default 16): distances beyond K share the bias of K\n" in proc.stdout


@pytest.fixture(scope="module")
def probe_checkpoint(package_with_probe, wikitext_bin):
    """fairseq-train (1 update) then fairseq-validate of bert_nope_tiny with --rel-pos probe-distance, the
    plugin read from the copy: (train output, validate output, the checkpoint)."""
    save_dir = package_with_probe / "checkpoints"
    checkpoint = save_dir / "checkpoint_last.pt"
    train, validate = run_fairseq_steps(
        ("train", train_args(wikitext_bin, save_dir, "bert_nope_tiny", 1, "--rel-pos", "probe-distance",
                             "--probe-max-distance", 4)),
        ("validate", validate_args(wikitext_bin, checkpoint)),
        cwd=package_with_probe)
    return train, validate, checkpoint


def test_a_dropped_in_encoding_trains_and_validates_through_fairseqs_commands(probe_checkpoint):
    train, validate, checkpoint = probe_checkpoint
    assert "done training" in train and "| valid |" in validate
    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    bias = state["model"]["encoder.sentence_encoder.positional_term.relative_bias.weight"]
    assert bias.shape == (4, 5)  # the probe's bias: 4 heads, distances 0..--probe-max-distance 4
    assert bias.abs().sum() > 0  # trained: it starts at 0


def test_a_dropped_in_encoding_is_analysed_by_its_kind(package_with_probe, probe_checkpoint, wikitext_bin):
    out = package_with_probe / "analysis"
    proc = run_python(package_with_probe, "-m", "tupe_plugin.analysis.cli", "--path", probe_checkpoint[2],
                      "--data", wikitext_bin, "--out", out, "--max-positions", 24, "--probe-samples", 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sections = json.loads((out / "positions.json").read_text())["sections"]
    assert sections["distance_bias"]["applies"]
    assert sections["distance_bias"]["title"].startswith("the probe distance bias bias per head")
    assert sections["content_free_term"]["applies"]
