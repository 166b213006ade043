"""The model flags that are not position encodings, checked once before a model is built.

RoBERTa's flags the plugin's encoder does not implement are refused by name instead of being accepted
and ignored; sizes and probabilities are checked for range, and a ``--max-positions`` whose position
table alone would not fit in memory (a typo) is refused before anything is allocated (the size flags of
the encodings are checked by their config,
:meth:`~tupe_plugin.encodings.position_config.PositionConfig.check`). Every size the model is built from
(layers, widths, heads, positions) is checked before anything is allocated: a size far beyond any published
model of that shape (:data:`PUBLISHED_LIMITS`) whatever the memory, and the whole model against the
machine's memory, counted on the work: its parameters in training (with their gradients and Adam's two
moments) and the largest activation of one forward of the configured batch (:func:`model_memory`).

``--layer-norm-eps`` sets the epsilon of every LayerNorm of the model (encoder and LM head): fairseq's
1e-5 unless given, or carried from an ``--init-from-checkpoint`` model; Google's BERT checkpoints were
trained with 1e-12, which a converted checkpoint records (:mod:`tupe_plugin.conversion.hf`). A model whose
config leaves it unset uses fairseq's (:func:`value_in_use`).

The plugin's own ``--no-layernorm-embedding`` is owned here: declared (:func:`add_args`), reconciled with
RoBERTa's ``--layernorm-embedding`` (:func:`set_defaults`), and mapped to the setting it decides for
fine-tuning's restore of the pre-training architecture (:data:`SETTING_OF_FLAG`, :func:`show_setting`,
:func:`carry_setting`).
"""

import inspect

from fairseq.modules import LayerNorm
from fairseq.utils import safe_getattr, safe_hasattr

from ..attention.paths import ATTENTION_BACKENDS
from ..encodings.encoding import flag_name
from ..encodings.position_config import DEFAULTS, PositionConfig, PositionFlagError
from ..user_input.cli_types import finite_float
from ..user_input.memory_limits import (FLOAT32, beyond_memory, forward_shape, machine_memory,
                                        trained_bytes)

LAYERNORM_EMBEDDING = "layernorm_embedding"

# A flag and the setting it decides (--no-layernorm-embedding sets layernorm_embedding).
SETTING_OF_FLAG = {"no_layernorm_embedding": LAYERNORM_EMBEDDING}

# What a built model uses for a setting its config leaves None: --layer-norm-eps, fairseq's LayerNorm epsilon
# (:func:`apply_layer_norm_eps` keeps it)
UNSET_IN_USE = {"layer_norm_eps": inspect.signature(LayerNorm).parameters["eps"].default}

# RoBERTa flags the plugin's encoder does not implement: (flag, value that means "off", why).
UNSUPPORTED_ROBERTA_FLAGS = (
    ("quant_noise_pq", 0, "quantization noise (Fan et al. 2020) is not implemented by the plugin's layers"),
    ("quant_noise_pq_block_size", 8, "it only matters with --quant-noise-pq, which the plugin refuses"),
    ("quant_noise_scalar", 0, "quantization noise is not implemented by the plugin's layers"),
    ("mha_heads_to_keep", -1, "adaptive head pruning is not implemented by the plugin's attention"),
    ("ffn_blocks_to_remove", -1, "adaptive FFN pruning is not implemented by the plugin's layers"),
    ("mha_reg_scale_factor", 0.0, "adaptive pruning regularisation is not implemented"),
    ("ffn_reg_scale_factor", 0.0, "adaptive pruning regularisation is not implemented"),
    ("min_params_to_wrap", int(1e8), "the plugin's layers are not wrapped for --ddp-backend fully_sharded"),
)

