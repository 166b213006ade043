"""Flash attention with a learned bias shared by the batch on cuDNN's fused attention, built as a graph by the
cuDNN frontend's Python API (``pip install nvidia-cudnn-frontend``, ``import cudnn``; imported when it first
runs, so that CPU installs never need it).

``out = dropout(softmax(scale * q k^T + bias + padding)) v`` for q, k, v (B, H, T, D) in fp16 or bf16, one
bias (1, H, T, T) for the whole batch added after the scale (the shared term of TUPE Eq. 7-11, Ke, He, Liu,
"Rethinking Positional Encoding in Language Pre-training", arXiv 2006.15595, or any learned bias of the
offset), and the keys of row b past ``key_lengths[b]`` masked by cuDNN's padding mask (``seq_len_kv``; every
query row is kept, ``seq_len_q`` = T, so that a padded query attends to its row's keys as on the other paths
and its output is defined): the padding stays apart from the bias, so no (B, H, T, T) mask is built.
cuDNN's flash kernels (FlashAttention-2's scheme, Dao, arXiv 2307.08691) keep the rows' log-sum-exp
(``Stats``) for the backward, which returns the bias gradient dBias as cuDNN's reduction of dS over the
batch; attention dropout draws its keep-mask from Philox by a seed (drawn from torch's CUDA generator) and an
offset that the forward keeps for the backward. A graph is built once per configuration (shapes, strides,
dtype, bias, bias gradient, padding, dropout, scale) and thread (each thread runs on a cuDNN handle of its
own; autograd runs the backward on a thread of its own), and kept. The step-by-step twin is
:func:`~.attend.explicit_attention` (tests/test_cudnn_graph_attention.py, on a GPU); the plan of
:mod:`.paths` runs this path for ``--attention-backend cudnn-graph``.
"""

import threading
from dataclasses import dataclass

import torch

FLAG = "--attention-backend cudnn-graph"
HALF_DTYPES = (torch.float16, torch.bfloat16)

# Per thread: {device index: cuDNN handle} and {graph key: built graph}.
_PER_THREAD = threading.local()


@dataclass(frozen=True)
class GraphKey:
    """What a built graph is specific to: q's ``shape`` (B, H, T, D), the strides of q, k, v (and of the
    output's gradient, backward), the ``dtype``, whether there is a bias (and, backward, whether its gradient
    is wanted), key padding as lengths, the dropout probability, the scale and, forward, whether the keep-mask
    is written out (``keep_mask_out``, the tests)."""

    backward: bool
    shape: tuple
    strides: tuple
    dtype: torch.dtype
    device: int
    has_bias: bool
    bias_grad: bool
    has_lengths: bool
    dropout: float
    scale: float
    keep_mask_out: bool = False


@dataclass
class BuiltGraph:
    """A graph ready to run: the cuDNN frontend's ``graph``, its tensors by name and its workspace bytes."""

    graph: object
    tensors: dict
    workspace: int


def _cudnn():
    """The cuDNN frontend module, with a clear error where it or the cuDNN library it loads is missing."""
    try:
        import cudnn
    except ImportError as err:
        raise RuntimeError(f"{FLAG} needs the cuDNN frontend: pip install nvidia-cudnn-frontend") from err
    try:
        cudnn.backend_version()
    except RuntimeError as err:
        raise RuntimeError(f"{FLAG}: the cuDNN frontend found no cuDNN library (libcudnn.so.9, which "
                           "torch's CUDA build installs with nvidia-cudnn-cu*): put its folder on "
                           "LD_LIBRARY_PATH") from err
    return cudnn


def _state():
    """This thread's cuDNN handles and built graphs."""
    if not hasattr(_PER_THREAD, "graphs"):
        _PER_THREAD.handles, _PER_THREAD.graphs = {}, {}
    return _PER_THREAD


def _handle(cudnn, device):
    """This thread's cuDNN handle for ``device``, set to run on torch's current stream."""
    handles = _state().handles
    if device not in handles:
        with torch.cuda.device(device):
            handles[device] = cudnn.create_handle()
    cudnn.set_stream(handles[device], torch.cuda.current_stream(device).cuda_stream)
    return handles[device]


def _name(dtype):
    return str(dtype).replace("torch.", "")


