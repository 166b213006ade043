#!/usr/bin/env bash
# Kang et al. on CPU: pre-train a tiny model from random, raw pre-trained and standardised embeddings on the
# same data and print their validation losses side by side, with the embeddings-vs-positions diagnosis.
#
#   examples/demo.sh (corpus, sentencepiece, data-bin, a source model)
#   -> scripts/export_embeddings.py (its embeddings as word2vec text, times SCALE)
#   -> fairseq-train --arch $ARCH with --embed-init-standardize none / std / xavier, and without
#
# Settings, all optional, as environment variables:
#   ARCH            the compared architecture (default bert_a_tiny: a learned absolute PE added to
#                   the words, where Kang et al.'s absorption happens)
#   SOURCE_ARCH     the model whose embeddings are exported (default tupe_a_tiny)
#   SOURCE_UPDATES  its updates (default 300)
#   UPDATES         updates of each compared run (default 200)
#   SCALE           factor on the exported vectors (default 20: a plugin model's embeddings have
#                   std ~0.02, GloVe's ~0.4; SCALE=1 uses them as trained)
#   WORKDIR         folder for everything (default embed_init_demo/ in the repository)
#   PYTHON          the Python whose fairseq to use (default .venv/bin/python)
set -euo pipefail

die() { echo "embed_init.sh: error: $*" >&2; exit 1; }

ARCH=${ARCH:-bert_a_tiny}
SOURCE_ARCH=${SOURCE_ARCH:-tupe_a_tiny}
SOURCE_UPDATES=${SOURCE_UPDATES:-300}
UPDATES=${UPDATES:-200}
SCALE=${SCALE:-20}
PYTHON=${PYTHON:-.venv/bin/python}
WORKDIR=$(if [[ -n ${WORKDIR:-} ]]; then realpath -m "$WORKDIR"; else echo embed_init_demo; fi)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ -x $PYTHON ]] || die "no Python at $PYTHON: run 'make install' first, or set PYTHON="
BIN=$(dirname "$PYTHON")
[[ $UPDATES =~ ^[0-9]+$ ]] && (( UPDATES >= 1 )) || die "UPDATES must be a positive whole number"

mkdir -p "$WORKDIR"
printf '\n==== source model: examples/demo.sh, %s, %s updates ====\n' "$SOURCE_ARCH" "$SOURCE_UPDATES"
echo "(its log: $WORKDIR/source.log)"
WORKDIR=$WORKDIR/source ARCH=$SOURCE_ARCH UPDATES=$SOURCE_UPDATES PYTHON=$PYTHON bash examples/demo.sh \
    2>&1 | "$PYTHON" scripts/show_progress.py --total "$SOURCE_UPDATES" --label source \
    --log "$WORKDIR/source.log" || { tail -20 "$WORKDIR/source.log"; die "examples/demo.sh failed"; }
DATA_BIN=$WORKDIR/source/data-bin
VECTORS=$WORKDIR/vectors.txt
"$PYTHON" scripts/export_embeddings.py "$WORKDIR/source/$SOURCE_ARCH/checkpoints/checkpoint_last.pt" \
    --dict "$DATA_BIN/dict.txt" --scale "$SCALE" --out "$VECTORS"

train() {  # name, extra flags...
    local name=$1
    shift
    printf '\n==== %s: fairseq-train --arch %s %s ====\n' "$name" "$ARCH" "$*"
    rm -rf "$WORKDIR/checkpoints/$name"
    "$BIN/fairseq-train" "$DATA_BIN" --user-dir tupe_plugin \
        --task masked_lm --criterion masked_lm --arch "$ARCH" \
        --sample-break-mode complete --tokens-per-sample 128 \
        --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-6 --clip-norm 1.0 \
        --lr 5e-4 --lr-scheduler polynomial_decay --warmup-updates $(( UPDATES / 10 + 1 )) \
        --total-num-update "$UPDATES" --max-update "$UPDATES" --batch-size 16 \
        --log-format simple --log-interval 10 --save-dir "$WORKDIR/checkpoints/$name" \
        --no-epoch-checkpoints --no-save --seed 1 --num-workers 0 --cpu "$@" 2>&1 \
        | "$PYTHON" scripts/show_progress.py --total "$UPDATES" --label "$name" --log "$WORKDIR/$name.log" \
        || { tail -20 "$WORKDIR/$name.log"; die "training $name failed"; }
    grep -o "embed-init: .*\|embeddings vs positions .*" "$WORKDIR/$name.log" || true
}

train random
train raw --embed-init-path "$VECTORS" --embed-init-standardize none
train std --embed-init-path "$VECTORS" --embed-init-standardize std
train xavier --embed-init-path "$VECTORS" --embed-init-standardize xavier

printf '\n==== validation losses after %s updates (%s, vectors from %s x %s) ====\n' \
    "$UPDATES" "$ARCH" "$SOURCE_ARCH" "$SCALE"
WORKDIR=$WORKDIR "$PYTHON" - <<'PY'
import math
import os
import re
import sys

workdir = os.environ["WORKDIR"]
print(f"{'init':8} {'word/pos norm':>14} {'probe R^2':>10} {'valid loss':>11}")
for name in ("random", "raw", "std", "xavier"):
    with open(os.path.join(workdir, f"{name}.log"), encoding="utf-8") as f:
        log = f.read()
    losses = re.findall(r"valid on 'valid' subset \| loss ([^ ]+)", log)
    diagnosis = re.search(r"\(ratio ([^)]+)\).*held-out R\^2 ([-0-9.]+)", log)
    if not losses:
        sys.exit(f"embed_init.sh: error: no validation loss in {name}.log")
    ratio, r2 = diagnosis.groups() if diagnosis else ("n/a", "n/a")
    loss = float(losses[-1])
    if not math.isfinite(loss):
        sys.exit(f"embed_init.sh: error: validation loss of {name} is {loss}")
    print(f"{name:8} {ratio:>14} {r2:>10} {loss:>11.3f}")
print("(loss in bits per masked token; ratio = mean word norm / mean position norm at initialisation;")
print(" probe R^2 = how linearly recoverable the position is from word + position, 1 = fully)")
PY
echo "logs: $WORKDIR/{source,random,raw,std,xavier}.log"