# The model sizes, their usual value (BERT-base's) and the largest any published model of this shape has,
# far beyond which a value is a typo whatever the memory: (flag, usual, limit, the largest published)
PUBLISHED_LIMITS = (
    ("encoder_layers", 12, 1000, "DeepNet's 1,000 layers are the deepest published Transformer"),
    ("encoder_embed_dim", 768, 65536, "published models are at most about 25,600 wide"),
    ("encoder_ffn_embed_dim", 3072, 262144, "published feed-forward layers are at most about 73,728 wide"),
    ("encoder_attention_heads", 12, 1024, "published models have at most 128 heads"),
)
USUAL_MAX_POSITIONS = 512  # BERT's


def add_args(parser):
    parser.add_argument(
        "--no-layernorm-embedding",
        action="store_true",
        help="no LayerNorm on the input embeddings (the presets use one, as BERT does)",
    )
    parser.add_argument(
        "--layer-norm-eps",
        type=finite_float,
        metavar="EPS",
        help="epsilon of every LayerNorm of the encoder and LM head (default: fairseq's 1e-5, or the "
        "--init-from-checkpoint model's; Google's BERT checkpoints use 1e-12)",
    )
    parser.add_argument(
        "--attention-backend",
        choices=ATTENTION_BACKENDS,
        default="auto",
        help="the attention kernel on CUDA: auto (default) lets torch's scaled_dot_product_attention choose, "
        "but for layers with a learned bias, which take the memory-efficient kernel (it returns the bias "
        "gradient), and runs no kernel of the plugin's (none has been measured on a GPU yet): torch's own "
        "operations and SDPA's kernels; efficient, flash, cudnn or math to force one; triton: the plugin's "
        "Triton kernels, RoPE's rotation of q and k in one pass and the attention kernel for a "
        "learned bias shared by the batch (its gradient summed in the kernel, padding as row lengths, "
        "attention dropout), Shaw keys and DeBERTa's terms read inside it from q's (and k's) products with "
        "the table rows, Shaw value vectors from its sums of the probabilities by clipped distance (no "
        "(B, H, T, T) tensor); flex: PyTorch's FlexAttention (compiled on CUDA) adding the same terms in its "
        "score_mod but Shaw value vectors, without attention dropout (needs --attention-dropout 0); "
        "cudnn-graph: cuDNN's fused attention built as a graph by the cuDNN frontend (pip install "
        "nvidia-cudnn-frontend; cudnn is torch's own cuDNN kernel, which takes the mask with the padding): a "
        "learned bias shared by the batch with its gradient summed over the batch by cuDNN, padding as row "
        "lengths, attention dropout, fp16/bf16 only, no Shaw or DeBERTa terms. Without a CUDA device the CPU "
        "paths run in place of triton, flex and cudnn-graph",
    )
    parser.add_argument(
        "--allow-skipped-data",
        action="store_true",
        help="train although more than 1%% of the training tokens are in samples longer than "
        "--max-positions, which fairseq skips (the plugin stops such a run by default)",
    )


def set_defaults(args):
    """Reconcile the two LayerNorm-embedding flags and fill --allow-skipped-data."""
    explicit_layernorm = safe_getattr(args, LAYERNORM_EMBEDDING, None)
    no_layernorm = safe_getattr(args, "no_layernorm_embedding", False)
    if explicit_layernorm and no_layernorm:
        raise PositionFlagError(
            "--layernorm-embedding and --no-layernorm-embedding contradict each other; pass one "
            "(the presets use a LayerNorm on the input embeddings, as BERT does)"
        )
    args.layernorm_embedding = not no_layernorm
    args.allow_skipped_data = safe_getattr(args, "allow_skipped_data", False)
    args.layer_norm_eps = safe_getattr(args, "layer_norm_eps", None)


def apply_layer_norm_eps(model, eps):
    """Give every LayerNorm of ``model`` (torch's, or apex's fused one fairseq picks on CUDA) the epsilon
    ``eps`` (None: keep fairseq's)."""
    if eps is None:
        return
    for module in model.modules():
        if hasattr(module, "normalized_shape") and hasattr(module, "eps"):
            module.eps = eps


