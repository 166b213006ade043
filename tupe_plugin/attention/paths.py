"""The one decision of which attention kernel runs (as x-transformers' ``Attend``, for CPU and GPU).

:func:`plan_attention` decides once per forward, from the device, the attention dropout in effect, whether
the probabilities are wanted, the position config and the sequence length, which of seven paths every
layer takes (:func:`choose_path`), which SDPA kernels it may use (:func:`sdpa_backends`), whether
TUPE's untied term is folded into the dense bias (:func:`fold_untied_term`) and whether RoPE's rotation
of q and k runs as one Triton pass (:func:`fuse_rotary`, with ``--attention-backend triton``); the
encoder hands the :class:`AttentionPlan` to every layer, and :func:`~.attend.attend` runs what it is given:

* ``SDPA``: one ``scaled_dot_product_attention`` call (flash or memory-efficient kernel) — on GPU
  always, on CPU when there is no dropout and no mask that needs a gradient (nor, in training, a fixed
  bias of the offset past ``d_h``);
* ``CHUNKED``: :class:`~.cpu_kernels.ChunkedAttention` — on CPU with attention dropout, where SDPA has no
  fused kernel and its math fallback is slower still;
* ``BIASED_FLASH``: :class:`~.cpu_kernels.BiasedFlashAttention` — on CPU, no dropout, a learned dense
  bias (the T5 bias of TUPE Eq. 5 / 8, Ke, He, Liu, "Rethinking Positional Encoding in Language
  Pre-training", arXiv 2006.15595; Shaw key terms; TUPE's untied term folded into one) and sequences
  longer than ``d_h``: SDPA would drop to its slow math path for a grad-requiring mask, so the flash
  kernel runs the forward with the mask as a constant and an exact backward follows; a fixed bias of the
  offset (ALiBi, Sandwich) in training past ``d_h`` too, without a gradient: its long rows leave most
  probabilities subnormal, which SDPA's CPU backward computes with (several times slower on Intel CPUs:
  ALiBi's step 1.3 x BERT-A's at T = 512, medium) and this backward drops; and past T = 512 every bias of
  the offset, learned or fixed, in training or evaluation. A bias of the offset j - i reaches it as its
  rows (:func:`offset_bias_as_rows`), read by blocks of query rows, so that no (H, T, T) tensor is built
  for it: at every length, but for TUPE-R up to T = 512, whose T5 bias joins the untied product there;
* ``TRITON`` (``--attention-backend triton``): :mod:`.triton_bias_attention`, flash attention in Triton
  with the learned bias shared by the batch, its batch-summed gradient, key padding as row lengths (kept
  apart from the bias: no (B, H, T, T) mask) and attention dropout; a bias of the offset j - i as its
  Toeplitz rows and [CLS] reset (:attr:`AttentionPlan.offset_bias_as_rows`, beside TUPE's folded untied
  product or alone: no (H, T, T) tensor for it); the terms that depend on the content,
  Shaw keys and DeBERTa's c2p and p2c, reach it as the R table rows, which the kernel multiplies by q (and
  k) per tile, each pair reading the row of its offset (``relative_by_offset``), where the other paths
  gather them into a (B, H, T, T) mask; Shaw value vectors as the kernel's (B, H, T, 2K + 1) sums of the
  probabilities by clipped distance, times the table;
* ``FLEX`` (``--attention-backend flex``): :mod:`.flex_bias_attention`, PyTorch's FlexAttention (compiled
  on CUDA; eager, without gradients, elsewhere) with the terms TRITON takes, added by its ``score_mod``:
  the bias shared by the batch, a bias of the offset as its rows read by j - i, the relative terms as the
  (B, H, T, R) products of q (and k) with the table rows, read by offset, key padding as row lengths; no
  attention dropout (refused at model build, :func:`backend_problem`), nor Shaw value vectors, which
  need the probabilities;
* ``CUDNN_GRAPH`` (``--attention-backend cudnn-graph``): :mod:`.cudnn_graph_attention`, cuDNN's fused
  flash attention built as a graph by the cuDNN frontend (``nvidia-cudnn-frontend``; torch's own cuDNN
  SDPA kernel, given the (B, H, T, T) mask, is ``--attention-backend cudnn``), fp16 / bf16 only: the same
  learned bias shared by the batch with its batch-summed gradient, key padding as row lengths and attention
  dropout as TRITON, a bias of the offset expanded into that dense bias (cuDNN takes no rows); no relative
  products (Shaw, DeBERTa: :func:`backend_problem`);
* ``EXPLICIT``: matmul-softmax-matmul over whole tensors — where the probabilities are needed
  (``need_weights``; Shaw value vectors off the Triton kernel), where a layer computes a term of its own
  logits (:class:`~tupe_plugin.terms.parts.LayerTerm`: CoPE, DAPE), and on CPU for a learned dense bias
  without
  dropout when ``T <= d_h``: there it is faster than BIASED_FLASH and the probabilities it keeps,
  B H T^2 numbers a layer, are at most the layer's hidden states (B T H d_h): the memory bound of the
  choice (at twice, T = 128 with d_h = 64, the peak memory of a training step was 1.059 x BERT-A's at
  B = 16, over the 1.05 x bound, and BIASED_FLASH was as fast). ``benchmarks/benchmark_attention.py``
  measures the paths side by side (docs/benchmarks.md).

On CUDA, ``auto`` takes torch's own operations and SDPA's kernels only: a plugin kernel (the Triton attention
and RoPE rotation, FlexAttention, cuDNN's graph) runs where ``--attention-backend`` names it, until a GPU run
has measured it correct and faster (:data:`MEASURED_KERNELS`: none yet). A kernel that
``--attention-backend`` names runs where it can (:func:`kernel_runs_on`): on CUDA; elsewhere
(a model trained on a GPU, evaluated or fine-tuned on a CPU) the CPU paths run in its place.

Each path reads some parts of the positional term (:mod:`tupe_plugin.terms.parts`), :data:`PATH_READS`; the
plan refuses a term with a part its path does not read, once a forward (:meth:`AttentionPlan.check_reads`).

The config is read through the properties a :class:`~tupe_plugin.encodings.position_config.PositionConfig`
offers; nothing here imports the encodings.
"""

