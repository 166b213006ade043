"""Attention dropout whose mask is cheap on CPU and keeps dropout's distribution.

``torch.nn.functional.dropout`` on CPU draws one Bernoulli variable per element (``bernoulli_``); for
the (B, H, T, T) attention probabilities that draw costs several times their softmax (measured in
docs/benchmarks.md). Here every
element gets 16 uniform random bits instead, three elements from each 48-bit draw of the generator
(``torch.randint(0, 2**48)``, exact and uniform because the range is a power of two), and is kept when
its 16 bits are at least ``round(p * 2**16)``: the keep probability is exactly
``1 - round(p * 2**16) / 2**16``, within 2^-17 of 1 - p, and elements are independent because the
generator's bits are. The kept values are scaled by the inverse of that exact keep probability, so the
expectation is unchanged. The draws come from torch's default generator, which fairseq seeds every
update: runs and resumed runs draw the same masks. On other devices the mask is ``rand >= p``.
"""

import math

import torch

MASK_BITS = 16
ELEMENTS_PER_DRAW = 3  # 48 random bits per draw, 16 per element
CHUNK_DRAWS = 2**20  # draws at a time: 8 MiB of int64


def keep_probability(p, device_type="cpu"):
    """The exact probability that an element is kept (and the scale's inverse)."""
    if device_type == "cpu":
        return 1.0 - round(p * 2**MASK_BITS) / 2**MASK_BITS
    return 1.0 - p


def keep_mask(shape, p, device):
    """A boolean mask of ``shape``, True (kept) with probability :func:`keep_probability`. On CPU its bits
    are drawn CHUNK_DRAWS at a time, the same bits as one draw for the whole mask (each element of the draw
    takes the generator's next 64 bits), without its transient: 8 bytes a draw, 2.7 bytes an element of a
    (B, H, T, T) mask (180 MB at T = 4096, 4 heads, where the mask is 64 MB)."""
    device = torch.device(device)
    if device.type != "cpu":
        return torch.rand(shape, device=device) >= p
    count = math.prod(shape)
    draws = -(-count // ELEMENTS_PER_DRAW)
    mask = torch.empty(draws * ELEMENTS_PER_DRAW, dtype=torch.bool)
    threshold = round(p * 2**MASK_BITS) - 2 ** (MASK_BITS - 1)  # the lanes are signed int16
    for first in range(0, draws, CHUNK_DRAWS):
        chunk = min(CHUNK_DRAWS, draws - first)
        bits = torch.randint(0, 2 ** (MASK_BITS * ELEMENTS_PER_DRAW), (chunk,), dtype=torch.int64)
        lanes = bits.view(torch.int16).view(chunk, 64 // MASK_BITS)[:, :ELEMENTS_PER_DRAW]
        elements = slice(first * ELEMENTS_PER_DRAW, (first + chunk) * ELEMENTS_PER_DRAW)
        torch.ge(lanes, threshold, out=mask[elements].view(chunk, ELEMENTS_PER_DRAW))
    return mask[:count].view(shape)
