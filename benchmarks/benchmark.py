"""Side-by-side training-step benchmark: the plugin's architectures against fairseq's RoBERTa and a
plain reference attention, in one process, interleaved round-robin.

Every contender is built through fairseq's registry (``--task masked_lm --criterion masked_lm``,
``--arch``), gets the same random batch of the given shape (15 % of the tokens masked) and is timed
over full training steps: forward, masked-LM loss, backward, fairseq's Adam step. Contenders run in
turn, in a rotated order every round, so that load on a shared machine hits all of them alike. Ratios to
a baseline are paired within each round (``benchmarks/paired.py``): the median of the per-round ratios
with their min-max, wall time and the process's CPU time (steadier on a shared machine) side by side,
the baseline's drift from its first round to its last, and the performance targets with their verdicts.

Contenders (``--contenders``):

* ``roberta``: fairseq's own ``roberta_base`` resized to ``--size`` (layers, dim, heads, FFN);
* any plugin position preset (``bert_a``, ``tupe_a``, ``tupe_r``, ``bert_r``, ...), as ``PRESET_SIZE``;
* ``plain_PRESET``: the plugin model with every layer's attention replaced by the straightforward
  implementation: the content-free (H, T, T) term expanded to (B, H, T, T) with the padding once per
  forward and added to explicit ``softmax(q k^T * scale + bias) v`` logits in every layer;
* ``sdpa_PRESET``: the plugin model with every layer calling ``scaled_dot_product_attention``
  whatever the mask and dropout (before the per-forward kernel choice), for comparison;
* ``keys_PRESET``: a Shaw preset with ``--shaw-keys-only`` (``keys_bert_rpe``: the Shaw-keys row that
  DeBERTa, two such q-against-a-table terms per layer, is compared with);
* ``triton_PRESET``: the preset on ``--attention-backend triton``; for Shaw keys (``triton_keys_bert_rpe``)
  and DeBERTa (``triton_deberta``) the relative terms are formed inside the kernel from the table rows
  (q and k against the rows of each tile's offsets), and Shaw value vectors (``triton_bert_rpe``) from
  the kernel's sums of the probabilities by clipped distance.
* ``flex_PRESET``: the preset on ``--attention-backend flex`` (PyTorch's FlexAttention, compiled, the same
  terms in its score_mod; ``flex_keys_bert_rpe``, ``flex_deberta`` as for triton_): it has no attention
  dropout and no backward on CPU, so it runs with ``--attention-dropout 0 --device cuda`` only.
* ``cudnn_PRESET``: the preset on ``--attention-backend cudnn-graph``, cuDNN's fused attention built by the
  cuDNN frontend (``pip install nvidia-cudnn-frontend``; ``--device cuda`` with ``--bf16`` or ``--fp16``;
  not Shaw or DeBERTa presets).

Peak memory. On CUDA: ``torch.cuda.max_memory_allocated`` over one step. On CPU no allocator keeps
a peak, and RSS deltas mostly show glibc's caching; the step is instead run once more under
``torch.profiler`` with ``profile_memory=True``, which records every CPU tensor allocation and
free: the peak of their running sum is the step's transient memory (activations, gradients,
temporaries), to which the bytes already held at the start of the step (parameters and Adam
state) are added. The profiled step is not timed.

The positional term (``--positional-term``): the forward of the encoder's shared positional term
plus the mask it hands to every layer, timed alone, as a share of the median step.

Prints the markdown tables and writes everything (command, machine, commit, settings, every timing) to
``--json`` in the format of ``benchmarks/results_file.py``; ``--results-dir benchmarks/results`` keeps the
run there too, for ``benchmarks/report.py``.
"""

import argparse
import contextlib
import logging
import os
import re
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from benchmarks import paired, results_file  # noqa: E402
from tupe_plugin.models.architectures import SIZES  # noqa: E402
from tupe_plugin.attention.paths import AttentionPath, choose_path, fold_untied_term, plan_attention  # noqa: E402
from tupe_plugin.encodings.positional_term import PositionalTerm  # noqa: E402

PLUGIN_DIR = os.path.join(REPO, "tupe_plugin")
PLAIN_PREFIX = "plain_"
SDPA_PREFIX = "sdpa_"
TRITON_PREFIX = "triton_"
FLEX_PREFIX = "flex_"
CUDNN_PREFIX = "cudnn_"
SHAW_KEYS_PREFIX = "keys_"
# the prefixes of the contenders on another --attention-backend: (the backend, the kernel it runs)
BACKEND_PREFIXES = {TRITON_PREFIX: ("triton", "the Triton kernel"),
                    FLEX_PREFIX: ("flex", "FlexAttention"),
                    CUDNN_PREFIX: ("cudnn-graph", "cuDNN's graph")}
VARIANT_PREFIXES = (PLAIN_PREFIX, SDPA_PREFIX, *BACKEND_PREFIXES)
DEFAULT_CONTENDERS = ["roberta", "bert_a", "bert_r", "tupe_a", "tupe_r", "plain_tupe_r", "bert_rope",
                      "bert_alibi", "bert_alibi_asym", "bert_kerple", "bert_sandwich", "bert_fire",
                      "keys_bert_rpe", "deberta"]