import enum
import os
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Optional

import torch
from torch.nn.attention import SDPBackend

from ..terms.parts import (CLIPPED_TABLE, CLIPPED_VALUES, DENSE_BIAS, KIND_WORDS, LAYER_TERM, LOW_RANK,
                           OFFSET_ROWS, PROJECTED_TABLE, ROTARY, SHIFT)
from .cpu_kernels import reads_offset_rows

# Without dropout, a learned dense bias takes the explicit path up to T = d_h (see above).
EXPLICIT_MAX_LENGTH_PER_HEAD_DIM = 1


class AttentionPath(enum.Enum):
    SDPA = "sdpa"
    CHUNKED = "chunked"
    BIASED_FLASH = "biased-flash"
    EXPLICIT = "explicit"
    TRITON = "triton"
    FLEX = "flex"
    CUDNN_GRAPH = "cudnn-graph"


def choose_path(device, dropout, need_weights, config, seq_len, requested="auto"):
    """The path every layer of this forward takes (see the module docstring).

    ``dropout`` is the attention dropout in effect (0 in evaluation), ``config`` the model's
    :class:`~tupe_plugin.encodings.position_config.PositionConfig`, ``seq_len`` the length T of the batch,
    ``requested`` the ``--attention-backend``.
    """
    on_cpu = torch.device(device).type == "cpu"
    if need_weights or config.layer_terms:
        return AttentionPath.EXPLICIT
    if requested in KERNEL_BACKENDS and kernel_runs_on(requested, device):
        return KERNEL_BACKENDS[requested]
    if config.shaw_values:
        return AttentionPath.EXPLICIT
    if on_cpu and dropout > 0:
        return AttentionPath.CHUNKED
    if on_cpu and config.offset_bias and reads_offset_rows(seq_len):
        return AttentionPath.BIASED_FLASH  # the bias as its rows, learned or fixed, with gradients or not
    short = seq_len <= EXPLICIT_MAX_LENGTH_PER_HEAD_DIM * config.head_dim
    if on_cpu and (config.learned_dense_bias or config.untied_table) and torch.is_grad_enabled():
        return AttentionPath.EXPLICIT if short else AttentionPath.BIASED_FLASH
    if on_cpu and config.offset_bias and torch.is_grad_enabled() and not short:
        return AttentionPath.BIASED_FLASH  # a fixed bias: its subnormal probabilities dropped in the backward
    return AttentionPath.SDPA


