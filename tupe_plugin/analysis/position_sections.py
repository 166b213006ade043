"""The sections of the position report: what each position encoding learned.

Each function is a report section (see :mod:`report`): it takes the matrices of
:mod:`position_matrices`, draws them with :mod:`figures` (through :meth:`SectionResult.draw`, which keeps
their numbers for a study's comparison) and measures them with
:mod:`position_metrics`, or says why it does not apply to the model's architecture.
"""

import numpy as np

from ..encodings.relative_position import exact_distances
from . import position_matrices as pm
from .position_metrics import (
    offset_asymmetry,
    offset_profile,
    property_metrics,
    strictly_decreasing_prefix,
)
from .report import SectionResult


def _not_applicable(context, name, title, why):
    """The section does not apply: ``why`` is said of the architecture, with its position flags."""
    flags = pm.position_config(context.model).describe()
    return SectionResult.not_applicable(name, title, f"{context.arch} {why} ({flags})")


def _first_measured(context):
    """Position 0 is left out of the measurements when the [CLS] reset replaces its row and column."""
    return 1 if pm.has_cls_reset(context.model) else 0


def _numpy(tensor):
    return tensor.detach().cpu().double().numpy()


def _per_head_metrics(result, matrices, first, window, label):
    heads = [property_metrics(matrix[first:, first:], window) for matrix in matrices]
    mean = {key: float(np.mean([h[key] for h in heads])) for key in heads[0]}
    mean.update(size=heads[0]["size"], monotonicity_window=heads[0]["monotonicity_window"])
    result.metrics.update(
        positions_measured=[first, first + heads[0]["size"] - 1],
        heads=heads,
        mean_over_heads=mean,
    )
    result.add_row(f"{label} (mean of {len(heads)} heads)", mean)


def _with_profile(matrix, positions, offsets, forward, backward):
    """The arrays of a heatmap-with-profile figure: the matrix and its forward and backward profiles."""
    return {"matrix": matrix, "positions": positions, "profile_offsets": offsets,
            "profile_0": forward, "profile_1": backward}


def _profiles(matrix):
    """psi(+m) and psi(-m) for m = 0..T-1 of a (T, T) matrix."""
    reach = matrix.shape[0]
    return (offset_profile(matrix, range(reach)), offset_profile(matrix, range(0, -reach, -1)))


def content_free_term(context):
    """TUPE Fig. 5: the per-head content-free term v_ij shared by all layers."""
    name, title = "content_free_term", "content-free term v_ij per head (TUPE Fig. 5)"
    term = pm.content_free_term(context.model, context.seq_len)
    if term is None:
        return _not_applicable(
            context, name, title,
            "has no content-free term: only --untied-pos tupe/four-term and the --rel-pos biases add one "
            "(Shaw vectors depend on the query)",
        )
    layer_terms = pm.position_config(context.model).layer_terms
    if layer_terms:  # CoPE, DAPE: each layer adds a term of its own logits on top of the shared one
        title += (f"; not drawn: the term each layer computes from its own logits ({layer_terms}), "
                  "of the content")
    result = SectionResult(name, title)
    matrices = _numpy(term)
    first = _first_measured(context)
    result.draw(context, name, "heads_heatmaps", title,
                {"matrices": matrices, "positions": np.arange(matrices.shape[-1]), "measured_from": first},
                signed=True)
    _per_head_metrics(result, matrices, first, context.window, "v_ij")
    if first:
        result.metrics["cls_reset"] = {
            "theta_1_from_cls": matrices[:, 0, 1].tolist(),
            "theta_2_to_cls": matrices[:, 1, 0].tolist(),
        }
    return result


def t5_bias(context):
    """TUPE Eq. 5/8: the T5 bias b[h, bucket(j - i)] against the offset, per head."""
    applies = pm.position_config(context.model).t5_bias
    return _relative_bias_section(context, applies, "t5_bias", "T5 relative bias b(j - i) per head",
                                  "has no t5 bias")


def alibi_bias(context):
    """ALiBi (Press et al. 2022): the fixed bias -m_h |j - i| against the offset, per head."""
    applies = pm.position_config(context.model).alibi
    return _relative_bias_section(context, applies, "alibi_bias", "ALiBi bias -m_h |j - i| per head",
                                  "has no alibi bias")


