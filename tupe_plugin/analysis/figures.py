"""PNG drawings of the position matrices (matplotlib's Agg canvas; no display, no pyplot state).

Every heatmap has a title, both axes labelled and ticked with positions (or offsets) and its own
colour bar; per-head matrices get one panel per head. matplotlib is imported when the first figure
is drawn, after the caller has set up logging (importing fairseq leaves the root logger at DEBUG,
where matplotlib's import would print its font-cache chatter).
"""

import math

import numpy as np

from tupe_plugin.cli.extras import require

PANEL_INCHES = 3.2
HEATMAP_CMAP = "viridis"
SIGNED_CMAP = "RdBu_r"  # diverging: 0 is white, the sign is the colour


def _figure(rows, cols, width=PANEL_INCHES, height=PANEL_INCHES):
    require("matplotlib", "analysis", "drawing the position figures")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(cols * width, rows * height + 0.6), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path):
    figure.savefig(path, dpi=110)
    return str(path)


def signed_limits(matrices):
    """(-m, m) with m the largest magnitude over all ``matrices``: one scale centred on 0."""
    bound = float(np.nanmax(np.abs(np.asarray(matrices)))) if np.size(matrices) else 1.0
    bound = bound if bound > 0 and math.isfinite(bound) else 1.0
    return -bound, bound


def _heatmap(figure, axes, matrix, axis_values, xlabel, ylabel, title, limits=None, colorbar=True):
    """matrix[i, j] with row i at axis_values[i] (top to bottom) and column j at axis_values[j].

    ``limits`` (vmin, vmax) draws on a diverging scale shared with other panels (no colour bar of
    its own when ``colorbar`` is off).
    """
    first, last = axis_values[0], axis_values[-1]
    scale = {} if limits is None else dict(cmap=SIGNED_CMAP, vmin=limits[0], vmax=limits[1])
    image = axes.imshow(
        np.asarray(matrix), interpolation="nearest", aspect="equal",
        extent=(first - 0.5, last + 0.5, last + 0.5, first - 0.5), **{"cmap": HEATMAP_CMAP, **scale},
    )
    axes.set_title(title, fontsize=9)
    axes.set_xlabel(xlabel, fontsize=8)
    axes.set_ylabel(ylabel, fontsize=8)
    axes.tick_params(labelsize=7)
    if colorbar:
        figure.colorbar(image, ax=axes, shrink=0.8).ax.tick_params(labelsize=7)
    return image


def _grid(count):
    cols = min(count, 4)
    return math.ceil(count / cols), cols


def per_head_heatmaps(matrices, title, path, first_position=0,
                      xlabel="key position j", ylabel="query position i", signed=False):
    """(H, T, T) matrices, one panel per head, positions first_position.. on both axes.

    ``signed``: one diverging colour scale, centred on 0 and shared by every head, with one colour
    bar, so that heads compare by colour and the sign reads at a glance.
    """
    matrices = np.asarray(matrices)
    rows, cols = _grid(len(matrices))
    figure = _figure(rows, cols)
    figure.suptitle(title, fontsize=11)
    positions = np.arange(first_position, first_position + matrices.shape[-1])
    panels = figure.subplots(rows, cols, squeeze=False).ravel()
    limits = signed_limits(matrices) if signed else None
    image = None
    for head, axes in enumerate(panels):
        if head < len(matrices):
            image = _heatmap(figure, axes, matrices[head], positions, xlabel, ylabel, f"head {head}",
                             limits=limits, colorbar=not signed)
        else:
            axes.set_axis_off()
    if signed and image is not None:
        figure.colorbar(image, ax=list(panels), shrink=0.8).ax.tick_params(labelsize=7)
    return _save(figure, path)