# --attention-backend: the SDPA kernel on CUDA ("auto": torch's choice but for a learned bias, below), or
# a kernel that takes the bias apart from the padding: the plugin's Triton kernel, FlexAttention, or cuDNN's
# fused attention as a graph of the cuDNN frontend
SDPA_BACKENDS = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                 "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
TRITON_BACKEND = "triton"
FLEX_BACKEND = "flex"
CUDNN_GRAPH_BACKEND = "cudnn-graph"
KERNEL_BACKENDS = {TRITON_BACKEND: AttentionPath.TRITON, FLEX_BACKEND: AttentionPath.FLEX,
                   CUDNN_GRAPH_BACKEND: AttentionPath.CUDNN_GRAPH}
ATTENTION_BACKENDS = ("auto", *SDPA_BACKENDS, *KERNEL_BACKENDS)
# The kernels that read Shaw keys' and DeBERTa's terms by offset (the table rows; FlexAttention their
# products)
RELATIVE_OFFSET_PATHS = (AttentionPath.TRITON, AttentionPath.FLEX)
# The kernels that read a bias of the offset as its Toeplitz rows; SDPA, cuDNN's graph and the explicit path
# take one dense bias, into which the plan expands it
OFFSET_ROWS_PATHS = (AttentionPath.CHUNKED, AttentionPath.BIASED_FLASH, AttentionPath.TRITON,
                     AttentionPath.FLEX)

# The parts of the positional term (:mod:`tupe_plugin.terms.parts`) each path reads, as the layer hands
# them over: every path takes shifts and RoPE's rotation (applied to q and k before the kernel) and a dense
# bias (in the mask); TUPE's untied factors as widened heads the paths whose kernels take any head width, SDPA
# and the CPU paths (which have them folded into the dense bias, fold_untied_term, but compute the same with
# them widened), not the GPU kernels of --attention-backend; a bias of the offset as its rows the kernels of
# OFFSET_ROWS_PATHS; Shaw's keys and a projected table (DeBERTa) every path that takes a (B, H, T, T) mask,
# gathered into it, and the Triton kernel and FlexAttention by offset; cuDNN's graph neither (one bias shared
# by the batch); Shaw's value vectors the paths that have the probabilities; a term each layer computes from
# its own logits (CoPE, DAPE) the explicit path, where the logits are whole.
_EVERY_PATH = (SHIFT, DENSE_BIAS, ROTARY)
PATH_READS = {
    AttentionPath.SDPA: frozenset((*_EVERY_PATH, LOW_RANK, CLIPPED_TABLE, PROJECTED_TABLE)),
    AttentionPath.CHUNKED: frozenset((*_EVERY_PATH, LOW_RANK, OFFSET_ROWS, CLIPPED_TABLE, PROJECTED_TABLE)),
    AttentionPath.BIASED_FLASH: frozenset((*_EVERY_PATH, LOW_RANK, OFFSET_ROWS, CLIPPED_TABLE,
                                           PROJECTED_TABLE)),
    AttentionPath.EXPLICIT: frozenset((*_EVERY_PATH, LOW_RANK, CLIPPED_TABLE, CLIPPED_VALUES,
                                       PROJECTED_TABLE, LAYER_TERM)),
    AttentionPath.TRITON: frozenset((*_EVERY_PATH, OFFSET_ROWS, CLIPPED_TABLE, CLIPPED_VALUES,
                                     PROJECTED_TABLE)),
    AttentionPath.FLEX: frozenset((*_EVERY_PATH, OFFSET_ROWS, CLIPPED_TABLE, PROJECTED_TABLE)),
    AttentionPath.CUDNN_GRAPH: frozenset(_EVERY_PATH),
}

