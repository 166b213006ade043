"""The analysis and study figures, drawn from tiny models trained a few updates: what can be checked
without eyes. Signed data on a diverging map centred on 0, one scale for compared panels (the heads of a
model; the same quantity across a study's architectures), colour limits that a few outliers do not set,
a caption that states the scale and flags an all-near-zero matrix, no empty panel, no tick label over
another, a vector file beside each PNG; the study's comparisons drawn from the numbers, only for the
architectures that have them."""

import json

import numpy as np
import pytest

from cli import run_fairseq_steps, train_args
from tupe_plugin.analysis import cli as analyze_positions
from tupe_plugin.analysis import figures
from tupe_plugin.study.figures import analysis_figures
from tupe_plugin.study.results import analysis_result

# every kind of figure: per-head heatmaps (content-free term, first-layer correlation), per-head
# profiles (T5, ALiBi), heatmaps with a profile (dot products, probing), learned frequencies
ARCHS = ("tupe_r_tiny", "bert_a_tiny", "bert_alibi_tiny", "bert_lsin_ape_lsin_rpe_tiny")
SIGNED_SECTIONS = {"content_free_term", "first_layer_position_correlation", "absolute_position_dot_products",
                   "relative_position_dot_products", "rotary_profile"}


class Drawn:
    """Every figure the analysis saved: {file name: (matplotlib figure, caption)}, and the report."""

    def __init__(self, out):
        self.out = out
        self.figures = {}

    @property
    def report(self):
        return json.loads((self.out / "positions.json").read_text())

    def arrays(self):
        with np.load(self.out / "positions.npz") as stored:
            return {key: stored[key] for key in stored.files}


@pytest.fixture(scope="module")
def analysed(wikitext_bin, tmp_path_factory):
    """{arch: Drawn} of each of ARCHS, trained 3 updates and analysed over 24 positions."""
    root = tmp_path_factory.mktemp("trained")
    run_fairseq_steps(*[("train", train_args(wikitext_bin, root / arch, arch, 3)) for arch in ARCHS])
    found = {}
    with pytest.MonkeyPatch.context() as patch:
        for arch in ARCHS:
            drawn = found[arch] = Drawn(root / arch / "analysis")
            save = figures.save

            def keeping(figure, path, drawn=drawn, save=save):
                drawn.figures[str(path)] = figure
                return save(figure, path)

            patch.setattr(figures, "save", keeping)
            analyze_positions.main(["--path", str(root / arch / "checkpoint_last.pt"),
                                    "--data", str(wikitext_bin), "--out", str(drawn.out),
                                    "--max-positions", "24", "--probe-samples", "4", "--device", "cpu"])
    return found


def drawn_figures(analysed):
    """(arch, section, figure, caption) of every figure drawn."""
    for arch, drawn in analysed.items():
        for name, section in drawn.report["sections"].items():
            for path, caption in zip(section.get("figures", []), section.get("captions", [])):
                yield arch, name, drawn.figures[path], caption


def images(figure):
    return [image for axes in figure.axes for image in axes.images]


def data_axes(figure):
    """The figure's panels, without its colour bars and switched-off axes."""
    bars = {image.colorbar.ax for image in images(figure) if image.colorbar}
    return [axes for axes in figure.axes if axes.axison and axes not in bars]