def per_head_profiles(offsets, values, title, path, ylabel, xlabel="offset j - i (key - query)",
                      linear_within=None):
    """(H, M) values against M offsets, one panel per head.

    ``linear_within=K``: a symmetric-log offset axis, linear for |offset| <= K, so that the exact
    distances near 0 (T5's first buckets) get room while the far, log-spaced buckets stay visible;
    each offset is marked.
    """
    values = np.asarray(values)
    rows, cols = _grid(len(values))
    figure = _figure(rows, cols, height=2.4)
    figure.suptitle(title, fontsize=11)
    panels = figure.subplots(rows, cols, squeeze=False, sharex=True).ravel()
    for head, axes in enumerate(panels):
        if head < len(values):
            if linear_within:
                axes.plot(offsets, values[head], lw=1.0, marker=".", ms=3, drawstyle="steps-mid")
                axes.set_xscale("symlog", linthresh=linear_within, linscale=1.5)
                for edge in (-linear_within, linear_within):
                    axes.axvline(edge, color="grey", lw=0.5, ls="--")
            else:
                axes.plot(offsets, values[head], lw=1.2)
            axes.axvline(0, color="grey", lw=0.6, ls=":")
            axes.set_title(f"head {head}", fontsize=9)
            axes.set_xlabel(xlabel, fontsize=8)
            axes.set_ylabel(ylabel, fontsize=8)
            axes.tick_params(labelsize=7)
        else:
            axes.set_axis_off()
    return _save(figure, path)


def heatmap_with_profile(matrix, axis_values, profile_offsets, profile, title, path,
                         heatmap_title, xlabel, ylabel, profile_ylabel,
                         profile_title="offset profile ψ(m)", profile_xlabel="offset m (positions)"):
    """A heatmap beside a line plot: profile (name -> values over profile_offsets)."""
    figure = _figure(1, 2, width=4.6, height=4.0)
    figure.suptitle(title, fontsize=11)
    left, right = figure.subplots(1, 2)
    _heatmap(figure, left, matrix, np.asarray(axis_values), xlabel, ylabel, heatmap_title)
    for (name, values), style in zip(profile.items(), ("-", "--", ":", "-.")):
        right.plot(profile_offsets, values, lw=1.2, ls=style, marker=".", ms=3, label=name)
    right.set_title(profile_title, fontsize=9)
    right.set_xlabel(profile_xlabel, fontsize=8)
    right.set_ylabel(profile_ylabel, fontsize=8)
    right.tick_params(labelsize=7)
    right.grid(alpha=0.3)
    right.legend(fontsize=7)
    return _save(figure, path)


def learned_frequencies(entries, title, path):
    """entries: name -> (initial, learned, offsets, psi_initial, psi_learned); two panels per sinusoid."""
    figure = _figure(len(entries), 2, width=4.6, height=3.2)
    figure.suptitle(title, fontsize=11)
    panels = figure.subplots(len(entries), 2, squeeze=False)
    for (name, (initial, learned, offsets, psi_initial, psi_learned)), (left, right) in zip(
        entries.items(), panels
    ):
        index = np.arange(len(initial))
        left.semilogy(index, np.abs(initial), lw=1.2, label="initial 10000^(-2i/d)")
        left.semilogy(index, np.abs(learned), lw=1.2, marker=".", ms=3, label="learned")
        left.set_title(f"{name}: frequencies |ω_i|", fontsize=9)
        left.set_xlabel("frequency index i", fontsize=8)
        left.set_ylabel("|ω_i| (radians per position)", fontsize=8)
        right.plot(offsets, psi_initial, lw=1.2, label="initial")
        right.plot(offsets, psi_learned, lw=1.2, label="learned")
        right.set_title(f"{name}: ψ(m) = Σ_i cos(ω_i m)", fontsize=9)
        right.set_xlabel("offset m (positions)", fontsize=8)
        right.set_ylabel("ψ(m)", fontsize=8)
        for axes in (left, right):
            axes.tick_params(labelsize=7)
            axes.grid(alpha=0.3)
            axes.legend(fontsize=7)
    return _save(figure, path)
