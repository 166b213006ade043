#!/usr/bin/env python3
"""The attention paths alone, side by side: the measurement behind ``choose_path``'s choice.

For each sequence length, one layer's attention (forward and backward, a learned (1, H, T, T) bias
as TUPE-R's T5 term) runs on each CPU path of ``tupe_plugin.attention``:
``biased-flash`` (flash forward, recomputing backward), ``explicit`` (matmul-softmax-matmul over
whole tensors, keeping the probabilities) and ``chunked`` (the same by cache-sized chunks), beside
``sdpa`` without a bias (what BERT-A runs: the floor). With ``--attention-dropout P`` the paths that
take dropout on CPU run: ``explicit`` and ``chunked`` with the bias, beside ``chunked-no-bias``
(BERT-A's call then: the floor). Paths alternate within every round; each figure is the median over
rounds with the spread (min-max), as CPU time of this process (robust to other processes on a shared
machine) and as wall time; "/ floor" is the median of the ratios paired within each round. The memory
column is what a path keeps between forward and backward beyond q, k, v and the output.

With ``--device cuda`` (bf16 by default) the GPU kernels run instead, timed by wall clock around a
synchronised call: ``sdpa`` without a bias (BERT-A: the floor), ``sdpa-fixed-bias`` (a bias without
gradient: ALiBi, Sandwich), ``sdpa-bias`` (the learned bias on the kernels the plugin allows it,
:func:`~tupe_plugin.attention.paths.sdpa_backends`), ``triton-bias`` (the plugin's Triton kernel with its
batch-summed bias gradient, ``--attention-backend triton``), ``cudnn-graph-bias`` (cuDNN's fused attention
built by the cuDNN frontend, with dBias, ``--attention-backend cudnn-graph``; left out, with a note, where
``nvidia-cudnn-frontend`` is not installed, and needs ``--dtype`` bfloat16 or float16) and, without
dropout, ``flex-bias``:
PyTorch's FlexAttention (compiled) with the learned bias read as a captured buffer and its gradient
from the compiled backward, as ``--attention-backend flex`` runs it
(:mod:`tupe_plugin.attention.flex_bias_attention`). Two RoPE candidates
rotate q and k of a (B T, 3 H d_h) projection before ``sdpa`` (the projection a copy of one leaf per
call, the same in both, so that each call rotates unrotated numbers): ``sdpa-rope`` by torch's
elementwise rotation (the plugin's CPU path), ``sdpa-rope-triton`` by the fused Triton kernel the plan
runs on CUDA (:mod:`tupe_plugin.attention.triton_rotary`). The terms that depend
on the content run twice each: ``sdpa-shaw`` (Shaw keys, K = 64, as ``--attention-backend auto`` runs them:
q's products with the 2K + 1 rows gathered into a (B, H, T, T) mask for the memory-efficient kernel) beside
``triton-shaw`` (the table rows read by offset inside the Triton kernel, which multiplies them by q per
tile, ``--attention-backend triton``), ``explicit-shaw-values`` (Shaw keys and value vectors from one
table, as ``--attention-backend auto`` runs them: the keys' products gathered into the mask of the explicit
path, which keeps the probabilities for the value term) beside ``triton-shaw-values`` (keys read by
offset, the value term from the kernel's sums of the probabilities by clipped distance), and
``sdpa-deberta`` / ``triton-deberta`` for DeBERTa's c2p and p2c (the released 512-row span: every table
row a length reaches, as the plugin's layers project them; the Triton kernel multiplies q and k by them
per tile); without dropout, ``flex-shaw`` and ``flex-deberta`` read the products of q (and k) with the
rows by offset in FlexAttention's score_mod (``--attention-backend flex``). A learned bias of the offset
alone (T5's buckets, KERPLE, FIRE) with TUPE's [CLS] reset runs in its O(T) form: its Toeplitz rows
(H, 2T - 1) and two [CLS] values per head, float32 leaves with gradients, ``sdpa-distance`` expanded to a
(1, H, T, T) bias for SDPA (its gradient scattered back into the rows by autograd) beside
``triton-distance`` (the kernel reads the rows per tile and sums their gradient by offset),
``triton-bias-distance`` (the same beside the learned (1, H, T, T) bias: TUPE-R's untied product and T5
term, against ``triton-bias``) and, without dropout, ``flex-distance`` (the rows read by j - i in the
score_mod).

    python benchmarks/benchmark_attention.py --seq-lens 64 128 256 512 --tokens 1024 --rounds 9
    python benchmarks/benchmark_attention.py --seq-lens 128 512 --tokens 2048 --attention-dropout 0.1
    python benchmarks/benchmark_attention.py --device cuda --seq-lens 128 512 --tokens 32768 --heads 12

``--json`` gets the run in the format of ``benchmarks/results_file.py``; ``--results-dir
benchmarks/results`` keeps it there too, for ``benchmarks/report.py``.
"""

