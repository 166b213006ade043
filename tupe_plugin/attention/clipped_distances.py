"""Scores and sums by clipped distance, the kernels of Shaw vectors' key and value terms.

Shaw-style relative vectors (Shaw, Uszkoreit, Vaswani, arXiv 1803.02155; Wang et al., "On Position
Embeddings in BERT", ICLR 2021, Eq. 4) pair query i and key j through r = clip(j - i, -K, K). The key term
gathers each query's 2K + 1 scores q_i . a_r into (T, T); the value term, and the gather's gradient, sum a
row's T entries into the 2K + 1 distances. A scatter-add does that sum in one pass, and on a CPU it is the
fastest way (2-3 x the band sums below at B = 4, H = 8, T = 512, K = 64). On a GPU every key beyond
distance K lands on one of its row's two end distances, which a CUDA scatter adds atomically one after
another: on an H100 the key gather's backward was 76 % of a Shaw-keys training step. There the sums are
taken as a gather within the band, where the map is one to one, and two masked row sums beyond it.
"""

import torch


def distance_sums(x, index, max_distance):
    """``out[..., i, r] = sum_j x[..., i, j]`` over the keys j with ``clip(j - i, -K, K) = r - K``, for
    ``x`` (..., T, T), K = ``max_distance`` and ``index`` its (T, T) index of clipped distances
    ``clip(j - i, -K, K) + K`` (the one the forward built): (..., T, 2K + 1) in float32 (float64 kept). A
    scatter-add on CPU, :func:`band_distance_sums` elsewhere (see the module docstring)."""
    if x.device.type == "cpu":
        return scattered_distance_sums(x, index, max_distance)
    return band_distance_sums(x, max_distance)


def scattered_distance_sums(x, index, max_distance):
    """:func:`distance_sums` by one scatter-add of every key onto its distance ``index``."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    sums = torch.zeros(*x.shape[:-1], 2 * max_distance + 1, dtype=dtype, device=x.device)
    return sums.scatter_add_(-1, index.expand(x.shape), x.to(dtype))


def band_distance_sums(x, max_distance):
    """:func:`distance_sums` without a scatter: key i + r - K of query i gathered for the 2K + 1
    distances r, and the keys beyond distance K summed onto the two ends by masked row sums."""
    seq_len = x.size(-1)
    dtype = torch.promote_types(x.dtype, torch.float32)
    queries = torch.arange(seq_len, device=x.device)[:, None]
    keys = queries + torch.arange(-max_distance, max_distance + 1, device=x.device)
    outside = (keys < 0) | (keys >= seq_len)
    band = x.gather(-1, keys.clamp(0, seq_len - 1).expand(*x.shape[:-1], -1))
    sums = band.to(dtype).masked_fill_(outside, 0)
    key_positions = queries.t()
    before, after = key_positions < queries - max_distance, key_positions > queries + max_distance
    sums[..., 0] += torch.where(before, x, 0).sum(-1, dtype=dtype)
    sums[..., -1] += torch.where(after, x, 0).sum(-1, dtype=dtype)
    return sums


class ClippedDistanceScores(torch.autograd.Function):
    """``S[..., i, j] = x[..., i, index[i, j]]`` for ``x`` (..., T, 2K + 1) and the (T, T) index of
    clipped distances (:func:`~tupe_plugin.encodings.shaw_position.clipped_index`); the gradient by
    :func:`distance_sums` (on a GPU without the gather's scatter-add)."""

    @staticmethod
    def forward(ctx, x, index):
        ctx.save_for_backward(index)
        ctx.max_distance = (x.size(-1) - 1) // 2
        return x.gather(-1, index.expand(*x.shape[:-1], -1))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return distance_sums(grad, index, ctx.max_distance).to(grad.dtype), None
