"""The figures of the position matrices, drawn from their numbers for comparison (matplotlib's Agg canvas).

Every figure compares: the heads of one model, or, in a study, the same quantity of several models
(``by_model``: {label: arrays}, one label for a single model's figure). So that they compare:

- signed data is drawn on a diverging map centred on 0 (white) with symmetric limits, unsigned data
  (attention probabilities) on a sequential map from 0;
- compared panels share one scale: one colour bar for every head of every model, one y-range for every
  head's profile;
- the colour limits are a high percentile of |v| (:data:`PERCENTILE`), not its maximum, so that a few
  large entries do not wash out the pattern; the caption says the limit and the fraction drawn clipped;
- the caption states the scale and flags a model whose values are all near zero
  (``untrained or unused: max |v| = 1.98e-03``): a blank panel is said to be blank;
- no tick label overlaps another (:func:`separate_tick_labels` drops the ones that would);
- each PNG (for reports) has a PDF beside it (:func:`vector_path`, for papers).

:func:`draw` dispatches on a figure's kind (:data:`KINDS`); the analysis's sections store each figure's
kind, options and arrays, from which a study draws its comparisons. matplotlib is imported when the first
figure is drawn, after the caller has set up logging (importing fairseq leaves the root logger at DEBUG,
where matplotlib's import would print its font-cache chatter).
"""

import math
import os

import numpy as np

from tupe_plugin.cli.extras import require

PANEL_INCHES = 3.2
SEQUENTIAL_CMAP = "viridis"  # unsigned data, from 0
SIGNED_CMAP = "RdBu_r"  # diverging: 0 is white, the sign is the colour
PERCENTILE = 99.0  # the colour limit: this percentile of |v| over every compared panel
NEAR_ZERO = 1e-2  # max |v| below this: a logit term that changes no attention weight by more than ~1%
VECTOR_FORMAT = "pdf"
DPI = 110


def _figure(rows, cols, width=PANEL_INCHES, height=PANEL_INCHES):
    require("matplotlib", "analysis", "drawing the position figures")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(cols * width, rows * height + 0.9), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def vector_path(path):
    """The vector file written beside the PNG ``path``: same name, :data:`VECTOR_FORMAT`."""
    return f"{os.path.splitext(str(path))[0]}.{VECTOR_FORMAT}"


