"""The position-encoding properties of Wang et al. 2021 §2 (Eq. 1-3), measured on a proximity matrix.

A[x, y] is the proximity phi(x, y) of positions x and y (a dot product, an attention logit or an
attention probability). Every function here is a pure function of A (anything ``numpy.asarray``
takes); docs/analysis.md defines each number with its formula.
"""

import numpy as np


def as_matrix(matrix):
    """A square float64 array, or a clear error."""
    a = np.asarray(matrix, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 2:
        raise ValueError(f"a proximity matrix must be square and at least 2 x 2, got shape {a.shape}")
    return a


def diagonal(a, offset):
    """A[x, x + offset] for every x with both positions in range."""
    return np.diagonal(a, offset)


def offset_profile(matrix, offsets):
    """psi(m) = mean_x A[x, x + m] for each m of ``offsets`` (Wang et al. 2021 Fig. 6)."""
    a = as_matrix(matrix)
    size = a.shape[0]
    for m in offsets:
        if abs(m) >= size:
            raise ValueError(f"offset {m} is out of range for a {size} x {size} matrix")
    return np.array([diagonal(a, m).mean() for m in offsets])


def translation_invariance_violation(matrix, max_offset=None):
    """mean over m of std_x A[x, x+m], divided by std(A); 0 = perfectly translation invariant.

    m runs over the offsets whose diagonal holds at least two entries, |m| <= ``max_offset``
    when given. A constant matrix counts as invariant (0).
    """
    a = as_matrix(matrix)
    largest = a.shape[0] - 2
    limit = largest if max_offset is None else min(max_offset, largest)
    spread = a.std()
    if spread == 0:
        return 0.0
    per_offset = [diagonal(a, m).std() for m in range(-limit, limit + 1)]
    return float(np.mean(per_offset) / spread)


def monotonicity_fraction(matrix, window, direction="forward"):
    """Fraction of (x, n, m), 0 <= n < m <= window, with A[x, x±n] > A[x, x±m] (+ forward, - backward).

    Only triples whose positions x±m lie in the matrix count; 1 = monotone within the window.
    """
    a = as_matrix(matrix)
    sign = _sign(direction)
    window = min(window, a.shape[0] - 1)
    if window < 1:
        raise ValueError(f"the monotonicity window must be >= 1, got {window}")
    decreasing = total = 0
    for m in range(1, window + 1):
        far = diagonal(a, sign * m)
        for n in range(m):
            near = diagonal(a, sign * n)
            # x runs over the len(far) positions with x ± m in range: the first ones for
            # forward offsets, the last ones for backward offsets.
            near = near[: len(far)] if sign > 0 else near[len(near) - len(far):]
            decreasing += int((near > far).sum())
            total += len(far)
    return decreasing / total


def decreasing_window(matrix, direction="forward"):
    """W*: the largest W with psi(0) > psi(±1) > ... > psi(±W); 0 when psi(±1) >= psi(0)."""
    a = as_matrix(matrix)
    sign = _sign(direction)
    psi = offset_profile(a, [sign * m for m in range(a.shape[0])])
    return strictly_decreasing_prefix(psi)


def strictly_decreasing_prefix(values):
    """The largest W with values[0] > values[1] > ... > values[W]."""
    values = np.asarray(values, dtype=np.float64)
    steps = values[1:] < values[:-1]
    return int(len(steps) if steps.all() else np.argmin(steps))


def symmetry_violation(matrix):
    """||A - A^T||_F / ||A||_F; 0 = symmetric (0 for the zero matrix)."""
    a = as_matrix(matrix)
    norm = np.linalg.norm(a)
    return float(np.linalg.norm(a - a.T) / norm) if norm else 0.0


def offset_asymmetry(profile_forward, profile_backward):
    """||psi(+m) - psi(-m)|| / ||(psi(+m), psi(-m))|| over m = 1..M; 0 = forward looks like backward."""
    forward = np.asarray(profile_forward, dtype=np.float64)
    backward = np.asarray(profile_backward, dtype=np.float64)
    if forward.shape != backward.shape:
        raise ValueError(
            f"forward and backward profiles differ in length: {forward.shape} vs {backward.shape}"
        )
    norm = np.sqrt(np.sum(forward ** 2) + np.sum(backward ** 2))
    return float(np.linalg.norm(forward - backward) / norm) if norm else 0.0


def property_metrics(matrix, window):
    """All the properties of one matrix, as a JSON-ready dict (see docs/analysis.md)."""
    a = as_matrix(matrix)
    reach = a.shape[0] - 1
    return {
        "size": a.shape[0],
        "translation_invariance_violation": translation_invariance_violation(a),
        "monotonicity_window": min(window, reach),
        "monotonicity_forward": monotonicity_fraction(a, window, "forward"),
        "monotonicity_backward": monotonicity_fraction(a, window, "backward"),
        "decreasing_window_forward": decreasing_window(a, "forward"),
        "decreasing_window_backward": decreasing_window(a, "backward"),
        "symmetry_violation": symmetry_violation(a),
        "offset_asymmetry": offset_asymmetry(
            offset_profile(a, range(1, reach + 1)), offset_profile(a, range(-1, -reach - 1, -1))
        ),
    }


def _sign(direction):
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
    return 1 if direction == "forward" else -1
