#!/usr/bin/env python3
"""Real ``fairseq-train`` updates side by side: words/s from fairseq's own log.

``benchmarks/benchmark.py`` times one training step in one process; this times what users run. For
each repetition every contender runs ``fairseq-train`` for ``--updates`` updates on the same binarized data
(``--sample-break-mode none``, so every batch is full), contenders back to back in a rotated order
(repetition r starts with contender r), one process at a time. The words/s of a run is the median of the
``wps`` that fairseq logs for each update after the first ``--skip`` (start-up and warm-up); beside it the
run's CPU time (user + system of the process, steadier than wall time on a shared machine) and wall time.
Ratios to the baseline are paired within each repetition (``benchmarks/paired.py``): their median with
min-max, and the baseline's drift from its first repetition to its last.

    python benchmarks/benchmark_train.py DATA-BIN --contenders roberta bert_a tupe_r --repetitions 5
    python benchmarks/benchmark_train.py /tmp/random-bin --random-tokens 2000000 --device cuda --bf16 \
        --size base --batch-size 64 --contenders bert_a tupe_r

On a GPU (``--device cuda``, with fairseq's ``--bf16`` or ``--fp16``) the runs are fairseq-train on that
GPU; ``--random-tokens N`` first writes N random tokens as a binarized corpus into DATA-BIN (a machine
without a corpus: words/s do not depend on which tokens they are). ``--attention-backend`` is handed to
the plugin's contenders.

``--json`` gets the run in the format of ``benchmarks/results_file.py``; ``--results-dir
benchmarks/results`` keeps it there too, for ``benchmarks/report.py``.

Targets (attention dropout 0.1, the presets' setting): on CPU ``tupe_r`` at most 1.02 x ``bert_a``'s time
per word, and ``bert_a`` at most 0.90 x fairseq's ``roberta``; on a GPU ``tupe_r`` at least 0.95 x
``bert_a``'s words/s (at most 1 / 0.95 x its time per word); verdicts need 5 repetitions or more.
"""

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from benchmarks import paired, results_file  # noqa: E402
from tupe_plugin.attention.paths import ATTENTION_BACKENDS  # noqa: E402
from tupe_plugin.models.architectures import POSITION_PRESETS, SIZES  # noqa: E402

# (contender, reference, bound on time per word = reference's words/s over the contender's)
TARGETS = [("tupe_r", "bert_a", 1.02), ("bert_a", "roberta", 0.90)]
GPU_TARGETS = [("tupe_r", "bert_a", round(1 / 0.95, 4))]
WPS = re.compile(r"train_inner .*?wps=([0-9.]+)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="binarized masked-LM data (fairseq-preprocess --only-source), or with "
                        "--random-tokens the folder to write random data into")
    parser.add_argument("--random-tokens", type=int, metavar="N",
                        help="first write N random tokens into DATA as a binarized corpus (dict.txt, "
                        "train.bin/.idx; an existing corpus there is refused)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (fairseq-train --cpu) or cuda (the first GPU)")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_true", help="fairseq-train --fp16 (cuda)")
    precision.add_argument("--bf16", action="store_true", help="fairseq-train --bf16 (cuda)")
    parser.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                        help="--attention-backend of the plugin's contenders")
    parser.add_argument("--contenders", nargs="+", default=["roberta", "bert_a", "tupe_r"],
                        help="roberta and plugin presets (bert_a, tupe_r, ...)")
    parser.add_argument("--baseline", default="bert_a", help="contender the ratios divide by")
    parser.add_argument("--size", choices=sorted(SIZES), default="medium")
    parser.add_argument("--tokens-per-sample", type=int, default=512, metavar="T")
    parser.add_argument("--batch-size", type=int, default=4, metavar="B")
    parser.add_argument("--updates", type=int, default=12, help="fairseq-train updates per run")
    parser.add_argument("--skip", type=int, default=2, help="first updates left out of the median")
    parser.add_argument("--repetitions", type=int, default=paired.MIN_REPETITIONS,
                        help=f"verdicts need {paired.MIN_REPETITIONS} or more")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--attention-dropout", type=float, default=0.1)
    parser.add_argument("--json", default="benchmark_train.json", help="where to write the results")
    parser.add_argument("--results-dir", metavar="DIR",
                        help="also keep the run in DIR as benchmark_train-DATE-SETTING.json "
                        "(benchmarks/results: the files benchmarks/report.py makes the docs' tables from)")
    args = parser.parse_args(argv)
    if (args.fp16 or args.bf16) and args.device != "cuda":
        parser.error("--fp16 and --bf16 train on a GPU here: add --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    has_corpus = os.path.isfile(os.path.join(args.data, "dict.txt"))
    if args.random_tokens is not None and has_corpus:
        parser.error(f"--random-tokens: {args.data} holds a corpus already (dict.txt); name an empty or new "
                     "folder, or leave --random-tokens out to train on that corpus")
    if args.random_tokens is not None and args.random_tokens < 10 * args.tokens_per_sample:
        parser.error(f"--random-tokens must be at least 10 x --tokens-per-sample "
                     f"({10 * args.tokens_per_sample}), got {args.random_tokens}")
    if args.random_tokens is None and not has_corpus:
        parser.error(f"{args.data} holds no dict.txt: pass a fairseq-preprocess output folder "
                     "(make demo writes one), or --random-tokens N to write random data there")
    unknown = [c for c in args.contenders if c != "roberta" and c not in POSITION_PRESETS]
    if unknown:
        parser.error(f"unknown --contenders {unknown}: use roberta or one of {sorted(POSITION_PRESETS)}")
    if args.baseline not in args.contenders:
        parser.error(f"--baseline {args.baseline} is not among --contenders {args.contenders}")
    for flag in ("updates", "repetitions"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if not 0 <= args.skip < args.updates:
        parser.error(f"--skip must be in [0, --updates), got {args.skip}")
    return args


RANDOM_VOCABULARY = 30000


def write_random_corpus(folder, tokens, seed=0):
    """``tokens`` random word ids as fairseq-preprocess writes a corpus: dict.txt and train.bin/.idx,
    documents of 1000 tokens."""
    import numpy as np
    from fairseq.data import indexed_dataset

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "dict.txt"), "w", encoding="utf-8") as f:
        f.writelines(f"w{i} {RANDOM_VOCABULARY - i}\n" for i in range(RANDOM_VOCABULARY))
    prefix = os.path.join(folder, "train")
    first_word = 4  # after <s>, <pad>, </s>, <unk>
    builder = indexed_dataset.make_builder(indexed_dataset.data_file_path(prefix), "mmap",
                                           vocab_size=first_word + RANDOM_VOCABULARY)
    rng = np.random.default_rng(seed)
    for start in range(0, tokens, 1000):
        words = rng.integers(first_word, first_word + RANDOM_VOCABULARY, min(1000, tokens - start))
        builder.add_item(torch.from_numpy(np.append(words, 2)))  # each document ends with </s>
    builder.finalize(indexed_dataset.index_file_path(prefix))