# The CPU kernels whose layers add the gradient of the one dense mask they all read (TUPE's untied term) to
# one buffer (:mod:`.shared_mask_gradient`), rather than each returning its own for autograd to sum
SHARED_MASK_GRADIENT_PATHS = (AttentionPath.CHUNKED, AttentionPath.BIASED_FLASH)


def kernel_runs_on(requested, device):
    """Whether the kernel of ``--attention-backend requested`` runs a forward on ``device``: every one on
    CUDA; on CPU the Triton kernel through Triton's interpreter (``TRITON_INTERPRET=1``, the tests) and
    FlexAttention without gradients (it has no CPU backward). Elsewhere the CPU paths run, so that a model
    trained on a GPU with a kernel backend is evaluated or fine-tuned on a CPU as it is."""
    if torch.device(device).type == "cuda":
        return True
    if requested == TRITON_BACKEND:
        return os.environ.get("TRITON_INTERPRET") == "1"
    return requested == FLEX_BACKEND and not torch.is_grad_enabled()


def sdpa_backends(device, config, requested="auto"):
    """The SDPA kernels a forward may use (None: torch chooses). ``requested`` (``--attention-backend``)
    names one; by default, on CUDA, a learned dense bias takes the memory-efficient kernel: it returns
    the bias gradient, where cuDNN's backward can return NaN for masked rows at T % 128 == 64
    (pytorch#196678) and flash takes no bias at all. The math kernel stands behind it for the inputs
    it refuses: on an H100 with torch 2.11, a one-token row's (1, H, 1, 1) bias, whose last dimension
    may keep a stride of H (a dimension of size 1 keeps any stride) where GPU kernels want 1."""
    if requested in SDPA_BACKENDS:
        return (SDPA_BACKENDS[requested],)
    if requested == "auto" and torch.device(device).type == "cuda" and config.learned_dense_bias:
        return (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
    return None


def backend_note(requested):
    """What a user of ``--attention-backend requested`` should know where torch sees no CUDA device (the
    CPU paths run in the kernel's place, or Triton's interpreter runs its kernel: :func:`kernel_runs_on`),
    or None."""
    if requested in KERNEL_BACKENDS and not torch.cuda.is_available():
        if kernel_runs_on(requested, "cpu") and requested == TRITON_BACKEND:
            return (f"--attention-backend {requested} with TRITON_INTERPRET=1 and no CUDA device: Triton's "
                    "interpreter runs the kernel on the CPU, step by step (many times slower than the CPU "
                    "attention paths, for testing the kernel); unset TRITON_INTERPRET to run those instead")
        return (f"--attention-backend {requested} names a CUDA kernel and torch sees no CUDA device: the CPU "
                "attention paths run in its place (the same attention)")
    return None


def cudnn_frontend_installed():
    """Whether the cuDNN frontend's Python package (``import cudnn``) is installed (not imported here)."""
    return find_spec("cudnn") is not None


def _flag_setting(name, value):
    return f"--{name.replace('_', '-')} {value}"


def backend_problem(requested, config, attention_dropout, setting=_flag_setting):
    """Why ``--attention-backend requested`` cannot run a model of ``config`` with ``attention_dropout``
    (``--attention-dropout``), or None: FlexAttention adds no Shaw value vectors,
    cuDNN's graph no term that depends on the content (Shaw, DeBERTa), FlexAttention has no attention
    dropout, and each kernel needs its package where CUDA is (elsewhere the CPU paths run in its place).
    ``setting(name, value)`` says how the command at hand sets a model option (a flag by default)."""
    flag = f"--attention-backend {requested}"
    if requested in KERNEL_BACKENDS and config.layer_terms:
        return (f"{flag} computes no term of a layer's own logits ({config.layer_terms}), which the explicit "
                "path computes: use --attention-backend auto")
    if requested == FLEX_BACKEND and config.shaw_values:
        return (f"{flag} does not add Shaw value vectors, which need the attention probabilities: add "
                "--shaw-keys-only, or use --attention-backend triton or auto")
    if requested == CUDNN_GRAPH_BACKEND and (config.shaw_table is not None or config.deberta):
        return (f"{flag} takes one bias shared by the batch, not the terms of --rel-pos {config.rel_pos}, "
                "which depend on the content: use --attention-backend triton (it reads Shaw keys and "
                "DeBERTa's terms inside its kernel) or auto")
    if requested == FLEX_BACKEND and attention_dropout > 0:
        return (f"{flag} runs no attention dropout (FlexAttention has none), but --attention-dropout is "
                f"{attention_dropout}: pass {setting('attention_dropout', 0.0)} (evaluation drops nothing "
                f"anyway), or use {setting('attention_backend', TRITON_BACKEND)}, which applies it")
    if not torch.cuda.is_available():  # the CPU paths run in the kernel's place: no package needed
        return None
    if requested == TRITON_BACKEND and find_spec("triton") is None:
        return f"{flag} needs Triton, which is not installed: pip install triton"
    if requested == CUDNN_GRAPH_BACKEND and not cudnn_frontend_installed():
        return f"{flag} needs the cuDNN frontend, which is not installed: pip install nvidia-cudnn-frontend"
    return None


def fold_untied_term(path, config):
    """Whether TUPE's untied term is multiplied out into the dense bias for ``path``: always on the CPU
    paths of their own (explicit, chunked, biased flash), which add a bias inside the logits' product or
    the flash kernel at little cost where SDPA would run on heads of 2 d_h + 2 (TUPE-A's training step
    at T = 512 on CPU: 1.19 x BERT-A's factored, 1.04 x folded), and wherever the T5 bias is added in
    every layer anyway (the untied product joins it for free). On SDPA without a T5 bias (a GPU, or no
    gradients) it stays factored: on a GPU the widened heads keep cuDNN's kernel, where a learned bias
    takes the memory-efficient one. The Triton kernel, FlexAttention and cuDNN's graph take one dense
    bias: folded (a bias of the offset stays beside it as its rows on the first two)."""
    dense_bias_paths = (AttentionPath.EXPLICIT, AttentionPath.CHUNKED, AttentionPath.BIASED_FLASH,
                        *KERNEL_BACKENDS.values())
    return path in dense_bias_paths or config.t5_bias


# The plugin's own GPU kernels that a GPU run of benchmarks/gpu_checks.sh has shown correct and faster than
# torch's operations and SDPA's kernels, each with the GPU it was measured on (the results committed under
# benchmarks/results): none yet. On CUDA, ``auto`` takes these only; every other plugin kernel runs where a
# flag names it (--attention-backend triton, flex, cudnn-graph).
FUSED_ROTARY = "triton-rotary"
MEASURED_KERNELS = {}


def fuse_rotary(device, config, requested="auto", per_sequence=False):
    """Whether RoPE rotates q and k of each layer's projection in one Triton pass, forward and backward
    (:mod:`.triton_rotary`): where ``--attention-backend triton`` asks for the plugin's Triton kernels (or
    ``auto``, once a GPU run has measured it: :data:`MEASURED_KERNELS`), on CUDA, for fixed frequencies,
    where Triton is installed. Otherwise torch's elementwise rotation stays: on CPU (no slower there), under
    ``auto`` on CUDA (never yet run on a GPU), for learnable frequencies, as its backward reaches them, and
    for tables per sequence (``per_sequence``: randomized positions), which the kernel does not read."""
    asked = requested == TRITON_BACKEND or (requested == "auto" and FUSED_ROTARY in MEASURED_KERNELS)
    return (asked and not per_sequence and torch.device(device).type == "cuda" and config.rotary_applies
            and not config.learnable_rotary_frequencies and find_spec("triton") is not None)


@dataclass(frozen=True)
class AttentionPlan:
    """What every layer of one forward runs: the ``path``, the attention ``dropout`` in effect (0 in
    evaluation), the SDPA ``backends`` allowed (None: torch chooses), whether the positional term
    is built with TUPE's untied factors multiplied out (``fold_untied``), whether RoPE's rotation runs
    on the fused kernel (``fused_rotary``) and whether a bias of the offset reaches the kernel as its rows
    (``offset_bias_as_rows``)."""

    path: AttentionPath = AttentionPath.SDPA
    dropout: float = 0.0
    backends: Optional[tuple] = None
    fold_untied: bool = False
    fused_rotary: bool = False
    offset_bias_as_rows: bool = False

    @property
    def relative_by_offset(self):
        """Whether Shaw keys and DeBERTa's terms reach the kernel as their table rows read by offset
        (:class:`~.relative_terms.RelativeRows`: the Triton kernel, FlexAttention), rather than gathered into
        the (B, H, T, T) mask."""
        return self.path in RELATIVE_OFFSET_PATHS

    def check_reads(self, parts):
        """Refuse, in words, a positional term whose ``parts`` (:meth:`PositionalTerm.parts
        <tupe_plugin.encodings.positional_term.PositionalTerm.parts>`) this plan's path does not read
        (:data:`PATH_READS`): once a forward, before any layer runs, rather than deep in a kernel. On the
        paths that read a projected table by offset, its query shift joins the rows of a bias of the offset,
        which a [CLS] reset would overwrite in row 0 and column 0: that pair is refused there too."""
        kinds = [kind for part in parts for kind in part.reads()]
        unread = [kind for kind in dict.fromkeys(kinds) if kind not in PATH_READS[self.path]]
        if unread:
            readers = [path.value for path, reads in PATH_READS.items() if reads.issuperset(kinds)]
            raise ValueError(
                f"the attention path {self.path.value} does not read "
                f"{', '.join(KIND_WORDS[kind] for kind in unread)} of the positional term (it holds "
                f"{', '.join(dict.fromkeys(kinds))}); "
                + (f"the paths that read them all: {', '.join(readers)}" if readers
                   else "no attention path reads them all together"))
        if self.path in RELATIVE_OFFSET_PATHS:
            by_kind = {part.kind: part for part in parts}
            projected, offset = by_kind.get(PROJECTED_TABLE), by_kind.get(OFFSET_ROWS)
            if projected is not None and projected.query_shift is not None and offset is not None \
                    and offset.cls is not None:
                raise ValueError(
                    f"the attention path {self.path.value} adds a projected table's query shift to the rows "
                    "of the bias of the offset, whose [CLS] values would replace it in row 0 and column 0: a "
                    "[CLS] reset of a bias of the offset beside a query shift runs on the other paths only")

    @property
    def padding_as_lengths(self):
        """Whether key padding reaches the kernel as row lengths, apart from the bias (the Triton kernel,
        FlexAttention, cuDNN's graph), rather than in the mask."""
        return self.path in KERNEL_BACKENDS.values()


def plan_attention(device, dropout, need_weights, config, seq_len, requested_backend="auto",
                   per_sequence=False):
    """The :class:`AttentionPlan` of a forward (see the module docstring); ``requested_backend`` is
    ``--attention-backend``; ``per_sequence``: each sequence has positions of its own."""
    path = choose_path(device, dropout, need_weights, config, seq_len, requested_backend)
    return AttentionPlan(path, dropout, sdpa_backends(device, config, requested_backend),
                         fold_untied_term(path, config),
                         fuse_rotary(device, config, requested_backend, per_sequence),
                         offset_bias_as_rows(path, seq_len, config))


def offset_bias_as_rows(path, seq_len, config):
    """Whether a bias of the offset j - i reaches the kernel as its Toeplitz rows (H, 2T - 1) and [CLS] reset
    (:mod:`.offset_rows`), rather than expanded into the dense (H, T, T) bias once per forward: on the Triton
    kernel (a tile's window of offsets, its gradient summed by offset) and FlexAttention (score_mod reads the
    rows by j - i) at every length; on the biased flash kernel at every length too unless TUPE's untied
    product, a dense bias read anyway, takes it in (its backward reads the rows where it would read a dense
    bias from memory); on the CPU kernels otherwise where a head's (T, T) logits exceed a chunk
    (:func:`~.cpu_kernels.reads_offset_rows`)."""
    if path in (AttentionPath.TRITON, AttentionPath.FLEX):
        return True
    if path is AttentionPath.BIASED_FLASH and not config.untied_table:
        return True
    return path in OFFSET_ROWS_PATHS and reads_offset_rows(seq_len)