def value_in_use(setting, value):
    """What a model built with ``setting`` = ``value`` uses: ``value``, or for None what the model uses in
    its place (:data:`UNSET_IN_USE`)."""
    return UNSET_IN_USE.get(setting) if value is None else value


def set_max_positions(args, task):
    """RoBERTa's rule: --max-positions defaults to --tokens-per-sample, itself to the task's."""
    if not safe_hasattr(args, "max_positions"):
        if not safe_hasattr(args, "tokens_per_sample"):
            args.tokens_per_sample = task.max_positions()
        args.max_positions = args.tokens_per_sample


def check_model_flags(args, vocab_size=None):
    """Raise :class:`~tupe_plugin.encodings.position_config.PositionFlagError` listing the sizes,
    probabilities and RoBERTa flags of ``args`` that no position config could fix; ``vocab_size``: the
    dictionary's, for the embeddings in :func:`model_memory` (None: left out)."""
    errors = []
    embed_dim, heads = args.encoder_embed_dim, args.encoder_attention_heads
    if heads < 1 or embed_dim < 1 or embed_dim % heads:
        errors.append(
            f"--encoder-embed-dim {embed_dim} must be a positive multiple of "
            f"--encoder-attention-heads {heads}"
        )
    for flag in ("max_positions", "encoder_layers", "encoder_ffn_embed_dim"):
        if getattr(args, flag) < 1:
            errors.append(f"{flag_name(flag)} must be positive, got {getattr(args, flag)}")
    tokens_per_sample = safe_getattr(args, "tokens_per_sample", None)
    if tokens_per_sample is not None and 0 < args.max_positions < tokens_per_sample:
        errors.append(
            f"--max-positions {args.max_positions} is below --tokens-per-sample {tokens_per_sample}: "
            "fairseq would silently drop every longer training block; raise --max-positions or lower "
            "--tokens-per-sample"
        )
    for flag in ("dropout", "attention_dropout", "activation_dropout", "encoder_layerdrop"):
        if not 0 <= safe_getattr(args, flag, 0.0) < 1:
            errors.append(f"{flag_name(flag)} is a probability in [0, 1), got {getattr(args, flag)}")
    for flag, off, why in UNSUPPORTED_ROBERTA_FLAGS:
        value = safe_getattr(args, flag, off)
        if value is not None and value != off:
            errors.append(f"{flag_name(flag)} {value} is not supported: {why}; drop the flag")
    eps = safe_getattr(args, "layer_norm_eps", None)
    if eps is not None and not 0 < eps < 1:
        errors.append(f"--layer-norm-eps is a small positive number (1e-5 is fairseq's, 1e-12 BERT's), "
                      f"got {eps}")
    errors += _beyond_published(args)
    if not errors:
        errors += _position_table_memory(args) or _model_memory_errors(args, vocab_size)
    if errors:
        raise PositionFlagError("invalid model flags:\n  " + "\n  ".join(errors))


def _position_table_memory(args):
    """A --max-positions whose position table alone exceeds the machine's memory (a typo) is refused."""
    problem = beyond_memory(f"--max-positions {args.max_positions}", "position table",
                            args.max_positions * max(args.encoder_embed_dim, 1) * 4)
    return [f"{problem} (512 is BERT's)"] if problem else []


def _beyond_published(args):
    """A size far beyond any published model of that shape (:data:`PUBLISHED_LIMITS`) is a typo."""
    errors = []
    for flag, _, limit, published in PUBLISHED_LIMITS:
        value = getattr(args, flag)
        if value > limit:
            errors.append(f"{flag_name(flag)} {value} is far beyond any published model ({published}; "
                          f"the plugin takes at most {limit:,}): a typo?")
    return errors