def command(args, contender):
    layers, dim, heads, ffn = SIZES[args.size]
    arch = "roberta_base" if contender == "roberta" else f"{contender}_{args.size}"
    device = (["--cpu"] if args.device == "cpu" else ["--fp16"] if args.fp16
              else ["--bf16"] if args.bf16 else [])
    backend = [] if contender == "roberta" else ["--attention-backend", args.attention_backend]
    return [
        sys.executable, "-m", "fairseq_cli.train", args.data,
        "--user-dir", os.path.join(REPO, "tupe_plugin"), "--task", "masked_lm", "--criterion", "masked_lm",
        "--arch", arch, "--encoder-layers", layers, "--encoder-embed-dim", dim,
        "--encoder-attention-heads", heads, "--encoder-ffn-embed-dim", ffn,
        "--tokens-per-sample", args.tokens_per_sample, "--max-positions", args.tokens_per_sample,
        "--sample-break-mode", "none", "--batch-size", args.batch_size, "--max-update", args.updates,
        "--dropout", args.dropout, "--attention-dropout", args.attention_dropout,
        "--optimizer", "adam", "--lr", "1e-4", *device, *backend, "--seed", 1, "--no-save",
        "--disable-validation", "--log-format", "simple", "--log-interval", 1, "--num-workers", 0,
    ]


def run(args, contender):
    """One ``fairseq-train`` run: median wps after the first ``--skip`` updates, the process's CPU
    seconds (user + system) and wall seconds, and the command."""
    argv = [str(a) for a in command(args, contender)]
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    values = [float(v) for v in WPS.findall(proc.stdout)]
    if proc.returncode != 0 or len(values) < args.updates:
        raise SystemExit(f"fairseq-train for {contender} failed (exit {proc.returncode}, "
                         f"{len(values)} updates logged):\n{proc.stdout[-3000:]}\ncommand: {' '.join(argv)}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wps": statistics.median(values[args.skip:]), "cpu": cpu, "wall": wall}, " ".join(argv)


def spread(values, spec):
    low, high = format(min(values), spec), format(max(values), spec)
    return f"{format(statistics.median(values), spec)} [{low}–{high}]"


def time_per_word(runs):
    """{contender: seconds per word in each repetition} from {contender: words/s in each repetition}."""
    return {name: [1 / wps for wps in values] for name, values in runs.items()}


