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


def keep_probability(p, device_type="cpu"):
    """The exact probability that an element is kept (and the scale's inverse)."""
    if device_type == "cpu":
        return 1.0 - round(p * 2**MASK_BITS) / 2**MASK_BITS
    return 1.0 - p


def keep_mask(shape, p, device):
    """A boolean mask of ``shape``, True (kept) with probability :func:`keep_probability`."""
    device = torch.device(device)
    if device.type != "cpu":
        return torch.rand(shape, device=device) >= p
    count = math.prod(shape)
    draws = -(-count // ELEMENTS_PER_DRAW)
    bits = torch.randint(0, 2 ** (MASK_BITS * ELEMENTS_PER_DRAW), (draws,), dtype=torch.int64)
    lanes = bits.view(torch.int16).view(draws, 64 // MASK_BITS)[:, :ELEMENTS_PER_DRAW]
    threshold = round(p * 2**MASK_BITS) - 2 ** (MASK_BITS - 1)  # the lanes are signed int16
    return (lanes >= threshold).flatten()[:count].view(shape)