def separate_tick_labels(figure):
    """Drop every tick label that would overlap a kept one on the same axis (after the layout)."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            ticks = [(tick, label) for tick, label in zip(axis.get_majorticklocs(), axis.get_ticklabels())
                     if label.get_visible() and label.get_text()]
            kept, extents = [], []
            for tick, label in ticks:
                extent = label.get_window_extent(renderer)
                if not any(extent.overlaps(other) for other in extents):
                    kept.append(tick)
                    extents.append(extent)
            if len(kept) < len(ticks):
                axis.set_ticks(kept)


def save(figure, path):
    """``figure`` written to the PNG ``path`` and, beside it, to :func:`vector_path`; the path."""
    separate_tick_labels(figure)
    figure.savefig(path, dpi=DPI)
    figure.savefig(vector_path(path))
    return str(path)


def _number(value):
    return f"{value:.3g}"


class Scale:
    """One scale for compared panels: (low, high) limits and what the caption says about them.

    ``signed``: symmetric limits ±(the :data:`PERCENTILE` of |v|); else 0 .. the percentile of v (data
    that is never negative). ``clipped``: the fraction of the entries beyond the limits.
    """

    def __init__(self, values, signed, percentile=PERCENTILE):
        values = np.concatenate([np.ravel(np.asarray(v, dtype=float)) for v in values]) if len(values) \
            else np.zeros(1)
        values = values[np.isfinite(values)]
        values = values if values.size else np.zeros(1)
        magnitude = np.abs(values)
        self.signed, self.percentile = signed, percentile
        self.largest = float(magnitude.max())
        bound = float(np.percentile(magnitude if signed else values, percentile))
        bound = bound if bound > 0 else (self.largest or 1.0)
        self.limits = (-bound, bound) if signed else (min(0.0, float(values.min())), bound)
        self.clipped = float(np.mean((values < self.limits[0]) | (values > self.limits[1])))

    def caption(self, shared_by, symbol="v"):
        """``shared_by``: what shares the scale ('the 4 heads'), None for a single panel."""
        low, high = self.limits
        shared = f" shared by {shared_by}" if shared_by else ""
        magnitude = f"|{symbol}|" if self.signed else symbol
        if self.signed:
            text = (f"one diverging colour scale{shared}, 0 white, limits ±{_number(high)} "
                    f"(the {self.percentile:g}th percentile of {magnitude}")
        else:
            text = (f"one colour scale{shared}, {_number(low)} to {_number(high)} "
                    f"(the {self.percentile:g}th percentile of {magnitude}")
        return text + (f"; {100 * self.clipped:.1f}% of the entries beyond it drawn at the end colour, "
                       f"max {magnitude} = {_number(self.largest)})" if self.clipped else ")")


def near_zero_notes(by_model, key, symbol="v", threshold=NEAR_ZERO):
    """'untrained or unused: max |v| = ...' for each model whose ``key`` values are all near zero."""
    notes = []
    for label, arrays in by_model.items():
        largest = float(np.nanmax(np.abs(arrays[key]))) if np.size(arrays[key]) else 0.0
        if largest < threshold:
            who = f"{label}: " if len(by_model) > 1 else ""
            notes.append(f"{who}untrained or unused: max |{symbol}| = {_number(largest)} "
                         f"(< {threshold:g}), no pattern to read")
    return notes


def faint_notes(by_model, key, scale, symbol="v", share=0.02):
    """For a comparison of several models on one colour scale: each model whose largest |v| is under
    ``share`` of the shared limit (but not near zero), said to be drawn nearly blank on this scale."""
    if len(by_model) < 2:
        return []
    notes = []
    for label, arrays in by_model.items():
        largest = float(np.nanmax(np.abs(arrays[key]))) if np.size(arrays[key]) else 0.0
        if NEAR_ZERO <= largest < share * scale.limits[1]:
            notes.append(f"{label}: max |{symbol}| = {_number(largest)}, under {100 * share:g}% of the "
                         "shared limit, nearly blank on this scale (its own analysis draws it on its own)")
    return notes


def _caption(figure, parts):
    text = "; ".join(part for part in parts if part) + "."
    figure.supxlabel(text, fontsize=7.5, wrap=True)
    return text


def _shared_by(by_model, what, count):
    """'the 8 heads of the 2 models'; None for a single panel."""
    models = f" of the {len(by_model)} models" if len(by_model) > 1 else ""
    return f"the {count} {what}{models}" if count > 1 else None


def _heatmap(axes, matrix, axis_values, scale, cmap):
    first, last = float(axis_values[0]), float(axis_values[-1])
    return axes.imshow(
        np.asarray(matrix), interpolation="nearest", aspect="equal", cmap=cmap,
        vmin=scale.limits[0], vmax=scale.limits[1],
        extent=(first - 0.5, last + 0.5, last + 0.5, first - 0.5),
    )


def _label_axes(axes, title, xlabel, ylabel):
    axes.set_title(title, fontsize=9)
    axes.set_xlabel(xlabel, fontsize=8)
    axes.set_ylabel(ylabel, fontsize=8)
    axes.tick_params(labelsize=7)


def _measured(arrays, key):
    """``arrays[key]`` without the rows and columns before ``measured_from`` (the [CLS] reset's)."""
    first = int(arrays.get("measured_from", 0))
    return np.asarray(arrays[key])[..., first:, first:]


def heads_heatmaps(by_model, title, path, signed, symbol="v", xlabel="key position j",
                   ylabel="query position i", note=""):
    """Per-head (H, T, T) ``matrices`` over ``positions``: one row per model, one panel per head.

    Every panel shares one colour scale, taken over each model's measured part (from ``measured_from``:
    the [CLS] reset's row and column 0, which hold θ1 / θ2 rather than a proximity, are drawn clipped).
    Returns (path, caption).
    """
    rows = len(by_model)
    cols = max(len(arrays["matrices"]) for arrays in by_model.values())
    figure = _figure(rows, cols, *(2 * (PANEL_INCHES if rows == 1 else 2.6,)))
    figure.suptitle(title, fontsize=11)
    scale = Scale([_measured(arrays, "matrices") for arrays in by_model.values()], signed)
    panels = figure.subplots(rows, cols, squeeze=False)
    image = None
    for row, (label, arrays) in zip(panels, by_model.items()):
        matrices = np.asarray(arrays["matrices"])
        for head, axes in enumerate(row):
            if head >= len(matrices):
                axes.set_axis_off()
                continue
            image = _heatmap(axes, matrices[head], np.asarray(arrays["positions"]), scale,
                             SIGNED_CMAP if signed else SEQUENTIAL_CMAP)
            _label_axes(axes, f"head {head}" if rows == 1 else f"{label}, head {head}", xlabel,
                        ylabel if head == 0 else "")
    figure.colorbar(image, ax=panels.ravel().tolist(), shrink=0.8).ax.tick_params(labelsize=7)
    heads = sum(len(arrays["matrices"]) for arrays in by_model.values())
    reset = [label for label, arrays in by_model.items() if int(arrays.get("measured_from", 0))]
    parts = [scale.caption(_shared_by(by_model, "heads", heads), symbol)]
    if reset:
        who = f" of {', '.join(reset)}" if len(by_model) > 1 else ""
        parts.append(f"row and column 0{who} (the [CLS] reset's θ1, θ2) left out of the scale")
    flags = (near_zero_notes(by_model, "matrices", symbol) if signed else []) \
        + faint_notes(by_model, "matrices", scale, symbol)
    caption = _caption(figure, parts + flags + [note])
    return save(figure, path), caption


def _grid(count):
    cols = min(count, 4)
    return math.ceil(count / cols), cols


def symlog_ticks(linear_within, reach):
    """Offsets to tick on a symmetric-log axis linear within ±``linear_within``, out to ±``reach``:
    0, the linear region's edges, the decades between, the farthest offset (no two within a factor 2)."""
    positive = [linear_within]
    for decade in (10 ** k for k in range(1, 8)):
        if positive[-1] * 2 <= decade <= reach / 2:
            positive.append(decade)
    if reach > linear_within:
        positive.append(reach)
    return [-t for t in reversed(positive)] + [0] + positive


def heads_profiles(by_model, title, path, ylabel, xlabel="offset j - i (key - query)", symbol="b",
                   note=""):
    """Per-head (H, M) ``values`` against M ``offsets``: one panel per head, one curve per model, one
    y-range shared by every panel. A model with ``linear_within`` K draws the offsets on a symmetric-log
    axis linear for |offset| <= K (T5's exact distances get room, the far log-spaced buckets stay
    visible), each offset marked. Returns (path, caption)."""
    heads = max(len(arrays["values"]) for arrays in by_model.values())
    rows, cols = _grid(heads)
    figure = _figure(rows, cols, height=2.6)
    figure.suptitle(title, fontsize=11)
    panels = figure.subplots(rows, cols, squeeze=False, sharex=True, sharey=True).ravel()
    linear = max(int(arrays.get("linear_within", 0)) for arrays in by_model.values())
    reach = max(int(np.max(np.abs(arrays["offsets"]))) for arrays in by_model.values())
    for head, axes in enumerate(panels):
        if head >= heads:
            axes.set_axis_off()
            continue
        for label, arrays in by_model.items():
            if head < len(arrays["values"]):
                style = dict(marker=".", ms=3, drawstyle="steps-mid") if linear else {}
                axes.plot(arrays["offsets"], arrays["values"][head], lw=1.0, label=label, **style)
        if linear:
            axes.set_xscale("symlog", linthresh=linear, linscale=1.5)
            axes.set_xticks(symlog_ticks(linear, reach), [str(t) for t in symlog_ticks(linear, reach)])
            axes.xaxis.set_minor_locator(_no_ticks())
            for edge in (-linear, linear):
                axes.axvline(edge, color="grey", lw=0.5, ls="--")
        axes.axvline(0, color="grey", lw=0.6, ls=":")
        axes.axhline(0, color="grey", lw=0.6, ls=":")
        axes.grid(alpha=0.3)
        _label_axes(axes, f"head {head}", xlabel, ylabel if head % cols == 0 else "")
        axes.tick_params(labelleft=True)
    if len(by_model) > 1:
        panels[0].legend(fontsize=7)
    what = _shared_by(by_model, "heads", sum(len(arrays["values"]) for arrays in by_model.values()))
    parts = [f"one y-range shared by {what}" if what else ""]
    if linear:
        parts.append(f"offset axis linear within ±{linear}, logarithmic beyond")
    caption = _caption(figure, parts + near_zero_notes(by_model, "values", symbol) + [note])
    return save(figure, path), caption


def _no_ticks():
    from matplotlib.ticker import NullLocator

    return NullLocator()


def heatmap_with_profile(by_model, title, path, signed, heatmap_title, xlabel, ylabel, profile_ylabel,
                         curves, symbol="v", profile_title="offset profile ψ(m)",
                         profile_xlabel="offset m (positions)", note=""):
    """Each model's (T, T) ``matrix`` over ``positions`` (one row each, one colour scale), beside one line
    plot of every model's profiles: ``profile_offsets`` and ``profile_0``.. named by ``curves``. A model's
    ``label`` (an array holding one string) completes its heatmap's title. Returns (path, caption)."""
    rows = len(by_model)
    figure = _figure(rows, 2, width=4.6, height=4.0 if rows == 1 else 3.2)
    figure.suptitle(title, fontsize=11)
    grid = figure.add_gridspec(rows, 2)
    scale = Scale([_measured(arrays, "matrix") for arrays in by_model.values()], signed)
    right = figure.add_subplot(grid[:, 1])
    lefts = []
    for row, (label, arrays) in enumerate(by_model.items()):
        left = figure.add_subplot(grid[row, 0])
        lefts.append(left)
        image = _heatmap(left, arrays["matrix"], np.asarray(arrays["positions"]), scale,
                         SIGNED_CMAP if signed else SEQUENTIAL_CMAP)
        name = str(arrays["label"]) if "label" in arrays else ""
        heading = ", ".join(part for part in (heatmap_title, name) if part)
        _label_axes(left, heading if rows == 1 else f"{label}:\n{heading}", xlabel, ylabel)
        for index, (curve, style) in enumerate(zip(curves, ("-", "--", ":", "-."))):
            color = None if rows == 1 else f"C{row}"
            right.plot(arrays["profile_offsets"], arrays[f"profile_{index}"], lw=1.2, ls=style, marker=".",
                       ms=3, color=color, label=curve if rows == 1 else f"{label}: {curve}")
    figure.colorbar(image, ax=lefts, shrink=0.8).ax.tick_params(labelsize=7)
    _label_axes(right, profile_title, profile_xlabel, profile_ylabel)
    right.grid(alpha=0.3)
    right.legend(fontsize=7)
    parts = [scale.caption(_shared_by(by_model, "heatmaps", rows), symbol)]
    # unsigned data are probabilities, near 0 when spread over many positions: no flag for them
    flags = (near_zero_notes(by_model, "matrix", symbol) if signed else []) \
        + faint_notes(by_model, "matrix", scale, symbol)
    caption = _caption(figure, parts + flags + [note])
    return save(figure, path), caption


def learned_frequencies(by_model, title, path, names, note=""):
    """Per learnable sinusoid ``NAME`` of ``names`` (APE, RPE, RoPE) a model has: its initial and learned
    frequencies ``NAME/initial``, ``NAME/learned`` and psi(m) = Σ_i cos(ω_i m) of each over ``NAME/offsets``
    (``NAME/psi_initial``, ``NAME/psi_learned``); two panels per sinusoid and model. Returns (path, caption).
    """
    entries = [(label, name, arrays) for label, arrays in by_model.items() for name in names
               if f"{name}/learned" in arrays]
    figure = _figure(len(entries), 2, width=4.6, height=3.2)
    figure.suptitle(title, fontsize=11)
    panels = figure.subplots(len(entries), 2, squeeze=False)
    for (label, name, arrays), (left, right) in zip(entries, panels):
        heading = name if len(by_model) == 1 else f"{label}, {name}"
        index = np.arange(len(arrays[f"{name}/initial"]))
        left.semilogy(index, np.abs(arrays[f"{name}/initial"]), lw=1.2, label="initial 10000^(-2i/d)")
        left.semilogy(index, np.abs(arrays[f"{name}/learned"]), lw=1.2, marker=".", ms=3, label="learned")
        _label_axes(left, f"{heading}: frequencies |ω_i|", "frequency index i",
                    "|ω_i| (radians per position)")
        right.plot(arrays[f"{name}/offsets"], arrays[f"{name}/psi_initial"], lw=1.2, label="initial")
        right.plot(arrays[f"{name}/offsets"], arrays[f"{name}/psi_learned"], lw=1.2, label="learned")
        _label_axes(right, f"{heading}: ψ(m) = Σ_i cos(ω_i m)", "offset m (positions)", "ψ(m)")
        for axes in (left, right):
            axes.grid(alpha=0.3)
            axes.legend(fontsize=7)
    caption = _caption(figure, ["frequencies on a log axis, initial against learned", note])
    return save(figure, path), caption


KINDS = {
    "heads_heatmaps": heads_heatmaps,
    "heads_profiles": heads_profiles,
    "heatmap_with_profile": heatmap_with_profile,
    "learned_frequencies": learned_frequencies,
}


def draw(kind, by_model, title, path, **options):
    """Draw the figure of ``kind`` (:data:`KINDS`) of ``by_model`` ({label: arrays}); (path, caption)."""
    return KINDS[kind](by_model, title, path, **options)
