"""The Triton kernel of :mod:`.triton_rotary` (its docstring says what it computes); imported only where it
runs, so that CPU installs never need Triton."""

import triton
import triton.language as tl


@triton.jit
def rotate_kernel(X, Out, Cos, Sin, sx_b, sx_t, so_b, so_t, sc_t, ss_t, seq_len, heads, head_dim,
                  INVERSE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    """One block of positions of one batch row, one part of the projection (0: q, 1: k, 2: v), every head:
    each pair (x_2k, x_2k+1) of a q or k head at position t turned by the angle theta_k t of the tables (by
    -theta_k t with ``INVERSE``), in float32; v copied as it is (the rotation by 0)."""
    row_block, b, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = row_block * BLOCK_T + tl.arange(0, BLOCK_T)
    pairs = tl.arange(0, BLOCK_K)
    # v's part reads no table entry: cos 1, sin 0
    table_ok = (rows < seq_len)[:, None] & (pairs < tl.where(part < 2, head_dim // 2, 0))[None, :]
    cos = tl.load(Cos + rows[:, None] * sc_t + pairs[None, :], mask=table_ok, other=1.0).to(tl.float32)
    sin = tl.load(Sin + rows[:, None] * ss_t + pairs[None, :], mask=table_ok, other=0.0).to(tl.float32)
    if INVERSE:
        sin = -sin
    dims = tl.arange(0, 2 * BLOCK_K)
    tile_ok = (rows < seq_len)[:, None] & (dims < head_dim)[None, :]
    within = part * heads * head_dim + dims[None, :]
    x_tile = X + b * sx_b + rows[:, None] * sx_t + within
    out_tile = Out + b * so_b + rows[:, None] * so_t + within
    for h in range(heads):
        # a head's (positions, d_h) tile read whole, split into its pairs' even and odd members
        x = tl.load(x_tile + h * head_dim, mask=tile_ok, other=0.0).to(tl.float32)
        even, odd = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_K, 2)))
        turned = tl.join(even * cos - odd * sin, even * sin + odd * cos)
        tl.store(out_tile + h * head_dim, tl.reshape(turned, (BLOCK_T, 2 * BLOCK_K)).to(Out.dtype.element_ty),
                 mask=tile_ok)