import argparse
import os
import statistics
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from benchmarks import paired, results_file  # noqa: E402
from tupe_plugin.attention.attend import attend  # noqa: E402
from tupe_plugin.attention.clipped_distances import ClippedDistanceScores  # noqa: E402
from tupe_plugin.attention.paths import (AttentionPath, cudnn_frontend_installed,  # noqa: E402
                                         sdpa_backends)
from tupe_plugin.attention.toeplitz_scores import offset_scores_with_transposed  # noqa: E402
from tupe_plugin.attention.relative_terms import RelativeRows, offsets_of  # noqa: E402
from tupe_plugin.attention.triton_rotary import rotate_projection  # noqa: E402
from tupe_plugin.encoder.self_attention import split_heads  # noqa: E402
from tupe_plugin.encodings.deberta_position import DisentangledRelativeTable  # noqa: E402
from tupe_plugin.encodings.offset_bias import toeplitz  # noqa: E402
from tupe_plugin.encodings.position_config import PositionConfig  # noqa: E402
from tupe_plugin.encodings.rotary_position import RotaryPosition, rotate_in_place  # noqa: E402
from tupe_plugin.encodings.shaw_position import clipped_index  # noqa: E402

PATHS = ("sdpa", "biased-flash", "explicit", "chunked")
DROPOUT_PATHS = ("chunked-no-bias", "explicit", "chunked")
ROPE_PATHS = ("sdpa-rope", "sdpa-rope-triton")
RELATIVE_PATHS = ("sdpa-shaw", "triton-shaw", "flex-shaw", "explicit-shaw-values", "triton-shaw-values",
                  "sdpa-deberta", "triton-deberta", "flex-deberta")
DISTANCE_PATHS = ("sdpa-distance", "triton-distance", "triton-bias-distance", "flex-distance")
CUDNN_GRAPH_PATH = "cudnn-graph-bias"
CUDA_PATHS = ("sdpa", "sdpa-fixed-bias", "sdpa-bias", "triton-bias", CUDNN_GRAPH_PATH, "flex-bias",
              *ROPE_PATHS, *RELATIVE_PATHS, *DISTANCE_PATHS)