# (what, contender, reference, bound, when: the (sequence length, attention dropout) it applies to, None
# for all, and how the verdict table says so)
ALWAYS = (None, "every run")
LONG = (lambda t, dropout: t >= 512, "T >= 512")
SHORT = (lambda t, dropout: t < 512, "T < 512")
WITH_DROPOUT = (lambda t, dropout: dropout > 0, "attention dropout > 0")
NO_DROPOUT = (lambda t, dropout: dropout == 0, "attention dropout 0")
# long sequences (tiny size, B = 1, one thread), against BERT without position (bert_nope), in CPU time
LONGEST = (lambda t, dropout: t >= 2048, "T >= 2048")
MEMORY_BOUND = (lambda t, dropout: t >= 4096, "T >= 4096")
TARGETS = [
    ("step time", "bert_a", "roberta", 1.02, ALWAYS),
    ("step time", "bert_a", "roberta", 0.90, WITH_DROPOUT),
    ("step time", "tupe_r", "bert_a", 1.05, LONG),
    ("step time", "tupe_r", "bert_a", 1.10, SHORT),
    ("step time", "tupe_r", "bert_a", 1.03, NO_DROPOUT),
    ("step time", "tupe_a", "bert_a", 1.05, LONG),
    ("step time", "tupe_a", "bert_a", 1.10, SHORT),
    ("step time", "tupe_r", "plain_tupe_r", 0.70, ALWAYS),
    ("step time", "tupe_r", "plain_tupe_r", 1.00, NO_DROPOUT),
    ("peak memory", "tupe_r", "bert_a", 1.05, ALWAYS),
    ("step time", "bert_rope", "bert_a", 1.03, LONG),
    ("step time", "bert_alibi", "bert_a", 1.03, LONG),
    ("peak memory", "bert_rope", "bert_a", 1.02, LONG),
    ("peak memory", "bert_alibi", "bert_a", 1.02, LONG),
    ("step time", "bert_sandwich", "bert_a", 1.03, LONG),
    ("step time", "deberta", "keys_bert_rpe", 1.00, ALWAYS),
    # a distance bias in its O(T) form costs O(H T^2) over attention's O(H T^2 d_h); TUPE-A its one untied
    # product (H, T, T) a forward (at 2 layers); TUPE-R's T5 part as little as BERT-R's (0.05 of bert_nope's
    # step over TUPE-A at TUPE-A's 1.25: 1.04 of TUPE-A's)
    *(("CPU time", name, "bert_nope", 1.10, LONGEST) for name in ("bert_r", "bert_kerple", "bert_fire")),
    *(("CPU time", name, "bert_nope", 1.05, LONGEST) for name in ("bert_alibi", "bert_sandwich")),
    ("CPU time", "tupe_a", "bert_nope", 1.25, LONGEST),
    ("CPU time", "tupe_r", "tupe_a", 1.04, LONGEST),
    ("CPU time", "deberta", "bert_nope", 2.00, LONGEST),
    *(("peak memory", name, "bert_nope", 1.05, MEMORY_BOUND)
      for name in ("bert_r", "bert_kerple", "bert_fire", "bert_alibi", "bert_sandwich")),
    ("peak memory", "deberta", "bert_nope", 1.15, MEMORY_BOUND),
]
# On a GPU (H100 / H200, base size, bf16 or fp16): TUPE's claim that its positional correlation costs
# almost nothing over BERT-A, the relative encodings' cost without (B, H, T, T) gathers, RoPE's rotation.
LEARNED_BIASES = ("tupe_r", "tupe_a", "bert_r")
SHAW_AND_DEBERTA = ("keys_bert_rpe", "bert_rpe", "deberta")
GPU_TARGETS = [
    *(("step time", name, "bert_a", 1.08, LONG) for name in LEARNED_BIASES),
    *(("step time", name, "bert_a", 1.05, SHORT) for name in LEARNED_BIASES),
    ("step time", "tupe_r", "bert_a", 1.03, (lambda t, dropout: t >= 512 and dropout == 0,
                                             "T >= 512, attention dropout 0")),
    *(("step time", name, "bert_a", 1.5, LONG) for name in SHAW_AND_DEBERTA),
    ("step time", "bert_rope", "bert_a", 1.03, LONG),
    *(("peak memory", name, "bert_a", 1.05, ALWAYS) for name in (*LEARNED_BIASES, "bert_rope")),
    *(("peak memory", name, "bert_a", 1.15, ALWAYS) for name in SHAW_AND_DEBERTA),
]
# the per-round times a time target pairs: wall time, or the process's CPU time (steadier on a shared machine)
TIMES = {"step time": "round_seconds", "CPU time": "round_cpu_seconds"}
POSITIONAL_TERM_SHARE_BOUND = 0.02
MASK_FRACTION = 0.15


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contenders", nargs="+", default=DEFAULT_CONTENDERS,
                        help="roberta, plugin presets (bert_a, tupe_r, ...), plain_PRESET, sdpa_PRESET, "
                        "triton_PRESET, flex_PRESET (with --attention-dropout 0 --device cuda), "
                        "cudnn_PRESET (--attention-backend cudnn-graph; CUDA, --bf16 or --fp16) and "
                        "keys_PRESET (a Shaw preset with --shaw-keys-only; triton_keys_PRESET, "
                        "flex_keys_PRESET on the Triton kernel, on FlexAttention)")
    parser.add_argument("--baseline", default="bert_a", help="contender the ratios divide by")
    parser.add_argument("--size", choices=sorted(SIZES), default="medium")
    parser.add_argument("--seq-lens", nargs="+", type=int, default=[128, 512], metavar="T")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=None, metavar="B",
                        help="one per --seq-lens (default: 8 at T <= 128, 2 * 512 / T tokens above)")
    parser.add_argument("--padding", type=float, default=0.0, metavar="F",
                        help="rows after the first are shortened by up to this fraction of T "
                        "(right padding); 0 = full rows, as masked_lm's blocks are")
    parser.add_argument("--vocab", type=int, default=32000, help="dictionary size")
    parser.add_argument("--rounds", type=int, default=5,
                        help=f"round-robin rounds (verdicts need {paired.MIN_REPETITIONS} or more)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per contender per round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per contender first")
    parser.add_argument("--dropout", type=float, default=0.1, help="--dropout of every contender")
    parser.add_argument("--attention-dropout", type=float, default=0.1,
                        help="--attention-dropout of every contender")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_true", help="autocast to float16 (cuda)")
    precision.add_argument("--bf16", action="store_true", help="autocast to bfloat16")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak memory step")
    parser.add_argument("--kernels", action="store_true",
                        help="also record which attention operators and GPU kernels one step of "
                        "each contender runs (SDPA backend: flash, efficient, cudnn or math)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile one step per contender and keep its N costliest ops "
                        "(self CPU time) in the JSON and on stderr")
    parser.add_argument("--json", default="benchmark.json", help="where to write the results")
    parser.add_argument("--results-dir", metavar="DIR",
                        help="also keep the run in DIR as benchmark-DATE-SETTING.json (benchmarks/results: "
                        "the files benchmarks/report.py makes the docs' tables from)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.batch_sizes is None:
        args.batch_sizes = [max(1, 8 * 128 // max(t, 128)) if t <= 128 else max(1, 1024 // t)
                            for t in args.seq_lens]
    if len(args.batch_sizes) != len(args.seq_lens):
        parser.error(f"--batch-sizes needs one value per --seq-lens ({len(args.seq_lens)})")
    for flag in ("rounds", "steps"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, got {args.warmup}")
    if args.baseline not in args.contenders:
        parser.error(f"--baseline {args.baseline} is not among --contenders {args.contenders}")
    if not 0 <= args.padding < 1:
        parser.error("--padding must be in [0, 1)")
    if args.fp16 and args.device == "cpu":
        parser.error("--fp16 needs --device cuda (use --bf16 on CPU)")
    flex = [name for name in args.contenders if name.startswith(FLEX_PREFIX)]
    if flex and args.attention_dropout > 0:
        parser.error(f"--contenders {flex[0]} runs --attention-backend flex, which has no attention dropout: "
                     f"add --attention-dropout 0 (got {args.attention_dropout})")
    if flex and not args.device.startswith("cuda"):
        parser.error(f"--contenders {flex[0]} runs --attention-backend flex, which trains on CUDA only: "
                     "add --device cuda")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no CUDA device")
    on_cudnn = [name for name in args.contenders if name.startswith(CUDNN_PREFIX)]
    if on_cudnn and not (args.device.startswith("cuda") and (args.fp16 or args.bf16)):
        parser.error(f"--contenders {' '.join(on_cudnn)}: cuDNN's fused attention runs on CUDA in fp16 or "
                     "bf16: add --device cuda and --bf16 (or --fp16)")
    return args


def preset_of(name):
    """The preset of a contender, without its prefixes (``triton_keys_bert_rpe``: ``bert_rpe``)."""
    for prefix in VARIANT_PREFIXES + (SHAW_KEYS_PREFIX,):
        if name.startswith(prefix):
            return preset_of(name[len(prefix):])
    return name


def backend_prefix(name):
    """The prefix of another --attention-backend a contender starts with (``triton_``, ``flex_``, ``cudnn_``),
    or None."""
    return next((prefix for prefix in BACKEND_PREFIXES if name.startswith(prefix)), None)


def shaw_keys_only(name):
    """Whether a contender adds --shaw-keys-only (``keys_PRESET``, also behind ``triton_`` or ``flex_``)."""
    return name.removeprefix(backend_prefix(name) or "").startswith(SHAW_KEYS_PREFIX)


def check_contender(name):
    from tupe_plugin.models.architectures import POSITION_PRESETS

    preset = preset_of(name)
    if name != "roberta" and preset not in POSITION_PRESETS:
        raise SystemExit(f"unknown contender {name!r} in --contenders: use roberta, one of "
                         f"{sorted(POSITION_PRESETS)}, or plain_ / sdpa_ / triton_ / flex_ / cudnn_ / "
                         "keys_ + one of them")
    if name.startswith((PLAIN_PREFIX, SDPA_PREFIX)) and shaw_preset(preset):
        raise SystemExit(f"--contenders {name}: the plain and SDPA variants cover content-free "
                         "terms; Shaw presets choose their own attention path")
    prefix = backend_prefix(name)
    if prefix == CUDNN_PREFIX and (shaw_preset(preset) or preset_config(preset).deberta):
        raise SystemExit(f"--contenders {name}: cuDNN's graph takes one bias shared by the batch, not Shaw's "
                         f"or DeBERTa's terms: the {TRITON_PREFIX} variant reads them")
    if prefix == FLEX_PREFIX and shaw_preset(preset) and not shaw_keys_only(name):
        raise SystemExit(f"--contenders {name}: {BACKEND_PREFIXES[prefix][1]} adds Shaw keys, not value "
                         f"vectors: {prefix}{SHAW_KEYS_PREFIX}{preset}")
    if shaw_keys_only(name) and not shaw_preset(preset):
        raise SystemExit(f"--contenders {name}: keys_ adds --shaw-keys-only to a Shaw preset (bert_rpe, "
                         f"bert_sin_rpe, ...), and {preset} has no Shaw vectors")


def preset_config(preset):
    """The position config of a preset (at a tiny size: what its encodings are, not their sizes)."""
    from tupe_plugin.models.architectures import POSITION_PRESETS
    from tupe_plugin.encodings.position_config import PositionConfig

    return PositionConfig(embed_dim=8, num_heads=2, max_positions=8, **POSITION_PRESETS[preset])


def shaw_preset(preset):
    return preset_config(preset).shaw_table is not None


# ---------------------------------------------------------------------------- building contenders

def fairseq_setup(name, size, seq_len, data_dir, dropout, attention_dropout):
    """Model, criterion and optimizer built the way fairseq-train builds them."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    layers, dim, heads, ffn = SIZES[size]
    arch = "roberta_base" if name == "roberta" else f"{preset_of(name)}_{size}"
    argv = [data_dir, "--user-dir", PLUGIN_DIR, "--task", "masked_lm", "--criterion", "masked_lm",
            "--arch", arch, "--encoder-layers", layers, "--encoder-embed-dim", dim,
            "--encoder-attention-heads", heads, "--encoder-ffn-embed-dim", ffn,
            "--max-positions", seq_len, "--tokens-per-sample", seq_len,
            "--dropout", dropout, "--attention-dropout", attention_dropout,
            "--optimizer", "adam", "--lr", "1e-4", "--cpu"]
    if shaw_keys_only(name):
        argv.append("--shaw-keys-only")
    if backend_prefix(name):
        argv += ["--attention-backend", BACKEND_PREFIXES[backend_prefix(name)][0]]
    parser = options.get_training_parser()
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(parser, input_args=[str(a) for a in argv]))
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    if name.startswith(PLAIN_PREFIX):
        make_plain_reference(model)
    if name.startswith(SDPA_PREFIX):
        make_always_sdpa(model)
    criterion = task.build_criterion(cfg.criterion)
    return task, model, criterion, cfg


def write_dictionary(data_dir, vocab):
    with open(os.path.join(data_dir, "dict.txt"), "w", encoding="utf-8") as f:
        for i in range(vocab):
            f.write(f"w{i} {vocab - i}\n")


class PlainPositionalTerm(nn.Module):
    """The shared term's interface (``build``) around the plugin's term (its tables and config),
    straightforwardly: the dense (H, T, T) content-free logits plus padding, materialised per batch row,
    whatever the plan."""

    def __init__(self, shared):
        super().__init__()
        self.shared = shared
        self.config = shared.config

    def content_free(self, forward):
        return self.shared.content_free(forward)

    def forward_of(self, batch, seq_len, device=None):
        return self.shared.forward_of(batch, seq_len, device)

    def build(self, forward, fold_untied=False, key_padding_mask=None, dtype=torch.float32,
              padding_as_lengths=False, offset_bias_as_rows=False):
        term = self.content_free(forward)
        bias = term.dense()
        batch = 1 if key_padding_mask is None else key_padding_mask.size(0)
        mask = None
        if bias is not None:
            mask = bias.to(dtype)[None].expand(batch, -1, -1, -1).contiguous()
        if key_padding_mask is not None:
            padding = torch.zeros(key_padding_mask.shape, dtype=dtype, device=key_padding_mask.device)
            padding = padding.masked_fill(key_padding_mask, float("-inf"))[:, None, None, :]
            mask = padding if mask is None else mask + padding
        return PositionalTerm(scale=term.scale, attn_mask=mask)


class PlainSelfAttention(nn.Module):
    """softmax(q k^T * scale + mask) v, step by step, with the plugin layer's own weights."""

    def __init__(self, fused):
        super().__init__()
        self.num_heads, self.head_dim = fused.num_heads, fused.head_dim
        self.in_proj, self.out_proj = fused.in_proj, fused.out_proj

    def forward(self, x, term, plan, need_weights=False):
        batch, seq_len, embed_dim = x.shape
        qkv = self.in_proj(x).view(batch, seq_len, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        logits = torch.matmul(q, k.transpose(-1, -2)) * term.scale
        if term.attn_mask is not None:
            logits = logits + term.attn_mask
        probs = torch.softmax(logits, -1)
        out = torch.matmul(F.dropout(probs, plan.dropout), v)
        out = out.transpose(1, 2).reshape(batch, seq_len, embed_dim)
        return self.out_proj(out), probs if need_weights else None


class AlwaysSdpaPlan:
    """An encoder's attention plan with the SDPA path whatever the device and dropout (its math fallback
    included): the plugin's attention before kernels were chosen per forward."""

    def __init__(self, encoder):
        self.plan = encoder.attention_plan
        self.config = encoder.config

    def __call__(self, device, need_attn, seq_len, per_sequence=False):
        return replace(self.plan(device, need_attn, seq_len, per_sequence), path=AttentionPath.SDPA,
                       fold_untied=fold_untied_term(AttentionPath.SDPA, self.config))


def make_always_sdpa(model):
    """Make every layer of a plugin model call SDPA whatever the mask and dropout, in place."""
    encoder = model.encoder.sentence_encoder
    if encoder.config.shaw_values:
        raise ValueError("Shaw value vectors need the probabilities: no SDPA variant")
    encoder.attention_plan = AlwaysSdpaPlan(encoder)
    return model


def make_plain_reference(model):
    """Swap the fused attention of a plugin model for the plain reference, in place."""
    encoder = model.encoder.sentence_encoder
    if encoder.config.shaw_table is not None:
        raise ValueError("the plain reference does not implement Shaw relative vectors")
    encoder.positional_term = PlainPositionalTerm(encoder.positional_term)
    for layer in encoder.layers:
        layer.self_attn = PlainSelfAttention(layer.self_attn)
    return model


def random_batch(dictionary, batch, seq_len, padding, generator):
    """A masked_lm sample: <s> + random words, 15 % of the non-pad tokens masked."""
    tokens = torch.randint(dictionary.nspecial, len(dictionary) - 1, (batch, seq_len),
                           generator=generator)
    tokens[:, 0] = dictionary.bos()
    for row in range(1, batch):
        short = int(torch.randint(0, int(padding * seq_len) + 1, (1,), generator=generator))
        if short:
            tokens[row, seq_len - short:] = dictionary.pad()
    real = tokens.ne(dictionary.pad())
    real[:, 0] = False
    masked = (torch.rand(tokens.shape, generator=generator) < MASK_FRACTION) & real
    masked[0, 1] = True
    target = torch.where(masked, tokens, torch.full_like(tokens, dictionary.pad()))
    source = tokens.masked_fill(masked, dictionary.index("<mask>"))
    return {"net_input": {"src_tokens": source}, "target": target,
            "ntokens": int(real.sum()), "nsentences": batch}


class Contender:
    """One model with its criterion, optimizer and the step the benchmark times."""

    def __init__(self, name, size, seq_len, data_dir, args):
        from fairseq import optim

        self.name = name
        self.seq_len = seq_len
        torch.manual_seed(args.seed)
        self.task, self.model, self.criterion, cfg = fairseq_setup(
            name, size, seq_len, data_dir, args.dropout, args.attention_dropout)
        self.model.to(args.device).train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = optim.build_optimizer(cfg.optimizer, self.params)
        self.device = args.device
        self.autocast = torch.autocast(
            device_type=torch.device(args.device).type,
            dtype=torch.float16 if args.fp16 else torch.bfloat16,
            enabled=args.fp16 or args.bf16,
        )
        self.scaler = torch.amp.GradScaler(enabled=args.fp16)
        self.times = []
        self.cpu_times = []

    def step(self, sample):
        self.optimizer.zero_grad()
        with self.autocast:
            loss, sample_size, _ = self.criterion(self.model, sample)
        self.scaler.scale(loss / sample_size).backward()
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer.optimizer)
            self.scaler.step(self.optimizer.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        return loss

    def timed_step(self, sample):
        synchronize(self.device)
        cpu_start, start = time.process_time(), time.perf_counter()
        self.step(sample)
        synchronize(self.device)
        self.times.append(time.perf_counter() - start)
        self.cpu_times.append(time.process_time() - cpu_start)

    def held_bytes(self):
        """Bytes of parameters and optimizer state held between steps, and the storage a plugin model keeps
        for its next untied product (written there, it is allocated by no step)."""
        tensors = list(self.params)
        for state in self.optimizer.optimizer.state.values():
            tensors += [t for t in state.values() if torch.is_tensor(t)]
        memory = product_memory(self.model)
        kept = 0 if memory is None else memory.held_bytes()
        return kept + sum(t.numel() * t.element_size() for t in tensors)

    def peak_bytes(self, sample):
        """Peak bytes during one step (see the module docstring for how, on CPU)."""
        self.optimizer.zero_grad()
        if self.device != "cpu":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.step(sample)
            synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device)
        held = self.held_bytes()
        with native_stderr_silenced(), torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            self.step(sample)
        return held + peak_of_allocations(prof)

    def profiled_step(self, sample):
        """torch.profiler's record of one step: CPU activity, and the GPU's kernels on a GPU."""
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device != "cpu":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with native_stderr_silenced(), torch.profiler.profile(activities=activities) as prof:
            self.step(sample)
            synchronize(self.device)
        return prof

    def profile(self, sample, top):
        """The ``top`` operators of one step as a printable table: by self CPU time on CPU, by self
        device time on a GPU (where the CPU only launches the kernels)."""
        order = "self_cpu_time_total" if self.device == "cpu" else "self_device_time_total"
        return self.profiled_step(sample).key_averages().table(sort_by=order, row_limit=top)

    def attention_path(self):
        """The attention path every layer takes in the timed (training) steps."""
        if self.name == "roberta":
            return "fairseq MultiheadAttention"
        if self.name.startswith(PLAIN_PREFIX):
            return "plain reference (explicit)"
        encoder = self.model.encoder.sentence_encoder
        path = AttentionPath.SDPA if self.name.startswith(SDPA_PREFIX) else choose_path(
            self.device, encoder.attention_dropout, False, encoder.config, self.seq_len,
            encoder.attention_backend)
        return path.value

    def attention_kernels(self, sample):
        """Attention operators (aten) and GPU kernels one step runs, with their call counts: which
        ``scaled_dot_product_attention`` backend was picked (flash / efficient / cudnn / math), or
        none for the explicit path."""
        return attention_events(self.profiled_step(sample))

    def positional_term_seconds(self, sample, repeats):
        """Median forward time of the shared term and its mask (plugin contenders only), each build finding
        the storage a training step's backward leaves for the next untied product
        (:mod:`tupe_plugin.encodings.untied_product`)."""
        if self.name == "roberta":
            return None
        encoder = self.model.encoder.sentence_encoder
        tokens = sample["net_input"]["src_tokens"]
        # the dtype the encoder builds its mask in: its activations' (float32 under autocast), not
        # the autocast dtype (a bf16 mask here timed a cast the model does not do)
        dtype = encoder.embed_tokens.weight.dtype
        memory = product_memory(self.model)
        times = []
        for _ in range(repeats + 1):
            synchronize(self.device)
            start = time.perf_counter()
            with self.autocast:
                plan = plan_attention(self.device, encoder.attention_dropout, False, encoder.config,
                                      tokens.size(1))
                term = encoder.positional_term.build(tokens.size(1), plan.fold_untied,
                                                     encoder.padding_mask(tokens), dtype,
                                                     plan.padding_as_lengths, plan.offset_bias_as_rows)
            synchronize(self.device)
            times.append(time.perf_counter() - start)
            if memory is not None and term.attn_mask is not None:  # as the backward leaves its gradient's
                memory.keep(term.attn_mask)
            del term
        return statistics.median(times[1:])


def product_memory(model):
    """The :class:`~tupe_plugin.encodings.untied_product.ProductMemory` of a plugin model's shared term, or
    None (fairseq's RoBERTa, the plain reference's term)."""
    term = getattr(model.encoder.sentence_encoder, "positional_term", None)
    return getattr(term, "product_memory", None)


@contextlib.contextmanager
def native_stderr_silenced():
    """Send file descriptor 2 to /dev/null for the block: torch 2.13's profiler prints a
    ``USDT: ... profiler_start`` / ``profiler_stop`` line from C++ on every start and stop. Python
    exceptions raised inside the block are printed after it, with stderr restored."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


ATTENTION_EVENT = re.compile(r"scaled_dot_product|flash|efficient_attention|fmha|cudnn|sdpa|attention",
                             re.IGNORECASE)


def attention_events(prof):
    """{event name: calls} of the profiled attention operators and kernels (names shortened to
    their first 120 characters: CUDA kernel names carry long template arguments)."""
    counts = {}
    for event in prof.events():
        if ATTENTION_EVENT.search(event.name):
            name = event.name[:120]
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def peak_of_allocations(prof):
    """Peak of the running sum of CPU allocations (+) and frees (-) the profiler recorded."""
    events = [e for e in prof.profiler.kineto_results.events()
              if e.device_type() == torch.autograd.DeviceType.CPU and e.nbytes() != 0]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def synchronize(device):
    if device != "cpu":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------- measuring

def measure_shape(args, seq_len, batch, data_dir, log):
    """({contender: its timings and measures}, {contender left out: its error}) at one shape."""
    failed = {}

    def left_out(name, error):
        """A contender that fails to build or to run its warm-up is left out, the baseline not."""
        if name == args.baseline:
            raise error
        failed[name] = f"{type(error).__name__}: {error}"
        log(f"  T={seq_len} B={batch}: {name} left out: {failed[name]}")

    contenders = []
    for name in args.contenders:
        try:
            contenders.append(Contender(name, args.size, seq_len, data_dir, args))
        except Exception as error:  # noqa: BLE001 - any failure of a contender is reported
            left_out(name, error)
    generator = torch.Generator().manual_seed(args.seed)
    sample = random_batch(contenders[0].task.source_dictionary, batch, seq_len, args.padding,
                          generator)
    sample = move(sample, args.device)
    for contender in list(contenders):
        try:
            for _ in range(args.warmup):
                contender.step(sample)
        except Exception as error:  # noqa: BLE001
            left_out(contender.name, error)
            contenders.remove(contender)
    for round_index in range(args.rounds):
        shift = round_index % len(contenders)
        for contender in contenders[shift:] + contenders[:shift]:
            for _ in range(args.steps):
                contender.timed_step(sample)
        log(f"  T={seq_len} B={batch} round {round_index + 1}/{args.rounds}, medians so far: " + ", ".join(
            f"{c.name} {1e3 * statistics.median(c.times):.0f} ms" for c in contenders))
    results = {}
    for contender in contenders:
        step = statistics.median(contender.times)
        term = contender.positional_term_seconds(sample, repeats=max(10, args.rounds))
        results[contender.name] = {
            "step_seconds": contender.times,
            "cpu_step_seconds": contender.cpu_times,
            "round_seconds": per_round(contender.times, args.steps),
            "round_cpu_seconds": per_round(contender.cpu_times, args.steps),
            "median_step_seconds": step,
            "tokens_per_second": batch * seq_len / step,
            "positional_term_seconds": term,
            "positional_term_share": None if term is None else term / step,
            "attention_path": contender.attention_path(),
            "peak_bytes": None if args.no_memory else contender.peak_bytes(sample),
            "parameters": sum(p.numel() for p in contender.params),
        }
        if args.kernels:
            results[contender.name]["attention_kernels"] = contender.attention_kernels(sample)
            log(f"attention of {contender.name} at T={seq_len}: "
                f"{results[contender.name]['attention_kernels']}")
        if args.profile:
            results[contender.name]["profile"] = contender.profile(sample, args.profile)
            log(f"profile of {contender.name} at T={seq_len}:\n{results[contender.name]['profile']}")
    return results, failed


def per_round(times, steps):
    """The median step of each round (a round's ``steps`` timings are consecutive)."""
    return [statistics.median(times[i:i + steps]) for i in range(0, len(times), steps)]


def move(sample, device):
    if device == "cpu":
        return sample
    return {k: move(v, device) if isinstance(v, dict) else
            v.to(device) if torch.is_tensor(v) else v for k, v in sample.items()}


def memory_ratio(results, name, reference):
    """Peak memory of ``name`` over ``reference``'s (one measurement each), or None."""
    if name not in results or reference not in results:
        return None
    value, base = results[name]["peak_bytes"], results[reference]["peak_bytes"]
    return None if value is None or base is None else value / base


def paired_ratio(results, name, reference, key="round_seconds"):
    """:func:`paired.summary` of ``name``'s per-round times over ``reference``'s, or None."""
    if name not in results or reference not in results:
        return None
    return paired.summary(paired.ratios(results[name][key], results[reference][key]))


def single_verdict(value, bound):
    """Met or missed, for a measure taken once (peak memory) or outside the rounds (positional term)."""
    return paired.MET if value <= bound else paired.MISSED


def targets_of(device):
    """The targets of runs on ``device`` (``cpu``, ``cuda``, ``cuda:1``): GPU_TARGETS on a GPU."""
    return GPU_TARGETS if str(device).startswith("cuda") else TARGETS


def target_rows(seq_len, attention_dropout, device="cpu"):
    """(what, row) of every target of ``device`` that applies at this length and attention dropout, the
    row not yet measured."""
    for what, name, reference, bound, (applies, when) in targets_of(device):
        if applies is None or applies(seq_len, attention_dropout):
            yield what, {"seq_len": seq_len, "target": f"{name} {what} / {reference}", "contender": name,
                         "reference": reference, "measure": f"{what} ratio ({when})", "unit": "x",
                         "bound": bound}


def share_row(seq_len, name, bound=POSITIONAL_TERM_SHARE_BOUND):
    """The row, not yet measured, of the target on ``name``'s positional term share of its step."""
    return {"seq_len": seq_len, "target": f"{name} positional term / step", "contender": name,
            "reference": f"{name}'s own step", "measure": "positional term share", "unit": "%",
            "bound": bound}


def verdicts(shapes, rounds, attention_dropout, bound_share=POSITIONAL_TERM_SHARE_BOUND, device="cpu"):
    """The targets' rows for runs at ``attention_dropout`` on ``device``: step times paired per round
    (``ratio`` is their median, with ``min`` and ``max``); ``verdict`` is None from fewer than
    paired.MIN_REPETITIONS rounds."""
    rows = []
    for shape in shapes:
        results, seq_len = shape["results"], shape["seq_len"]
        for what, row in target_rows(seq_len, attention_dropout, device):
            name, reference, bound = row["contender"], row["reference"], row["bound"]
            if what in TIMES:
                stats = paired_ratio(results, name, reference, TIMES[what])
                if stats is not None:
                    rows.append({**row, **stats, "ratio": stats["median"],
                                 "verdict": paired.verdict(stats["ratios"], bound)})
            else:
                value = memory_ratio(results, name, reference)
                if value is not None:
                    rows.append({**row, "ratio": value, "verdict": single_verdict(value, bound)})
        for name, result in results.items():
            share = result["positional_term_share"]
            if share is not None and preset_of(name) == name and name != "bert_a":
                rows.append({**share_row(seq_len, name, bound_share), "ratio": share,
                             "verdict": single_verdict(share, bound_share)})
    if rounds < paired.MIN_REPETITIONS:
        for row in rows:
            row["verdict"] = None
    return rows


def spread(values, factor=1e3):
    """``median [min-max]`` of a list of seconds, in ms."""
    return (f"{factor * statistics.median(values):.1f} "
            f"[{factor * min(values):.0f}–{factor * max(values):.0f}]")


def markdown(report):
    baseline = report["settings"]["baseline"]
    lines = []
    for shape in report["shapes"]:
        lines += [f"T = {shape['seq_len']}, B = {shape['batch']}", "",
                  "| contender | attention path | step (ms, median [min–max]) | CPU (ms, median) | tokens/s "
                  f"| peak memory (MiB) | step / {baseline} (paired) | CPU / {baseline} (paired) "
                  f"| memory / {baseline} | positional term (% of step) |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        results = shape["results"]
        for name, r in results.items():
            step = paired_ratio(results, name, baseline)
            cpu = paired_ratio(results, name, baseline, "round_cpu_seconds")
            lines.append(
                f"| {name} | {r['attention_path']} | {spread(r['step_seconds'])} "
                f"| {1e3 * statistics.median(r['cpu_step_seconds']):.1f} | {r['tokens_per_second']:.0f} "
                f"| {fmt(r['peak_bytes'], 2 ** -20, '.0f')} | {paired.cell(step)} | {paired.cell(cpu)} "
                f"| {fmt(memory_ratio(results, name, baseline), 1, '.3f')} "
                f"| {fmt(r['positional_term_share'], 100, '.2f')} |")
        drift = paired.drift(results[baseline]["round_seconds"])
        lines += ["", f"Drift: {baseline}'s step, last round / first: {drift:.3f} ×.", ""]
        lines += [f"- {name} left out: {error}" for name, error in shape.get("failed", {}).items()]
        lines += [""] if shape.get("failed") else []
    rounds = report["settings"]["rounds"]
    if rounds < paired.MIN_REPETITIONS:
        lines += [f"Too few rounds ({rounds} < {paired.MIN_REPETITIONS}): the ratios below carry no "
                  "verdict; rerun with --rounds 5 or more on a quiet machine.", ""]
    lines += ["| T | contender | reference | measure | bound | measured | verdict |",
              "|---:|---|---|---|---:|---:|---|"]
    for row in report["targets"]:
        if row["unit"] == "%":
            bound, measured = f"{100 * row['bound']:.2f} %", f"{100 * row['ratio']:.2f} %"
        elif "ratios" in row:
            bound, measured = f"{row['bound']:.2f} ×", f"{paired.cell(row)} ×"
        else:
            bound, measured = f"{row['bound']:.2f} ×", f"{row['ratio']:.3f} ×"
        lines.append(f"| {row['seq_len']} | {row['contender']} | {row['reference']} | {row['measure']} "
                     f"| {bound} | {measured} | {paired.verdict_cell(row['verdict'])} |")
    return "\n".join(lines) + "\n"


def fmt(value, factor, spec):
    return "–" if value is None else format(value * factor, spec)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    previous_disable = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return measure(args, argv)
    finally:
        logging.disable(previous_disable)


def measure(args, argv):
    """Every shape's contenders, the verdicts and the report (logging quietened by :func:`main`)."""
    for name in args.contenders:
        check_contender(name)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    report = {**results_file.record("benchmark", __file__, argv, vars(args), args.device), "shapes": []}
    log(f"benchmark on {report['machine']}")
    with tempfile.TemporaryDirectory() as data_dir:
        write_dictionary(data_dir, args.vocab)
        for seq_len, batch in zip(args.seq_lens, args.batch_sizes):
            results, failed = measure_shape(args, seq_len, batch, data_dir, log)
            report["shapes"].append({"seq_len": seq_len, "batch": batch, "results": results,
                                     "failed": failed})
    report["machine"]["load_average_after"] = os.getloadavg()
    report["rounds"] = [results_file.repetitions(
        f"T={shape['seq_len']} B={shape['batch']}", "seconds per step (median of the round's steps)",
        args.baseline, {name: r["round_seconds"] for name, r in shape["results"].items()})
        for shape in report["shapes"]]
    report["targets"] = verdicts(report["shapes"], args.rounds, args.attention_dropout, device=args.device)
    report["markdown"] = markdown(report)
    results_file.write(report, args.json)
    print(report["markdown"])
    log(f"results written to {args.json}")
    if args.results_dir:
        log(f"run kept as {results_file.save(report, args.results_dir, setting_tag(args))}")
    return report


def setting_tag(args):
    """``cpu-fp32-medium-ad0.1-T128B8-T512B2``: device, precision, size, attention dropout, shapes."""
    shapes = "-".join(f"T{t}B{b}" for t, b in zip(args.seq_lens, args.batch_sizes))
    device, precision = args.device.split(":")[0], results_file.precision(vars(args))
    return f"{device}-{precision}-{args.size}-ad{args.attention_dropout}-{shapes}"


if __name__ == "__main__":
    main()
