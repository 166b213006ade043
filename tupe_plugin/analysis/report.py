"""The analysis report: a list of sections run on one model, written as PNGs, one JSON and a table.

A section is a function ``section(context) -> SectionResult``. It draws its figures into
``context.out_dir``, returns its numbers as JSON-ready ``metrics`` and, for the printed table, the
property metrics of its matrices as ``rows``. A section that does not apply to the model returns
``SectionResult.not_applicable(name, title, reason)``. New diagnoses are new section functions
appended to the list handed to :func:`run_sections` (see :mod:`tupe_plugin.analysis.cli`).
"""

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any
from ..user_input.user_errors import UserError


@dataclass
class AnalysisContext:
    """What every section may read: the model and its dictionary, and the report's settings."""

    model: Any
    dictionary: Any
    arch: str
    seq_len: int
    out_dir: str
    window: int = 20
    probe_samples: int = 100
    seed: int = 0

    def figure_path(self, name):
        return os.path.join(self.out_dir, f"{name}.png")


@dataclass
class SectionResult:
    name: str
    title: str
    applies: bool = True
    reason: str = ""
    figures: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    summary: str = ""

    @classmethod
    def not_applicable(cls, name, title, reason):
        return cls(name, title, applies=False, reason=reason)

    def add_row(self, label, properties):
        """One line of the printed table: a label and a :func:`property_metrics` dict."""
        self.rows.append({"label": label, **properties})


class OutputFolderError(UserError, RuntimeError):
    """An output folder holding files the analysis did not write."""


def claim_output_folder(out_dir, report_name, out_flag="--out"):
    """Make ``out_dir`` ready for a new report and remove only what an earlier report wrote there.

    A folder the analysis wrote holds ``report_name``, which lists its figures: those and the report
    are removed (figures of another architecture do not linger beside the new ones), anything else is
    kept. A non-empty folder without that report is not the analysis's: :class:`OutputFolderError`.
    Returns the removed paths.
    """
    if not os.path.exists(out_dir):
        return []
    if not os.path.isdir(out_dir):
        raise OutputFolderError(f"{out_flag} {out_dir} is a file; give a folder")
    report = os.path.join(out_dir, report_name)
    if not os.path.isfile(report):
        if os.listdir(out_dir):
            raise OutputFolderError(
                f"{out_flag} {out_dir} holds files that the analysis did not write (no {report_name}); "
                f"give a new or empty folder"
            )
        return []
    try:
        with open(report, encoding="utf-8") as f:
            sections = json.load(f).get("sections", {})
    except (OSError, ValueError, AttributeError):
        sections = {}
    removed = []
    for section in sections.values() if isinstance(sections, dict) else []:
        for figure in section.get("figures", []) if isinstance(section, dict) else []:
            path = os.path.join(out_dir, os.path.basename(str(figure)))  # never outside the folder
            if os.path.isfile(path):
                os.remove(path)
                removed.append(path)
    os.remove(report)
    return removed + [report]


def run_sections(context, sections):
    """Run every section in order; returns their results."""
    os.makedirs(context.out_dir, exist_ok=True)
    return [section(context) for section in sections]


def write_json(context, results, path, checkpoint=None):
    report = {
        "checkpoint": checkpoint,
        "arch": context.arch,
        "positions": context.seq_len,
        "monotonicity_window": context.window,
        "probe_samples": context.probe_samples,
        "sections": {result.name: _section_json(result) for result in results},
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    return path


def _section_json(result):
    data = asdict(result)
    data.pop("name")
    if not result.applies:
        return {"title": result.title, "applies": False, "reason": result.reason}
    data.pop("reason")
    return data


TABLE_COLUMNS = (
    ("translation_invariance_violation", "TI-viol"),
    ("monotonicity_forward", "mono+"),
    ("monotonicity_backward", "mono-"),
    ("decreasing_window_forward", "W*+"),
    ("decreasing_window_backward", "W*-"),
    ("symmetry_violation", "sym-viol"),
    ("offset_asymmetry", "asym"),
)


def _cell(value):
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    # three decimals, or three significant digits for small non-zero values (never a false 0.000)
    return f"{value:.3f}" if value == 0 or abs(value) >= 0.01 or value != value else f"{value:.2e}"


def format_table(results):
    """The short table printed by the script: one line per matrix, n/a lines with their reason."""
    label_width = max(
        [len(f"{r.name}: {row['label']}") for r in results for row in r.rows] + [24]
    )
    header = f"{'matrix':<{label_width}}  " + "  ".join(f"{title:>8}" for _, title in TABLE_COLUMNS)
    lines = [header, "-" * len(header)]
    for result in results:
        if not result.applies:
            lines.append(f"{result.name + ':':<{label_width}}  n/a - {result.reason}")
            continue
        if not result.rows:
            summary = result.summary or "(figures only, see JSON)"
            lines.append(f"{result.name + ':':<{label_width}}  {summary}")
        for row in result.rows:
            cells = [_cell(row.get(key)) for key, _ in TABLE_COLUMNS]
            label = f"{result.name}: {row['label']}"
            lines.append(f"{label:<{label_width}}  " + "  ".join(f"{c:>8}" for c in cells))
    return "\n".join(lines)
