"""The analysis report: a list of sections run on one model, written as figures, one JSON and a table.

A section is a function ``section(context) -> SectionResult``. It draws its figures into
``context.out_dir`` with :meth:`SectionResult.draw` (which keeps each figure's numbers, so that a study
draws the same figure for several models: ``positions.npz`` beside the JSON), returns its numbers as
JSON-ready ``metrics`` and, for the printed table, the property metrics of its matrices as ``rows``.
A section that does not apply to the model returns
``SectionResult.not_applicable(name, title, reason)``. New diagnoses are new section functions
appended to the list handed to :func:`run_sections` (see :mod:`tupe_plugin.analysis.cli`).
"""

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from . import figures as drawing
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
    captions: list = field(default_factory=list)
    plots: list = field(default_factory=list)
    arrays: dict = field(default_factory=dict)

    @classmethod
    def not_applicable(cls, name, title, reason):
        return cls(name, title, applies=False, reason=reason)

    def draw(self, context, figure, kind, title, arrays, **options):
        """Draw figure ``figure`` of ``kind`` (:data:`figures.KINDS`) of the model's ``arrays`` into the
        report's folder; its caption, its kind and options (``plots``) and its arrays are kept."""
        path, caption = drawing.draw(kind, {context.arch: arrays}, f"{context.arch}: {title}",
                                     context.figure_path(figure), **options)
        self.figures.append(path)
        self.captions.append(caption)
        self.plots.append({"figure": figure, "kind": kind, "title": title, "options": options})
        self.arrays.update({f"{figure}/{key}": np.asarray(value) for key, value in arrays.items()})

    def add_row(self, label, properties):
        """One line of the printed table: a label and a :func:`property_metrics` dict."""
        self.rows.append({"label": label, **properties})


class OutputFolderError(UserError, RuntimeError):
    """An output folder holding files the analysis did not write."""


def claim_output_folder(out_dir, report_name, out_flag="--out"):
    """Make ``out_dir`` ready for a new report and remove only what an earlier report wrote there.

    A folder the analysis wrote holds ``report_name``, which lists its figures: those and the report
    (each PNG with the vector file beside it), the arrays beside the report and the report are removed
    (figures of another architecture do not linger beside the new ones), anything else is kept. A
    non-empty folder without that report is not the analysis's: :class:`OutputFolderError`.
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
    written = [arrays_path(report)]
    for section in sections.values() if isinstance(sections, dict) else []:
        for figure in section.get("figures", []) if isinstance(section, dict) else []:
            written += [str(figure), drawing.vector_path(figure)]
    for figure in written:
        path = os.path.join(out_dir, os.path.basename(figure))  # never outside the folder
        if os.path.isfile(path):
            os.remove(path)
            removed.append(path)
    os.remove(report)
    return removed + [report]


def run_sections(context, sections):
    """Run every section in order; returns their results."""
    os.makedirs(context.out_dir, exist_ok=True)
    return [section(context) for section in sections]


def arrays_path(report_path):
    """``positions.npz`` beside ``positions.json``: the numbers of every figure, by ``FIGURE/KEY``."""
    return os.path.splitext(str(report_path))[0] + ".npz"


def write_json(context, results, path, checkpoint=None):
    """The report ``path`` and, beside it, the figures' arrays (:func:`arrays_path`)."""
    arrays = {key: value for result in results for key, value in result.arrays.items()}
    np.savez_compressed(arrays_path(path), **arrays)
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
    data.pop("arrays")
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


WINDOW_COLUMNS = {"decreasing_window_forward", "decreasing_window_backward"}


def column_format(values, window=False):
    """One format for a column's numbers: whole numbers for a column of windows that are all whole
    (one matrix's W*), two decimals for windows averaged over heads; three decimals for the other metrics,
    or three significant digits for the whole column when a non-zero value is below 0.01 (never a false
    0.000). None prints '-', nan 'nan'."""
    numbers = [v for v in values if v is not None and v == v]
    if window:
        whole = all(float(v).is_integer() for v in numbers)
        return lambda v: "-" if v is None else "nan" if v != v else f"{v:.0f}" if whole else f"{v:.2f}"
    small = any(0 < abs(v) < 0.01 for v in numbers)
    return lambda v: "-" if v is None else "nan" if v != v else f"{v:.2e}" if small else f"{v:.3f}"


def format_columns(rows, keys):
    """The cells of ``rows`` (dicts) under ``keys``, each column in its :func:`column_format`."""
    formats = [column_format([row.get(key) for row in rows], key in WINDOW_COLUMNS) for key in keys]
    return [[form(row.get(key)) for form, key in zip(formats, keys)] for row in rows]


def format_table(results):
    """The short table printed by the script: one line per matrix; the sections that do not apply are
    left out and named on one line (positions.json says why)."""
    measured = [(f"{r.name}: {row['label']}", row) for r in results if r.applies for row in r.rows]
    summaries = [(f"{r.name}:", r.summary or "(figures only, see JSON)")
                 for r in results if r.applies and not r.rows]
    label_width = max([len(label) for label, _ in measured + summaries] + [24])
    header = f"{'matrix':<{label_width}}  " + "  ".join(f"{title:>8}" for _, title in TABLE_COLUMNS)
    lines = [header, "-" * len(header)]
    cells = format_columns([row for _, row in measured], [key for key, _ in TABLE_COLUMNS])
    for (label, _), row in zip(measured, cells):
        lines.append(f"{label:<{label_width}}  " + "  ".join(f"{c:>8}" for c in row))
    lines += [f"{label:<{label_width}}  {summary}" for label, summary in summaries]
    missing = [r.name for r in results if not r.applies]
    if missing:
        lines.append(f"not applicable (positions.json says why): {', '.join(missing)}")
    return "\n".join(lines)
