"""The analysis writes only into a folder it owns, and its table never prints a non-zero value as 0.000."""

import json
import math

import pytest

from tupe_plugin.analysis.report import (OutputFolderError, SectionResult, claim_output_folder,
                                         format_table)

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


def drawn_figure(monkeypatch):
    from tupe_plugin.analysis import figures

    drawn = []
    monkeypatch.setattr(figures, "_save", lambda figure, path: drawn.append(figure) or str(path))
    return figures, drawn


def test_signed_heatmaps_share_one_diverging_scale_centred_on_zero(monkeypatch, tmp_path):
    figures, drawn = drawn_figure(monkeypatch)
    matrices = [[[0.5, -2.0], [1.0, 0.0]], [[0.1, 0.2], [-0.3, 0.05]]]
    figures.per_head_heatmaps(matrices, "t", tmp_path / "x.png", signed=True)
    images = [axes.images[0] for axes in drawn[0].axes if axes.images]
    assert [image.get_clim() for image in images] == [(-2.0, 2.0)] * 2
    assert {image.get_cmap().name for image in images} == {"RdBu_r"}


def test_unsigned_heatmaps_keep_their_own_scale(monkeypatch, tmp_path):
    figures, drawn = drawn_figure(monkeypatch)
    figures.per_head_heatmaps([[[0.0, 1.0], [1.0, 0.0]], [[0.0, 3.0], [3.0, 0.0]]], "t", tmp_path / "x.png")
    assert [a.images[0].get_clim() for a in drawn[0].axes if a.images] == [(0.0, 1.0), (0.0, 3.0)]


def test_t5_profile_axis_is_linear_over_the_exact_distances(monkeypatch, tmp_path):
    figures, drawn = drawn_figure(monkeypatch)
    offsets = list(range(-20, 21))
    figures.per_head_profiles(offsets, [offsets, offsets], "t", tmp_path / "x.png", "b", linear_within=8)
    panels = [a for a in drawn[0].axes if a.lines]
    assert all(a.get_xscale() == "symlog" and a.xaxis.get_transform().linthresh == 8 for a in panels)