def model_memory(args, vocab_size=None):
    """(the float32 bytes the model's parameters take in training, the bytes of the largest activation of one
    forward of the configured batch, that activation described) of a model of ``args``.

    The parameters: embeddings (``vocab_size`` x D, where known), the position table (P x D) and each
    layer's attention (4 D^2), feed-forward (2 D FFN) and LayerNorms, with their gradients and Adam's two
    moments (:func:`~tupe_plugin.user_input.memory_limits.trained_bytes`); the largest activation: a layer's
    feed-forward hidden states (B x T x FFN), its q, k and v (B x T x 3 D) or a head's logits of every
    sequence where the encodings' relative vectors (Shaw, DeBERTa, Transformer-XL) are gathered into a
    (B, H, T, T) mask, as on the default paths (the other terms reach the kernels as an (H, T, T) bias at
    most, and the kernels compute the logits by blocks)."""
    dim, ffn, heads = args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_attention_heads
    layers = args.encoder_layers
    layer = 4 * dim * dim + 2 * dim * ffn + 9 * dim + ffn
    parameters = layers * layer + (args.max_positions + (vocab_size or 0)) * dim + dim * dim
    forward = forward_shape(args)
    activations = [(forward.tokens * ffn, f"feed-forward layer ({forward.describe()} x {ffn})"),
                   (forward.tokens * 3 * dim, f"q, k and v ({forward.describe()} x 3 x {dim})")]
    if _gathers_relative_terms(args):
        activations.append((forward.tokens * heads * forward.length,
                            f"relative terms gathered into a (B, H, T, T) mask ({forward.describe()} x "
                            f"{heads} heads x {forward.length})"))
    largest, described = max(activations)
    return trained_bytes(parameters), largest * FLOAT32, described


def _gathers_relative_terms(args):
    """Whether the position encodings of ``args`` add query-dependent relative vectors, which the default
    attention paths gather into a (B, H, T, T) mask (False where the position flags are not yet valid:
    their own check names them)."""
    try:
        config = PositionConfig(embed_dim=args.encoder_embed_dim, num_heads=args.encoder_attention_heads,
                                max_positions=args.max_positions,
                                **{flag: safe_getattr(args, flag, value) for flag, value in DEFAULTS.items()})
        return config.relative_vectors
    except Exception:  # an unknown choice: PositionConfig.check refuses it in words
        return False


def _model_memory_errors(args, vocab_size):
    """The whole model against the machine's memory (:func:`model_memory`), in one line naming the size flag
    farthest from its usual value (BERT-base's)."""
    memory = machine_memory()
    held, largest, described = model_memory(args, vocab_size)
    if memory is None or held + largest <= memory:
        return []
    sizes = [(getattr(args, flag) / usual, flag, usual) for flag, usual, _, _ in PUBLISHED_LIMITS]
    sizes.append((args.max_positions / USUAL_MAX_POSITIONS, "max_positions", USUAL_MAX_POSITIONS))
    _, flag, usual = max(sizes)
    forward = forward_shape(args)
    gib = 2**30
    return [f"{flag_name(flag)} {getattr(args, flag)} would need {(held + largest) / gib:,.1f} GiB: the "
            f"model's parameters with their gradients and Adam's two moments ({held / gib:,.1f} GiB) and the "
            f"largest activation of one forward of {forward.describe()}, its {described} "
            f"({largest / gib:,.1f} GiB), more than the {memory / gib:,.1f} GiB of memory of this machine: "
            f"a typo? ({usual} is BERT-base's)"]


def show_setting(setting, value):
    """How the command line gives ``setting`` = ``value`` when a flag of this module decides it
    (``--layernorm-embedding`` / ``--no-layernorm-embedding``), else None."""
    if setting == LAYERNORM_EMBEDDING:
        return "--layernorm-embedding" if value else "--no-layernorm-embedding"
    return None


def carry_setting(args, setting, value):
    """Set ``setting`` of ``args`` to ``value``, and the flag of this module that decides it."""
    setattr(args, setting, value)
    if setting == LAYERNORM_EMBEDDING:
        args.no_layernorm_embedding = not value