def _io_type(cudnn, dtype):
    return {torch.float16: cudnn.data_type.HALF, torch.bfloat16: cudnn.data_type.BFLOAT16}[dtype]


def _heads_last_strides(shape):
    """The strides of a (B, H, T, D) view of a (B, T, H, D) tensor: the output and gradients' layout, the
    projection's, so that joining the heads back is free."""
    _, heads, seq_len, head_dim = shape
    return (seq_len * heads * head_dim, head_dim, heads * head_dim, 1)


def _heads_last(shape, dtype, device):
    batch, heads, seq_len, head_dim = shape
    return torch.empty(batch, seq_len, heads, head_dim, dtype=dtype, device=device).transpose(1, 2)


def _bias_shape(key):
    """The (1, H, T, T) shape of the bias shared by the batch (and of its gradient)."""
    _, heads, seq_len, _ = key.shape
    return (1, heads, seq_len, seq_len)


def _contiguous_strides(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _declare(graph, name, shape, strides, data_type):
    return graph.tensor(name=name, dim=list(shape), stride=list(strides), data_type=data_type)


def _common_inputs(cudnn, graph, key):
    """The graph tensors both directions read: q, k, v, the bias, the lengths and the dropout's seed and
    offset (the ones the key has), and the dropout argument of ``sdpa`` / ``sdpa_backward``."""
    io_type = _io_type(cudnn, key.dtype)
    batch, heads, seq_len, _ = key.shape
    tensors = {name: _declare(graph, name, key.shape, strides, io_type)
               for name, strides in zip(("q", "k", "v"), key.strides[:3])}
    if key.has_bias:
        tensors["bias"] = _declare(graph, "bias", _bias_shape(key), _contiguous_strides(_bias_shape(key)),
                                   io_type)
    if key.has_lengths:
        for name in ("seq_len_q", "seq_len_kv"):
            tensors[name] = _declare(graph, name, (batch, 1, 1, 1), (1, 1, 1, 1), cudnn.data_type.INT32)
    dropout = None
    if key.dropout > 0:
        for name in ("seed", "offset"):
            tensors[name] = _declare(graph, name, (1, 1, 1, 1), (1, 1, 1, 1), cudnn.data_type.INT64)
        dropout = (key.dropout, tensors["seed"], tensors["offset"])
    return tensors, dropout


def _new_graph(cudnn, key, handle):
    internal = cudnn.data_type.FLOAT
    return cudnn.pygraph(io_data_type=_io_type(cudnn, key.dtype), intermediate_data_type=internal,
                         compute_data_type=internal, handle=handle)


def _forward_graph(cudnn, key, handle):
    graph = _new_graph(cudnn, key, handle)
    tensors, dropout = _common_inputs(cudnn, graph, key)
    batch, heads, seq_len, _ = key.shape
    if key.keep_mask_out:
        mask_shape = (batch, heads, seq_len, seq_len)
        tensors["keep_mask"] = _declare(graph, "keep_mask", mask_shape, _contiguous_strides(mask_shape),
                                        cudnn.data_type.FLOAT)
    out, stats = graph.sdpa(
        q=tensors["q"], k=tensors["k"], v=tensors["v"], name="attention", generate_stats=True,
        attn_scale=key.scale, bias=tensors.get("bias"), use_padding_mask=key.has_lengths,
        seq_len_q=tensors.get("seq_len_q"), seq_len_kv=tensors.get("seq_len_kv"), dropout=dropout,
        rng_dump=tensors.get("keep_mask"))
    out.set_output(True).set_dim(list(key.shape)).set_stride(list(_heads_last_strides(key.shape)))
    stats_shape = (batch, heads, seq_len, 1)
    stats.set_output(True).set_data_type(cudnn.data_type.FLOAT).set_dim(list(stats_shape)).set_stride(
        list(_contiguous_strides(stats_shape)))
    tensors.update(out=out, stats=stats)
    return graph, tensors


def _backward_graph(cudnn, key, handle):
    graph = _new_graph(cudnn, key, handle)
    tensors, dropout = _common_inputs(cudnn, graph, key)
    io_type = _io_type(cudnn, key.dtype)
    batch, heads, seq_len, _ = key.shape
    tensors["out"] = _declare(graph, "out", key.shape, _heads_last_strides(key.shape), io_type)
    tensors["grad_out"] = _declare(graph, "grad_out", key.shape, key.strides[3], io_type)
    stats_shape = (batch, heads, seq_len, 1)
    tensors["stats"] = _declare(graph, "stats", stats_shape, _contiguous_strides(stats_shape),
                                cudnn.data_type.FLOAT)
    if key.bias_grad:
        tensors["grad_bias"] = _declare(graph, "grad_bias", _bias_shape(key),
                                        _contiguous_strides(_bias_shape(key)), io_type)
    grads = graph.sdpa_backward(
        q=tensors["q"], k=tensors["k"], v=tensors["v"], o=tensors["out"], dO=tensors["grad_out"],
        stats=tensors["stats"], name="attention_backward", attn_scale=key.scale, bias=tensors.get("bias"),
        dBias=tensors.get("grad_bias"), use_padding_mask=key.has_lengths, seq_len_q=tensors.get("seq_len_q"),
        seq_len_kv=tensors.get("seq_len_kv"), dropout=dropout)
    for name, grad in zip(("grad_q", "grad_k", "grad_v"), grads):
        grad.set_output(True).set_dim(list(key.shape)).set_stride(list(_heads_last_strides(key.shape)))
        tensors[name] = grad
    return graph, tensors


def _describe(key):
    """The configuration of ``key`` in words, for the error where cuDNN has no kernel for it."""
    bias = "no bias" if not key.has_bias else "a bias (1, H, T, T) with its gradient" if key.bias_grad \
        else "a bias (1, H, T, T)"
    return ", ".join([f"q {tuple(key.shape)} in {_name(key.dtype)}", bias,
                      "key padding" if key.has_lengths else "no padding", f"dropout {key.dropout}"])


def _built(cudnn, key, handle):
    """The graph of ``key`` for this thread, built the first time (validate, plans, check_support, build)."""
    graphs = _state().graphs
    if key not in graphs:
        graph, tensors = (_backward_graph if key.backward else _forward_graph)(cudnn, key, handle)
        try:
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            graph.check_support()
            graph.build_plans()
        except (cudnn.cudnnGraphNotSupportedError, RuntimeError, ValueError) as err:
            direction = "backward" if key.backward else "forward"
            raise RuntimeError(f"{FLAG}: cuDNN has no {direction} kernel for {_describe(key)} ({err}); use "
                               "--attention-backend triton or auto") from err
        graphs[key] = BuiltGraph(graph, tensors, graph.get_workspace_size())
    return graphs[key]


def _run(cudnn, key, data):
    """Run the graph of ``key`` on ``data`` ({tensor name: torch tensor}) on torch's current stream."""
    handle = _handle(cudnn, key.device)
    built = _built(cudnn, key, handle)
    workspace = torch.empty(built.workspace, dtype=torch.uint8, device=data["q"].device)
    variant_pack = {built.tensors[name]: tensor for name, tensor in data.items()}
    built.graph.execute(variant_pack, workspace, handle=handle)


# The graph tensors the forward keeps for the backward (those the configuration has)
SAVED = ("q", "k", "v", "bias", "seq_len_q", "seq_len_kv", "seed", "offset", "out", "stats")


def _last_stride_one(tensor):
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


class CudnnGraphAttention(torch.autograd.Function):
    """See the module docstring; ``bias`` (1, H, T, T), (H, T, T) or None, ``key_lengths`` (B,) or None; with
    ``keep_mask_out`` the forward returns the keep-mask its dropout drew too."""

    @staticmethod
    def forward(ctx, q, k, v, bias, key_lengths, scale, dropout, keep_mask_out):
        cudnn = _cudnn()
        batch, heads, seq_len, head_dim = q.shape
        q, k, v = (_last_stride_one(t) for t in (q, k, v))
        data = {"q": q, "k": k, "v": v}
        if bias is not None:
            data["bias"] = bias.reshape(1, heads, seq_len, seq_len).to(q.dtype).contiguous()
        if key_lengths is not None:
            data["seq_len_q"] = torch.full((batch, 1, 1, 1), seq_len, dtype=torch.int32, device=q.device)
            lengths = key_lengths.to(device=q.device, dtype=torch.int32)
            data["seq_len_kv"] = lengths.reshape(batch, 1, 1, 1).contiguous()
        if dropout > 0:
            data["seed"] = torch.randint(2**62, (1, 1, 1, 1), dtype=torch.int64, device=q.device)
            data["offset"] = torch.zeros(1, 1, 1, 1, dtype=torch.int64, device=q.device)
        data["out"] = _heads_last(q.shape, q.dtype, q.device)
        data["stats"] = torch.empty(batch, heads, seq_len, 1, dtype=torch.float32, device=q.device)
        if keep_mask_out:
            data["keep_mask"] = torch.empty(batch, heads, seq_len, seq_len, dtype=torch.float32,
                                            device=q.device)
        device = q.device.index if q.device.index is not None else torch.cuda.current_device()
        key = GraphKey(False, tuple(q.shape), (q.stride(), k.stride(), v.stride()), q.dtype, device,
                       bias is not None, False, key_lengths is not None, dropout, scale, keep_mask_out)
        _run(cudnn, key, data)
        ctx.save_for_backward(*(data.get(name) for name in SAVED))
        ctx.key = key
        ctx.bias_shape, ctx.bias_dtype = (None, None) if bias is None else (bias.shape, bias.dtype)
        if keep_mask_out:
            ctx.mark_non_differentiable(data["keep_mask"])
            return data["out"], data["keep_mask"]
        return data["out"]

    @staticmethod
    def backward(ctx, grad_out, *unused_keep_mask_grad):
        cudnn = _cudnn()
        data = {name: tensor for name, tensor in zip(SAVED, ctx.saved_tensors) if tensor is not None}
        q = data["q"]
        data["grad_out"] = _last_stride_one(grad_out)
        bias_grad = ctx.bias_shape is not None and ctx.needs_input_grad[3]
        for name in ("grad_q", "grad_k", "grad_v"):
            data[name] = _heads_last(q.shape, q.dtype, q.device)
        if bias_grad:
            data["grad_bias"] = torch.zeros_like(data["bias"])
        key = GraphKey(True, ctx.key.shape, (*ctx.key.strides, data["grad_out"].stride()), ctx.key.dtype,
                       ctx.key.device, ctx.key.has_bias, bias_grad, ctx.key.has_lengths, ctx.key.dropout,
                       ctx.key.scale)
        _run(cudnn, key, data)
        grad_bias = data["grad_bias"].reshape(ctx.bias_shape).to(ctx.bias_dtype) if bias_grad else None
        return data["grad_q"], data["grad_k"], data["grad_v"], grad_bias, None, None, None, None


def _checked(q, scale):
    """The scale (1/sqrt(D) by default) after checking that q can run here (fp16 / bf16, a CUDA device)."""
    if q.dtype not in HALF_DTYPES:
        raise RuntimeError(f"{FLAG} runs cuDNN's fused attention in fp16 or bf16, and the queries are "
                           f"{_name(q.dtype)}: train with --fp16, --bf16 or --amp, or use "
                           "--attention-backend triton or auto")
    if q.device.type != "cuda":
        raise RuntimeError(f"{FLAG} needs a CUDA device (the queries are on {q.device.type}); use "
                           "--attention-backend auto")
    return float(q.size(-1) ** -0.5 if scale is None else scale)


def cudnn_biased_attention(q, k, v, bias=None, key_lengths=None, scale=None, dropout=0.0):
    """``dropout(softmax(scale q k^T + bias + padding)) v`` (B, H, T, D) on cuDNN's fused attention: ``bias``
    the (1, H, T, T) or (H, T, T) bias shared by the batch (or None), ``key_lengths`` (B,) the unpadded length
    of each row (or None), ``scale`` 1/sqrt(D) when None."""
    scale = _checked(q, scale)
    return CudnnGraphAttention.apply(q, k, v, bias, key_lengths, scale, float(dropout), False)


def attention_and_keep_mask(q, k, v, bias=None, key_lengths=None, scale=None, dropout=0.0):
    """:func:`cudnn_biased_attention` and the (B, H, T, T) keep-mask its dropout drew (1 kept, 0 dropped;
    cuDNN's ``rng_dump``), None without dropout: what the tests need to give the twin the kernel's dropout."""
    scale = _checked(q, scale)
    if dropout == 0:
        return CudnnGraphAttention.apply(q, k, v, bias, key_lengths, scale, 0.0, False), None
    return CudnnGraphAttention.apply(q, k, v, bias, key_lengths, scale, float(dropout), True)