def distance_bias(context):
    """KERPLE (Chi et al. 2022), Sandwich (Chi et al. 2023), FIRE (Li et al. 2023), or any other registered
    bias of the distance but ALiBi's (a section of its own): the bias against the offset j - i, per head;
    its title is the encoding's description."""
    config = pm.position_config(context.model)
    encoding = next((encoding for encoding in config.encodings() if encoding.kind == "distance_bias"), None)
    applies = config.distance_bias and not config.alibi
    title = f"{encoding.label} bias per head: {encoding.summary}" if applies \
        else "KERPLE / Sandwich / FIRE bias per head"
    return _relative_bias_section(context, applies, "distance_bias", title,
                                  "has no kerple, sandwich or fire bias")


def _relative_bias_section(context, applies, name, title, missing):
    found = pm.relative_bias_by_distance(context.model, context.seq_len) if applies else None
    if found is None:
        return _not_applicable(context, name, title, missing)
    offsets, bias = (_numpy(t) for t in found)
    result = SectionResult(name, title)
    exact = exact_distances(pm.position_config(context.model))
    result.draw(context, name, "heads_profiles", title,
                {"offsets": offsets, "values": bias, "linear_within": exact}, ylabel="bias b")
    zero = len(offsets) // 2
    heads = []
    for values in bias:
        forward, backward = values[zero:], values[zero::-1]
        heads.append({
            "bias_forward": forward.tolist(),
            "bias_backward": backward.tolist(),
            "decreasing_window_forward": strictly_decreasing_prefix(forward),
            "decreasing_window_backward": strictly_decreasing_prefix(backward),
            "offset_asymmetry": offset_asymmetry(forward[1:], backward[1:]),
        })
    keys = ("decreasing_window_forward", "decreasing_window_backward", "offset_asymmetry")
    mean = {key: float(np.mean([h[key] for h in heads])) for key in keys}
    result.metrics.update(heads=heads, mean_over_heads=mean)
    result.add_row(f"b(j-i) (mean of {len(heads)} heads)", mean)
    return result


def disentangled_profiles(context):
    """DeBERTa (He et al. 2021 Eq. 4): the content-to-position and position-to-content terms against the
    offset j - i, averaged over random sentences and over the pairs of each offset, per head and layer."""
    name, title = "disentangled_profiles", "DeBERTa c2p / p2c terms against the offset j - i"
    found = pm.disentangled_profiles(context.model, context.dictionary, context.seq_len,
                                     context.probe_samples, context.seed)
    if found is None:
        return _not_applicable(context, name, title, "has no deberta disentangled attention")
    offsets, profiles = _numpy(found[0]), _numpy(found[1])
    result = SectionResult(name, title)
    zero = len(offsets) // 2
    for which, label in ((0, "c2p q_i . K^r_d(i,j)"), (1, "p2c k_j . Q^r_d(j,i)")):
        per_head = profiles[:, which].mean(0)
        result.draw(context, f"{name}_{label[:3]}", "heads_profiles",
                    f"{label}, mean of {len(profiles)} layers, {context.probe_samples} sentences",
                    {"offsets": offsets, "values": per_head}, ylabel="mean scaled logit term")
        layers = []
        for layer in profiles[:, which]:
            forward, backward = layer.mean(0)[zero:], layer.mean(0)[zero::-1]
            layers.append({"mean_forward": forward.tolist(), "mean_backward": backward.tolist(),
                           "offset_asymmetry": offset_asymmetry(forward[1:], backward[1:]),
                           "range_over_offsets": float(layer.mean(0).max() - layer.mean(0).min())})
        result.metrics[label[:3]] = {"layers": layers}
        for index, layer in enumerate(layers):
            result.add_row(f"{label[:3]}, layer {index} (mean of heads)",
                           {key: layer[key] for key in ("offset_asymmetry", "range_over_offsets")})
    return result


def rotary_profile(context):
    """RoPE (Su et al. 2021): the logit of identical content at offset j - i, psi(j - i)."""
    name, title = "rotary_profile", "RoPE: expected q_i . R_(j-i) q_j of identical content"
    matrix = pm.rotary_offset_matrix(context.model, context.seq_len)
    if matrix is None:
        return _not_applicable(context, name, title, "has no rotary position embedding")
    matrix = _numpy(matrix)
    forward, backward = _profiles(matrix)
    result = SectionResult(name, title)
    result.draw(context, name, "heatmap_with_profile", title,
                _with_profile(matrix, np.arange(len(matrix)), np.arange(len(forward)), forward, backward),
                signed=True, curves=["ψ(+m)", "ψ(-m)"], symbol="ψ",
                heatmap_title="ψ(j - i) = mean_k cos(θ_k (j - i))", xlabel="key position j",
                ylabel="query position i", profile_ylabel="ψ(m)")
    properties = property_metrics(matrix, context.window)
    result.metrics.update(properties=properties, psi_forward=forward.tolist())
    result.add_row("ψ(j - i)", properties)
    return result