def overlapping_tick_labels(figure):
    """Pairs of visible tick labels of one axis whose extents overlap, as the renderer lays them out."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    found = []
    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            labels = [label for label in axis.get_ticklabels() if label.get_visible() and label.get_text()]
            extents = [label.get_window_extent(renderer) for label in labels]
            found += [(labels[i].get_text(), labels[j].get_text()) for i in range(len(labels))
                      for j in range(i + 1, len(labels)) if extents[i].overlaps(extents[j])]
    return found


def test_signed_matrices_are_drawn_on_a_diverging_map_with_symmetric_limits(analysed):
    drawn = [(name, figure) for _, name, figure, _ in drawn_figures(analysed) if name in SIGNED_SECTIONS]
    assert {name for name, _ in drawn} >= {"content_free_term", "first_layer_position_correlation"}
    for name, figure in drawn:
        for image in images(figure):
            low, high = image.get_clim()
            assert image.get_cmap().name == figures.SIGNED_CMAP and low == -high and high > 0, name


def test_probabilities_are_drawn_on_a_sequential_map_from_zero(analysed):
    for _, name, figure, _ in drawn_figures(analysed):
        if name == "identical_word_probing":
            (image,) = images(figure)
            assert image.get_cmap().name == figures.SEQUENTIAL_CMAP and image.get_clim()[0] == 0


def test_heads_of_a_model_share_one_colour_scale_and_one_colour_bar(analysed):
    for arch, name, figure, _ in drawn_figures(analysed):
        if len(images(figure)) > 1:
            assert len({image.get_clim() for image in images(figure)}) == 1, (arch, name)
            assert len({id(image.colorbar) for image in images(figure) if image.colorbar}) <= 1


def test_heads_profiles_share_one_y_range(analysed):
    profiles = [(arch, name, figure) for arch, name, figure, _ in drawn_figures(analysed)
                if name in ("t5_bias", "alibi_bias")]
    assert {name for _, name, _ in profiles} == {"t5_bias", "alibi_bias"}
    for arch, name, figure in profiles:
        assert len({axes.get_ylim() for axes in data_axes(figure)}) == 1, (arch, name)


def test_colour_limits_are_a_high_percentile_so_that_a_few_outliers_are_clipped():
    values = np.random.default_rng(0).uniform(-0.1, 0.1, 1000)
    outliers = np.full(5, 0.85)
    everything = np.concatenate([values, outliers])
    scale = figures.Scale([everything], signed=True)
    low, high = scale.limits
    assert low == -high and np.percentile(np.abs(values), 95) <= high < outliers.min()
    share = f"{100 * np.mean(np.abs(everything) > high):.1f}% of the entries beyond it"
    assert share in scale.caption("the 4 heads") and "99th percentile" in scale.caption("the 4 heads")


def test_caption_states_the_shared_scale(analysed):
    for _, name, _, caption in drawn_figures(analysed):
        if name == "content_free_term":
            assert "one diverging colour scale shared by the 4 heads" in caption


def test_caption_flags_a_matrix_whose_values_are_all_near_zero(analysed):
    checked = 0
    for arch, drawn in analysed.items():
        arrays, sections = drawn.arrays(), drawn.report["sections"]
        for name in ("content_free_term", "first_layer_position_correlation"):
            if sections[name]["applies"]:
                largest = np.abs(arrays[f"{name}/matrices"]).max()
                flagged = "untrained or unused" in sections[name]["captions"][0]
                assert flagged == (largest < figures.NEAR_ZERO)
                checked += 1
    assert checked >= 2


@pytest.mark.parametrize("factor, flagged", [(1e-4, True), (1.0, False)])
def test_near_zero_flag_follows_the_largest_magnitude(factor, flagged):
    matrices = np.random.default_rng(0).normal(0, 1, (2, 8, 8)) * factor
    notes = figures.near_zero_notes({"m": {"matrices": matrices}}, "matrices")
    assert bool(notes) == flagged
    if flagged:
        assert f"max |v| = {np.abs(matrices).max():.3g}" in notes[0]


def test_comparison_caption_names_a_model_drawn_nearly_blank_on_the_shared_scale():
    rng = np.random.default_rng(0)
    by_model = {"large": {"matrix": rng.normal(0, 10, (8, 8))},
                "small": {"matrix": rng.normal(0, 0.02, (8, 8))}}
    scale = figures.Scale([arrays["matrix"] for arrays in by_model.values()], signed=True)
    notes = figures.faint_notes(by_model, "matrix", scale)
    assert len(notes) == 1 and notes[0].startswith("small: max |v|")


def test_no_panel_is_empty(analysed):
    for arch, name, figure, _ in drawn_figures(analysed):
        assert all(axes.images or axes.lines for axes in data_axes(figure)), (arch, name)


def test_no_tick_label_overlaps_another(analysed):
    for arch, name, figure, _ in drawn_figures(analysed):
        assert overlapping_tick_labels(figure) == [], (arch, name)


def test_symlog_ticks_leave_room_between_labels():
    ticks = figures.symlog_ticks(8, 127)
    assert ticks == sorted(ticks) and ticks == [-t for t in reversed(ticks)]
    positive = [t for t in ticks if t > 0]
    assert positive[0] == 8 and positive[-1] == 127
    assert all(b >= 2 * a for a, b in zip(positive, positive[1:-1]))


def test_a_vector_file_is_written_beside_each_png(analysed):
    for _, drawn in analysed.items():
        for section in drawn.report["sections"].values():
            for path in section.get("figures", []):
                with open(figures.vector_path(path), "rb") as f:
                    assert f.read(5) == b"%PDF-"


@pytest.fixture(scope="module")
def study_figures(analysed, tmp_path_factory):
    """The study's comparison figures of ARCHS' analyses: {figure: (matplotlib figure, caption)}."""
    report = {"archs": {arch: {"analysis": analysis_result(str(drawn.out / "positions.json"))}
                        for arch, drawn in analysed.items()}}
    folder = tmp_path_factory.mktemp("study_figures")
    kept = {}
    with pytest.MonkeyPatch.context() as patch:
        save = figures.save

        def keeping(figure, path):
            kept[str(path)] = figure
            return save(figure, path)

        patch.setattr(figures, "save", keeping)
        written = analysis_figures(report, str(folder))
    return {name: (kept[path], caption, path) for name, (path, caption) in written.items()}


def test_study_draws_every_architectures_matrix_from_its_numbers_on_one_scale(analysed, study_figures):
    figure, _, _ = study_figures["absolute_position_dot_products"]
    having = [arch for arch in ARCHS
              if analysed[arch].report["sections"]["absolute_position_dot_products"]["applies"]]
    drawn = images(figure)
    assert len(drawn) == len(having) > 1 and len({image.get_clim() for image in drawn}) == 1
    expected = [analysed[arch].arrays()["absolute_position_dot_products/matrix"] for arch in having]
    for image, matrix in zip(drawn, expected):
        np.testing.assert_allclose(image.get_array(), matrix)


def test_study_figure_leaves_out_archs_without_the_quantity_and_names_them(analysed, study_figures):
    figure, caption, _ = study_figures["t5_bias"]
    assert {line.get_label() for axes in data_axes(figure) for line in axes.lines
            if not line.get_label().startswith("_")} == {"tupe_r_tiny"}
    without = [arch for arch in ARCHS if not analysed[arch].report["sections"]["t5_bias"]["applies"]]
    assert f"not drawn for {', '.join(without)}" in caption
    assert all(axes.lines for axes in data_axes(figure))


def test_study_profiles_put_every_architectures_curve_on_one_axis_per_head(study_figures):
    figure, _, _ = study_figures["identical_word_probing"]
    (profile,) = [axes for axes in data_axes(figure) if axes.lines]
    assert {line.get_label().split(":")[0] for line in profile.lines} == set(ARCHS)


def test_study_figures_have_no_overlapping_tick_labels_and_a_vector_file(study_figures, tmp_path):
    for name, (figure, _, path) in study_figures.items():
        assert overlapping_tick_labels(figure) == [], name
        with open(figures.vector_path(path), "rb") as f:
            assert f.read(5) == b"%PDF-"
