"""The analysis writes only into a folder it owns; its table never prints a non-zero value as 0.000, prints
each column in one format and names the sections that do not apply on one line."""

import json
import math

import pytest

from tupe_plugin.analysis.report import (TABLE_COLUMNS, OutputFolderError, SectionResult,
                                         claim_output_folder, format_table)

REPORT = "positions.json"


def earlier_report(out, figures):
    out.mkdir(parents=True, exist_ok=True)
    for name in figures:
        (out / f"{name}.png").write_bytes(b"png")
    sections = {name: {"applies": True, "figures": [str(out / f"{name}.png")]} for name in figures}
    sections["not_drawn"] = {"applies": False, "reason": "n/a"}
    (out / REPORT).write_text(json.dumps({"sections": sections}))


def test_earlier_report_figures_are_removed_and_other_files_kept(tmp_path):
    out = tmp_path / "analysis"
    earlier_report(out, ["content_free_term", "t5_bias"])
    (out / "my_notes.txt").write_text("mine")
    (out / "my_plot.png").write_bytes(b"mine")
    claim_output_folder(str(out), REPORT)
    assert sorted(p.name for p in out.iterdir()) == ["my_notes.txt", "my_plot.png"]


def test_report_listing_a_figure_outside_the_folder_removes_only_inside(tmp_path):
    out = tmp_path / "analysis"
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(b"mine")
    out.mkdir()
    (out / REPORT).write_text(json.dumps({"sections": {"x": {"figures": [str(outside)]}}}))
    claim_output_folder(str(out), REPORT)
    assert outside.exists() and list(out.iterdir()) == []


@pytest.mark.parametrize("content", ["a user's file", "a user's png", "a subfolder"])
def test_folder_not_written_by_the_analysis_is_refused_untouched(tmp_path, content):
    out = tmp_path / "analysis"
    out.mkdir()
    if content == "a subfolder":
        (out / "runs").mkdir()
    else:
        (out / ("notes.txt" if "file" in content else "figure.png")).write_text("mine")
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(OutputFolderError, match=r"--out .*analysis holds files that the analysis did not "
                                                r"write .*give a new or empty folder"):
        claim_output_folder(str(out), REPORT)
    assert sorted(p.name for p in out.iterdir()) == before


@pytest.mark.parametrize("state", ["missing", "empty"])
def test_new_or_empty_folder_is_accepted(tmp_path, state):
    out = tmp_path / "analysis"
    if state == "empty":
        out.mkdir()
    assert claim_output_folder(str(out), REPORT) == []


def test_output_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "analysis").write_text("mine")
    with pytest.raises(OutputFolderError, match="is a file"):
        claim_output_folder(str(tmp_path / "analysis"), REPORT)


@pytest.mark.parametrize("value, printed", [(0.0005, "5.00e-04"), (-0.0012, "-1.20e-03"), (0.0, "0.000"),
                                            (0.888, "0.888"), (1.396, "1.396"), (0.01, "0.010")])
def test_table_prints_small_values_with_significant_digits(value, printed):
    result = SectionResult("s", "title")
    result.add_row("m", {"translation_invariance_violation": value})
    assert format_table([result]).splitlines()[-1].split()[2] == printed


def test_table_prints_nan_as_nan():
    result = SectionResult("s", "title")
    result.add_row("m", {"translation_invariance_violation": math.nan})
    assert format_table([result]).splitlines()[-1].split()[2] == "nan"


def table_column(rows, key="translation_invariance_violation"):
    """The printed cells of column ``key`` for a section of ``rows`` ({key: value})."""
    result = SectionResult("s", "title")
    for index, row in enumerate(rows):
        result.add_row(f"m{index}", row)
    column = [k for k, _ in TABLE_COLUMNS].index(key)
    return [line.split()[2 + column] for line in format_table([result]).splitlines()[2:]]


def test_table_prints_a_column_in_one_format_when_one_value_is_small():
    assert table_column([{"translation_invariance_violation": 0.888},
                         {"translation_invariance_violation": 0.0005}]) == ["8.88e-01", "5.00e-04"]


@pytest.mark.parametrize("windows, printed", [([3, 0], ["3", "0"]), ([0.25, 1], ["0.25", "1.00"])])
def test_window_columns_print_whole_windows_or_two_decimals_for_means_over_heads(windows, printed):
    rows = [{"decreasing_window_forward": w} for w in windows]
    assert table_column(rows, "decreasing_window_forward") == printed


def test_table_leaves_out_sections_that_do_not_apply_and_names_them_on_one_line():
    measured = SectionResult("measured", "title")
    measured.add_row("m", {"translation_invariance_violation": 0.5})
    missing = [SectionResult.not_applicable(name, "title", f"has no {name}") for name in ("t5_bias", "alibi")]
    lines = format_table([missing[0], measured, missing[1]]).splitlines()
    assert [line.split(":")[0] for line in lines[2:-1]] == ["measured"]
    assert lines[-1] == "not applicable (positions.json says why): t5_bias, alibi"


def test_earlier_report_vector_files_and_arrays_are_removed(tmp_path):
    out = tmp_path / "analysis"
    earlier_report(out, ["content_free_term"])
    (out / "content_free_term.pdf").write_bytes(b"%PDF-")
    (out / "positions.npz").write_bytes(b"PK")
    claim_output_folder(str(out), REPORT)
    assert list(out.iterdir()) == []