def first_layer_position_correlation(context):
    """Wang et al. 2021 Fig. 7: (P W^Q_h)(P W^K_h)^T of the first layer for a PE added at the input."""
    correlation = pm.first_layer_position_correlation(context.model, context.seq_len)
    name = "first_layer_position_correlation"
    title = "first-layer (P W^Q)(P W^K)^T / sqrt(d_h) per head (Wang et al. 2021 Fig. 7)"
    if correlation is None:
        return _not_applicable(context, name, title, "adds no position vector at the input")
    result = SectionResult(name, title)
    matrices = _numpy(correlation)
    result.draw(context, name, "heads_heatmaps", title,
                {"matrices": matrices, "positions": np.arange(matrices.shape[-1])}, signed=True)
    _per_head_metrics(result, matrices, 0, context.window, "P Wq Wk^T P^T")
    return result


def absolute_position_dot_products(context):
    """Wang et al. 2021 Fig. 2 (top) and Fig. 6: <p_x, p_y> of the absolute table and its profile psi(m)."""
    name, title = "absolute_position_dot_products", \
        "dot products <p_x, p_y> of absolute positions (Wang et al. 2021 Fig. 2, 6)"
    found = pm.absolute_position_vectors(context.model, context.seq_len)
    if found is None:
        return _not_applicable(context, name, title, "has no absolute position table")
    kind, vectors = found
    first = _first_measured(context)
    vectors = _numpy(vectors)[first:]
    dots = vectors @ vectors.T
    forward, backward = _profiles(dots)
    offsets = np.arange(len(forward))
    label = "p = LayerNorm(P), TUPE's table" if kind == "untied" else f"{kind} APE"
    result = SectionResult(name, title)
    result.draw(context, name, "heatmap_with_profile", title,
                dict(_with_profile(dots, np.arange(first, first + len(dots)), offsets, forward, backward),
                     label=label),
                signed=True, curves=["ψ(+m) = mean_x <p_x, p_x+m>", "ψ(-m) = mean_x <p_x, p_x-m>"],
                heatmap_title="<p_x, p_y>", xlabel="position y", ylabel="position x",
                profile_ylabel="mean dot product")
    properties = property_metrics(dots, context.window)
    result.metrics.update(
        table=kind, positions_measured=[first, first + len(dots) - 1], properties=properties,
        psi_forward=forward.tolist(), psi_backward=backward.tolist(),
    )
    result.add_row(label, properties)
    return result


def relative_position_dot_products(context):
    """Wang et al. 2021 Fig. 2 (bottom): <a_r, a_s> of the Shaw table, r, s = -K..K, and a_0 . a_{±m}."""
    name, title = "relative_position_dot_products", \
        "dot products <a_r, a_s> of Shaw relative vectors (Wang et al. 2021 Fig. 2)"
    found = pm.relative_position_table(context.model)
    if found is None:
        return _not_applicable(context, name, title, "has no Shaw relative table")
    kind, table = found
    table = _numpy(table)
    reach = len(table) // 2
    dots = table @ table.T
    forward, backward = dots[reach, reach:], dots[reach, reach::-1]
    result = SectionResult(name, title)
    result.draw(context, name, "heatmap_with_profile", title,
                dict(_with_profile(dots, np.arange(-reach, reach + 1), np.arange(reach + 1), forward,
                                   backward), label=f"{kind} RPE"),
                signed=True, curves=["<a_0, a_+m>", "<a_0, a_-m>"], heatmap_title="<a_r, a_s>",
                profile_title="forward vs backward offsets", xlabel="relative position s",
                ylabel="relative position r", profile_xlabel="offset m",
                profile_ylabel="dot product with a_0")
    properties = property_metrics(dots, context.window)
    zero_offset_asymmetry = offset_asymmetry(forward[1:], backward[1:])
    result.metrics.update(
        table=kind, max_distance=reach, properties=properties,
        zero_offset_forward=forward.tolist(), zero_offset_backward=backward.tolist(),
        zero_offset_asymmetry=zero_offset_asymmetry,
    )
    result.add_row(f"{kind} RPE (asym: a_0 . a_±m)",
                   dict(properties, offset_asymmetry=zero_offset_asymmetry))
    return result