# FlexAttention has no attention dropout
FLEX_PATHS = ("flex-bias", "flex-shaw", "flex-deberta", "flex-distance")
CUDA_DROPOUT_PATHS = tuple(path for path in CUDA_PATHS if path not in FLEX_PATHS)
SHAW_MAX_DISTANCE = 64
DEBERTA_SPAN = 512
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[64, 128, 256, 512], metavar="T")
    parser.add_argument("--tokens", type=int, default=1024, help="B x T of every shape (B = tokens / T)")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=3,
                        help="timed forward+backward calls per path per round")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--attention-dropout", type=float, default=0.0, metavar="P",
                        help=f"above 0: time {', '.join(DROPOUT_PATHS)} with this dropout")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("auto", *DTYPES), default="auto",
                        help="of q, k, v and the bias (auto: float32 on CPU, bfloat16 on CUDA)")
    parser.add_argument("--json", default="benchmark_attention.json", help="where to write the results")
    parser.add_argument("--results-dir", metavar="DIR",
                        help="also keep the run in DIR as benchmark_attention-DATE-SETTING.json "
                        "(benchmarks/results: the files benchmarks/report.py makes the docs' tables from)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    if args.dtype == "auto":
        args.dtype = "float32" if args.device == "cpu" else "bfloat16"
    for name in ("tokens", "heads", "head_dim", "rounds", "calls", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.attention_dropout < 1:
        parser.error(f"--attention-dropout must lie in [0, 1), got {args.attention_dropout}")
    too_long = [t for t in args.seq_lens if t < 1 or t > args.tokens]
    if too_long:
        parser.error(f"--seq-lens {too_long} must lie between 1 and --tokens {args.tokens}")
    return args


def inputs(batch, heads, seq_len, head_dim, seed=0, device="cpu", dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)

    def tensor(*shape):
        return torch.randn(*shape, generator=generator).to(device, dtype)

    q, k, v = (tensor(batch, heads, seq_len, head_dim).requires_grad_() for _ in range(3))
    bias = tensor(1, heads, seq_len, seq_len).requires_grad_()
    grad_out = tensor(batch, heads, seq_len, head_dim)
    return q, k, v, bias, grad_out


def relative_inputs(heads, seq_len, head_dim, device, dtype, seed=1):
    """The tables of the terms read by offset, with gradients, and their indices: ``shaw`` (the (2K + 1, d)
    table, its (T, T) index), ``deberta`` (Q^r and K^r (H, R, d) over the rows a length reaches, the c2p
    offsets, the p2c ones) and ``distance`` (a distance bias's Toeplitz rows (H, 2T - 1) and
    [CLS] values (H, 2), float32 as the shared term holds them)."""
    generator = torch.Generator().manual_seed(seed)

    def table(*shape):
        return (0.1 * torch.randn(*shape, generator=generator)).to(device, dtype).requires_grad_()

    shaw_index = clipped_index(seq_len, SHAW_MAX_DISTANCE, device)
    deberta = DisentangledRelativeTable(8, DEBERTA_SPAN)
    _, rows, _, offsets = deberta.rows_and_index(seq_len)
    offsets = offsets.to(device)
    distance = tuple(torch.randn(heads, width, generator=generator).to(device).requires_grad_()
                     for width in (2 * seq_len - 1, 2))
    return {"shaw": (table(2 * SHAW_MAX_DISTANCE + 1, head_dim), shaw_index),
            "deberta": (table(heads, rows, head_dim), table(heads, rows, head_dim), offsets, offsets.flip(0)),
            "distance": distance}


def relative_attention(path, q, k, v, scale, dropout, relative):
    """One layer's attention of Shaw keys (and values, ``-shaw-values``) or DeBERTa (``relative``:
    :func:`relative_inputs`) on the SDPA or explicit path, the terms gathered into the mask as the layer does
    on ``--attention-backend auto``, or on the Triton kernel or FlexAttention, reading the table rows by
    offset (the kernel multiplies them by q and k per tile, FlexAttention reads their products)."""
    backends = sdpa_backends(q.device, LEARNED_BIAS)
    kernel = AttentionPath.TRITON if path.startswith("triton") else AttentionPath.FLEX
    if "-shaw" in path:
        table, index = relative["shaw"]
        values = table if path.endswith("-values") else None
        if path == "explicit-shaw-values":
            mask = ClippedDistanceScores.apply(torch.matmul(q * scale, table.t()), index)
            return attend(AttentionPath.EXPLICIT, q, k, v, mask, scale, dropout, values, index)[0]
        if path.startswith("sdpa"):
            mask = ClippedDistanceScores.apply(torch.matmul(q * scale, table.t()), index)
            return attend(AttentionPath.SDPA, q, k, v, mask, scale, dropout, backends=backends)[0]
        offsets = offsets_of(index)
        return attend(kernel, q, k, v, None, scale, dropout, values, index,
                      relative=RelativeRows(table[None], offsets), value_offsets=offsets)[0]
    query_rows, key_rows, offsets, p2c_offsets = relative["deberta"]
    if path.startswith("sdpa"):
        mask = offset_scores_with_transposed(q * scale, key_rows, offsets, k * scale, query_rows, p2c_offsets)
        return attend(AttentionPath.SDPA, q, k, v, mask, scale, dropout, backends=backends)[0]
    relative = RelativeRows(key_rows, offsets, query_rows, p2c_offsets.flip(0))
    return attend(kernel, q, k, v, None, scale, dropout, relative=relative)[0]


def distance_attention(path, q, k, v, bias, scale, dropout, relative):
    """One layer's attention of a distance bias (``relative["distance"]``: its rows and [CLS] values):
    expanded for SDPA's kernels that take a learned bias (as ``PositionalTerm.expanded`` does), or read by
    offset on the Triton kernel (beside ``bias`` for ``triton-bias-distance``) and FlexAttention, each kernel
    handed the rows and values as the layers hand them on ``--attention-backend triton`` and ``flex``."""
    rows, cls = relative["distance"]
    if path == "sdpa-distance":
        mask = toeplitz(rows, cls)[None].to(q.dtype)
        return attend(AttentionPath.SDPA, q, k, v, mask, scale, dropout,
                      backends=sdpa_backends(q.device, LEARNED_BIAS))[0]
    kernel = AttentionPath.FLEX if path == "flex-distance" else AttentionPath.TRITON
    dense = bias if path == "triton-bias-distance" else None
    return attend(kernel, q, k, v, dense, scale, dropout, offset_rows=rows, offset_cls=cls)[0]


def candidates(args):
    """Every path of a run of ``args`` (device and attention dropout), the floor first."""
    if args.device == "cuda":
        return CUDA_DROPOUT_PATHS if args.attention_dropout > 0 else CUDA_PATHS
    return DROPOUT_PATHS if args.attention_dropout > 0 else PATHS


def paths(args):
    """The candidates this machine can run (the cuDNN graph needs its frontend and half precision)."""
    names = candidates(args)
    return names if cudnn_graph_runs(args) else tuple(name for name in names if name != CUDNN_GRAPH_PATH)


def cudnn_graph_runs(args):
    """Whether the cuDNN graph candidate can run: the frontend installed and half-precision inputs."""
    return cudnn_frontend_installed() and args.dtype != "float32"


def cudnn_graph_note(args):
    """Why the cuDNN graph candidate is left out of a CUDA run, or None."""
    if args.device != "cuda" or cudnn_graph_runs(args):
        return None
    if not cudnn_frontend_installed():
        return (f"{CUDNN_GRAPH_PATH} left out: the cuDNN frontend is not installed (pip install "
                "nvidia-cudnn-frontend)")
    return f"{CUDNN_GRAPH_PATH} left out: cuDNN's fused attention runs in bfloat16 or float16, not float32"


def rope_inputs(q):
    """A (B T, 3 H d_h) projection leaf like q's, and RoPE's fixed cos/sin tables (T, d_h / 2)."""
    batch, heads, seq_len, head_dim = q.shape
    rows = torch.randn(batch * seq_len, 3 * heads * head_dim, device=q.device, dtype=q.dtype)
    return rows.requires_grad_(), *RotaryPosition(head_dim).to(q.device)(seq_len)


def rotated_heads(path, rows, cos, sin, heads):
    """q, k, v (B, H, T, d_h) of a copy of ``rows`` with q and k rotated on ``path``'s rotation."""
    batch, seq_len = rows.size(0) // cos.size(0), cos.size(0)
    projection = rows.clone()
    if path == "sdpa-rope-triton":
        projection = rotate_projection(projection, cos, sin, heads).view(batch, seq_len, 3, heads, -1)
    else:
        projection = projection.view(batch, seq_len, 3, heads, -1)
        rotate_in_place(projection[:, :, :2], cos, sin)
    return split_heads(projection)
# the kernels the plugin allows a learned bias (sdpa_backends reads no more of the config than that)
LEARNED_BIAS = PositionConfig(embed_dim=8, num_heads=2, max_positions=8, rel_pos="t5")


def forward_backward(path, q, k, v, bias, grad_out, dropout=0.0, rope=None, relative=None):
    """One layer's attention on ``path``, forward and backward (``sdpa``, ``chunked-no-bias``: no bias,
    BERT-A's call; ``triton-bias``: the plugin's Triton kernel; ``cudnn-graph-bias``: cuDNN's fused
    attention through the frontend; ``flex-bias``: FlexAttention as ``--attention-backend flex`` runs it;
    the RoPE paths: q, k, v of ``rope`` from :func:`rope_inputs`; the Shaw and DeBERTa paths:
    :func:`relative_attention` of ``relative``; the distance paths: :func:`distance_attention`); returns the
    output."""
    scale = q.size(-1) ** -0.5
    if path in ROPE_PATHS:
        out, _ = attend(AttentionPath.SDPA, *rotated_heads(path, *rope, q.size(1)), None, scale, dropout)
    elif path in RELATIVE_PATHS:
        out = relative_attention(path, q, k, v, scale, dropout, relative)
    elif path in DISTANCE_PATHS:
        out = distance_attention(path, q, k, v, bias, scale, dropout, relative)
    elif path == "sdpa":
        out, _ = attend(AttentionPath.SDPA, q, k, v, None, scale, dropout)
    elif path == "chunked-no-bias":
        out, _ = attend(AttentionPath.CHUNKED, q, k, v, None, scale, dropout)
    elif path == "sdpa-fixed-bias":
        out, _ = attend(AttentionPath.SDPA, q, k, v, bias.detach(), scale, dropout)
    elif path == "sdpa-bias":
        out, _ = attend(AttentionPath.SDPA, q, k, v, bias, scale, dropout,
                        backends=sdpa_backends(q.device, LEARNED_BIAS))
    elif path == "triton-bias":
        out, _ = attend(AttentionPath.TRITON, q, k, v, bias, scale, dropout)
    elif path == "flex-bias":
        out, _ = attend(AttentionPath.FLEX, q, k, v, bias, scale, dropout)
    elif path == CUDNN_GRAPH_PATH:
        out, _ = attend(AttentionPath.CUDNN_GRAPH, q, k, v, bias, scale, dropout)
    else:
        out, _ = attend(AttentionPath(path), q, k, v, bias, scale, dropout)
    out.backward(grad_out)
    return out


def kept_bytes(path, batch, heads, seq_len, dropout=0.0):
    """Bytes a path keeps from forward to backward beyond q, k, v and the output (float32)."""
    logits = batch * heads * seq_len * seq_len
    if path.startswith("explicit"):  # the probabilities; with dropout the dropped ones and the keep-mask too
        return 4 * logits + (5 * logits if dropout else 0)
    if path.startswith("chunked"):  # the probabilities, and the keep-mask (a byte each) with dropout
        return 4 * logits + (logits if dropout else 0)
    lse = 4 * batch * heads * seq_len
    if path.startswith("sdpa-") and path in RELATIVE_PATHS:  # the gathered (B, H, T, T) mask SDPA keeps
        return 4 * logits + lse
    if path == "sdpa-distance":  # the expanded (1, H, T, T) bias SDPA keeps
        return 4 * heads * seq_len * seq_len + lse
    # FlexAttention: q's products with the 2K + 1 rows; the Triton kernel: the probabilities' sums by clipped
    # distance for the value term (the keys' term it forms from the table rows, inputs)
    if path in ("flex-shaw", "triton-shaw-values"):
        return 4 * batch * heads * seq_len * (2 * SHAW_MAX_DISTANCE + 1) + lse
    if path == "flex-deberta":  # q's and k's products with the rows the length reaches
        return 8 * batch * heads * seq_len * min(2 * seq_len - 1, 2 * DEBERTA_SPAN) + lse
    # sdpa, biased-flash, the CUDA kernels (triton-shaw, triton-deberta: the table rows, inputs; the distance
    # paths on the kernels: its Toeplitz rows, inputs): the rows' log-sum-exp, from which the backward
    # recomputes P
    return lse


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def measure(args):
    shapes = []
    for seq_len in args.seq_lens:
        batch = max(1, args.tokens // seq_len)
        tensors = inputs(batch, args.heads, seq_len, args.head_dim, device=args.device,
                         dtype=DTYPES[args.dtype])
        names = paths(args)
        rope = rope_inputs(tensors[0]) if ROPE_PATHS[0] in names else None
        relative = relative_inputs(args.heads, seq_len, args.head_dim, args.device, DTYPES[args.dtype]) \
            if args.device == "cuda" else None
        failed = {}
        for path in names:
            # warm-up (FlexAttention and Triton compile); a candidate that fails is left out, the floor not
            try:
                forward_backward(path, *tensors, args.attention_dropout, rope, relative)
            except Exception as error:  # noqa: BLE001 - any failure of a candidate kernel is reported
                if path == names[0]:
                    raise
                failed[path] = f"{type(error).__name__}: {error}"
                print(f"T = {seq_len}: {path} left out: {failed[path]}", file=sys.stderr, flush=True)
        names = [path for path in names if path not in failed]
        cpu = {path: [] for path in names}
        wall = {path: [] for path in names}
        for round_index in range(args.rounds):
            order = names[round_index % len(names):] + names[:round_index % len(names)]
            for path in order:
                for _ in range(args.calls):
                    synchronize(args.device)
                    cpu_start, wall_start = time.process_time(), time.perf_counter()
                    forward_backward(path, *tensors, args.attention_dropout, rope, relative)
                    synchronize(args.device)
                    cpu[path].append(time.process_time() - cpu_start)
                    wall[path].append(time.perf_counter() - wall_start)
        shapes.append({"seq_len": seq_len, "batch": batch, "cpu_seconds": cpu, "wall_seconds": wall,
                       "kept_bytes": {p: kept_bytes(p, batch, args.heads, seq_len, args.attention_dropout)
                                      for p in names}, "failed": failed})
        print(f"T = {seq_len} done", file=sys.stderr, flush=True)
    return shapes


def spread(values):
    return f"{statistics.median(values) * 1e3:.1f} [{min(values) * 1e3:.1f}–{max(values) * 1e3:.1f}]"


def table(args, shapes):
    floor = paths(args)[0]
    timed = clock(args)
    clock_name = "wall" if args.device == "cuda" else "CPU"
    where = (torch.cuda.get_device_name() if args.device == "cuda" else f"{args.threads} threads")
    lines = [f"H = {args.heads}, d_h = {args.head_dim}, {args.tokens} tokens a batch, "
             f"attention dropout {args.attention_dropout}, {args.dtype}, "
             f"{where}, {args.rounds} rounds x {args.calls} calls",
             "",
             "| T | B | path | CPU ms (median [min–max]) | wall ms (median [min–max]) | "
             f"{clock_name} / {floor} (paired) | kept (MiB) |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for shape in shapes:
        for path in shape["wall_seconds"]:
            cpu = shape["cpu_seconds"][path]
            ratio = paired.summary(paired.ratios(shape[timed][path], shape[timed][floor]))
            lines.append(f"| {shape['seq_len']} | {shape['batch']} | {path} | {spread(cpu)} | "
                         f"{spread(shape['wall_seconds'][path])} | {paired.cell(ratio)} | "
                         f"{shape['kept_bytes'][path] / 2**20:.2f} |")
    failures = [f"- T = {shape['seq_len']}: {path} left out: {error}" for shape in shapes
                for path, error in shape["failed"].items()]
    return "\n".join(lines + ([""] + failures if failures else []))


def clock(args):
    """The timings the ratios divide: wall time on a GPU (where the process's CPU time is the host
    waiting on the device), CPU time on CPU."""
    return "wall_seconds" if args.device == "cuda" else "cpu_seconds"


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    note = cudnn_graph_note(args)
    if note:
        print(note, file=sys.stderr)
    run = results_file.record("benchmark_attention", __file__, argv, vars(args), args.device)
    shapes = measure(args)
    report = table(args, shapes)
    print(report)
    run["machine"]["load_average_after"] = os.getloadavg()
    run["rounds"] = [results_file.repetitions(f"T={shape['seq_len']} B={shape['batch']}",
                                              f"{clock(args).replace('_', ' ')} per call", paths(args)[0],
                                              shape[clock(args)]) for shape in shapes]
    run.update({"shapes": shapes, "table": report})
    results_file.write(run, args.json)
    if args.results_dir:
        path = results_file.save(run, args.results_dir, setting_tag(args))
        print(f"run kept as {path}", file=sys.stderr)


def setting_tag(args):
    """``cpu-float32-ad0.0-tokens1024-T64-128-256-512``: device, dtype, attention dropout, tokens, lengths."""
    lengths = "-".join(map(str, args.seq_lens))
    return f"{args.device}-{args.dtype}-ad{args.attention_dropout}-tokens{args.tokens}-T{lengths}"


if __name__ == "__main__":
    main()