def target_row(name, reference, bound):
    """The row, not yet measured, of a target on ``name``'s time per word over ``reference``'s."""
    return {"target": f"{name} time per word / {reference}", "contender": name, "reference": reference,
            "measure": "time per word ratio", "unit": "x", "bound": bound}


def targets_of(device):
    """The targets of runs on ``device``: GPU_TARGETS on a GPU."""
    return GPU_TARGETS if device == "cuda" else TARGETS


def verdicts(runs, device="cpu"):
    """The targets' rows of ``device``: time per word paired within each repetition, with the verdict (None
    from fewer than paired.MIN_REPETITIONS repetitions)."""
    per_word, rows = time_per_word(runs), []
    for name, reference, bound in targets_of(device):
        if name in runs and reference in runs:
            values = paired.ratios(per_word[name], per_word[reference])
            rows.append({**target_row(name, reference, bound), **paired.summary(values),
                         "verdict": paired.verdict(values, bound)})
    return rows


def report(args, runs, cpu_seconds, wall_seconds):
    """Markdown tables and the verdicts: ratios of time per word (and of CPU time per run) paired
    within each repetition."""
    per_word = time_per_word(runs)
    base = args.baseline
    rows = ["| contender | words/s (median [min–max]) | CPU s per run | wall s per run "
            f"| time per word / {base} (paired) | CPU time / {base} (paired) |",
            "|---|---:|---:|---:|---:|---:|"]
    for name, values in runs.items():
        word = paired.summary(paired.ratios(per_word[name], per_word[base]))
        cpu = paired.summary(paired.ratios(cpu_seconds[name], cpu_seconds[base]))
        rows.append(f"| {name} | {spread(values, '.0f')} | {spread(cpu_seconds[name], '.1f')} "
                    f"| {spread(wall_seconds[name], '.1f')} | {paired.cell(word)} | {paired.cell(cpu)} |")
    rows += ["", f"Drift: {base}'s time per word, last repetition / first: "
             f"{paired.drift(per_word[base]):.3f} ×."]
    rows_of_targets = verdicts(runs, args.device)
    if args.repetitions < paired.MIN_REPETITIONS:
        rows += ["", f"Too few repetitions ({args.repetitions} < {paired.MIN_REPETITIONS}): "
                 "no verdict."]
    rows += ["", "| target | bound | measured (paired median [min–max]) | verdict |", "|---|---:|---:|---|"]
    for v in rows_of_targets:
        rows.append(f"| {v['target']} | {v['bound']:.2f} × | {paired.cell(v)} × "
                    f"| {paired.verdict_cell(v['verdict'])} |")
    return "\n".join(rows) + "\n", rows_of_targets


def main(argv=None):
    args = parse_args(argv)
    if args.random_tokens is not None:
        write_random_corpus(args.data, args.random_tokens)
    result = results_file.record("benchmark_train", __file__, argv, vars(args), args.device)
    runs = {name: [] for name in args.contenders}
    cpu_seconds = {name: [] for name in args.contenders}
    wall_seconds = {name: [] for name in args.contenders}
    commands = {}
    started = time.time()
    for repetition in range(args.repetitions):
        shift = repetition % len(args.contenders)
        for name in args.contenders[shift:] + args.contenders[:shift]:
            measured, commands[name] = run(args, name)
            runs[name].append(measured["wps"])
            cpu_seconds[name].append(measured["cpu"])
            wall_seconds[name].append(measured["wall"])
            print(f"repetition {repetition + 1}/{args.repetitions}: {name} {measured['wps']:.0f} words/s, "
                  f"{measured['cpu']:.1f} s CPU ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    markdown, targets = report(args, runs, cpu_seconds, wall_seconds)
    result["machine"]["load_average_after"] = os.getloadavg()
    result.update({
        "rounds": [results_file.repetitions(f"T={args.tokens_per_sample} B={args.batch_size}",
                                            "seconds per word (1 / median words/s of the run)", args.baseline,
                                            time_per_word(runs))],
        "words_per_second": runs, "cpu_seconds": cpu_seconds, "wall_seconds": wall_seconds,
        "targets": targets, "commands": commands, "markdown": markdown})
    results_file.write(result, args.json)
    print(markdown)
    if args.results_dir:
        path = results_file.save(result, args.results_dir, setting_tag(args))
        print(f"run kept as {path}", file=sys.stderr)
    return result


def setting_tag(args):
    """``cpu-medium-ad0.1-T512B4``, ``cuda-base-bf16-ad0.1-T512B64``: device, size, precision on a GPU,
    attention dropout, tokens per sample and batch size."""
    kind = (f"cpu-{args.size}" if args.device == "cpu"
            else f"cuda-{args.size}-{results_file.precision(vars(args))}")
    return f"{kind}-ad{args.attention_dropout}-T{args.tokens_per_sample}B{args.batch_size}"


if __name__ == "__main__":
    main()