def identical_word_probing(context):
    """Wang et al. 2021 §3.1 (Eq. 5): first-layer attention of one repeated word, averaged over words and
    heads."""
    name, title = "identical_word_probing", \
        "identical-word probing: first-layer attention (Wang et al. 2021 §3.1)"
    probs = _numpy(pm.identical_word_attention(
        context.model, context.dictionary, context.seq_len, context.probe_samples, context.seed
    ))
    mean = probs.mean(0)
    first = _first_measured(context)
    measured = mean[first:, first:]
    forward, backward = _profiles(measured)
    result = SectionResult(name, title)
    result.draw(context, name, "heatmap_with_profile", f"{title}, {context.probe_samples} words",
                dict(_with_profile(mean, np.arange(len(mean)), np.arange(len(forward)), forward, backward),
                     measured_from=first, label=f"mean of {len(probs)} heads"),
                signed=False, curves=["ψ(+m) (keys after the query)", "ψ(-m) (keys before)"], symbol="p",
                heatmap_title="attention", xlabel="key position j", ylabel="query position i",
                profile_ylabel="mean attention probability")
    properties = property_metrics(measured, context.window)
    result.metrics.update(
        positions_measured=[first, len(mean) - 1], properties=properties,
        heads=[property_metrics(p[first:, first:], context.window) for p in probs],
        psi_forward=forward.tolist(), psi_backward=backward.tolist(),
    )
    result.add_row("attention (mean of heads)", properties)
    return result


FREQUENCY_TABLES = ("APE", "RPE", "RoPE")


def learned_frequencies(context):
    """Wang et al. 2021 A.5: learned frequencies of learnable sinusoids against their initial values."""
    name, title = "learned_frequencies", "learnable-sinusoidal frequencies (Wang et al. 2021 A.5)"
    found = pm.learnable_frequencies(context.model)
    if not found:
        return _not_applicable(context, name, title, "has no learnable-sinusoidal PE")
    result = SectionResult(name, title)
    shaw = pm.positional_encoder(context.model).positional_term.shaw
    entries = {}
    for module_name, (initial, learned) in found.items():
        initial, learned = _numpy(initial), _numpy(learned)
        label = ("APE" if module_name.startswith("embed_positions")
                 else "RoPE" if module_name.startswith("positional_term.rotary") else "RPE")
        # Shaw distances are clipped at K: the RPE's profile stops there.
        reach = min(context.seq_len, shaw.max_distance + 1) if label == "RPE" else context.seq_len
        offsets = np.arange(reach)
        psi_initial = np.cos(np.outer(offsets, initial)).sum(1)
        psi_learned = np.cos(np.outer(offsets, learned)).sum(1)
        entries[label] = (initial, learned, offsets, psi_initial, psi_learned)
        relative_change = np.abs(learned - initial) / np.abs(initial)
        result.metrics[label] = {
            "module": module_name,
            "initial": initial.tolist(),
            "learned": learned.tolist(),
            "mean_relative_change": float(relative_change.mean()),
            "max_relative_change": float(relative_change.max()),
            "decreasing_window_initial": strictly_decreasing_prefix(psi_initial),
            "decreasing_window_learned": strictly_decreasing_prefix(psi_learned),
        }
        for which in ("initial", "learned"):
            result.add_row(f"{label} frequencies, {which} (W* of Σcos)", {
                "decreasing_window_forward": result.metrics[label][f"decreasing_window_{which}"]
            })
    arrays = {f"{label}/{key}": value for label, entry in entries.items()
              for key, value in zip(("initial", "learned", "offsets", "psi_initial", "psi_learned"), entry)}
    result.draw(context, name, "learned_frequencies", title, arrays, names=list(FREQUENCY_TABLES))
    return result


POSITION_SECTIONS = (
    content_free_term,
    t5_bias,
    alibi_bias,
    distance_bias,
    disentangled_profiles,
    rotary_profile,
    first_layer_position_correlation,
    absolute_position_dot_products,
    relative_position_dot_products,
    identical_word_probing,
    learned_frequencies,
)
