#!/usr/bin/env bash
# Pre-train a tiny TUPE-R encoder on CPU, end to end (its summary prints the time it took).
#
#   build corpus -> train sentencepiece -> fairseq-preprocess
#   -> fairseq-train (masked LM) -> fairseq-validate -> compare losses
#   -> pictures and property metrics of the learned positions
#
# Usually run as `make demo`; works from any folder (it runs from the
# repository root; relative CORPUS and WORKDIR are taken from where you are).
# Settings, all optional, as environment variables:
#   CORPUS      a UTF-8 text file to train on (default: the docstrings of the
#               Python standard library, built locally, no download)
#   ARCH        fairseq --arch (default tupe_r_tiny: 2 layers, d 128, 4 heads)
#   UPDATES     number of training updates, at least 10 (default 400)
#   WORKDIR     folder for everything the demo writes (default: demo/ in the
#               repository). The data (corpus, spm, data-bin) are shared by all
#               architectures; each run writes into WORKDIR/ARCH/ (checkpoints,
#               tensorboard, train.log, valid.log, analysis), so a demo of another
#               architecture leaves the previous one alone
#   TRAIN_ARGS  extra fairseq-train flags, e.g. TRAIN_ARGS='--dropout 0.2'
#   PYTHON      the Python whose fairseq to use (default .venv/bin/python)
#
# Corpus, sentencepiece model and data-bin are reused when WORKDIR already has
# them; training always starts afresh (in WORKDIR/ARCH only). Exits non-zero when the validation loss
# is not finite or not below the first logged training loss.
set -euo pipefail

step() { printf '\n==== %s ====\n' "$*"; }
die() { echo "demo.sh: error: $*" >&2; exit 1; }

ARCH=${ARCH:-tupe_r_tiny}
UPDATES=${UPDATES:-400}
TRAIN_ARGS=${TRAIN_ARGS:-}
PYTHON=${PYTHON:-.venv/bin/python}
CORPUS=${CORPUS:-}
if [[ -n $CORPUS ]]; then
    [[ -f $CORPUS ]] || die "CORPUS=$CORPUS: file not found; give the path of a UTF-8 text file"
    SOURCE=$(realpath "$CORPUS")
else
    SOURCE="python standard-library docstrings"
fi
WORKDIR=$(if [[ -n ${WORKDIR:-} ]]; then realpath -m "$WORKDIR"; else echo demo; fi)
cd "$(dirname "${BASH_SOURCE[0]}")/.."

[[ -x $PYTHON ]] || die "no Python at $PYTHON: run 'make install' first, or set PYTHON="
BIN=$(dirname "$PYTHON")
[[ $UPDATES =~ ^[0-9]+$ ]] && (( UPDATES >= 10 )) ||
    die "UPDATES must be a whole number of at least 10 (the log interval), got '$UPDATES'"
read -r -a EXTRA_TRAIN_ARGS <<< "$TRAIN_ARGS"

CORPUS_DIR=$WORKDIR/corpus
SPM_DIR=$WORKDIR/spm
DATA_BIN=$WORKDIR/data-bin
RUN_DIR=$WORKDIR/$ARCH
SAVE_DIR=$RUN_DIR/checkpoints
TENSORBOARD_DIR=$RUN_DIR/tensorboard
TRAIN_LOG=$RUN_DIR/train.log
VALID_LOG=$RUN_DIR/valid.log
mkdir -p "$WORKDIR"
START=$SECONDS

# Each data step writes into NAME.tmp and renames it when done, so an
# interrupted run never leaves a half-written folder that looks finished.
step "1/6 corpus ($SOURCE) -> $CORPUS_DIR"
if [[ -d $CORPUS_DIR ]]; then
    BUILT_FROM=$(cat "$CORPUS_DIR/SOURCE" 2>/dev/null || true)
    [[ $BUILT_FROM == "$SOURCE" ]] || die "$CORPUS_DIR was built from '$BUILT_FROM', not '$SOURCE':" \
        "run 'make clean' or choose another WORKDIR="
    echo "reusing $CORPUS_DIR"
else
    rm -rf "$CORPUS_DIR.tmp"
    "$PYTHON" scripts/build_corpus.py --output-dir "$CORPUS_DIR.tmp" ${CORPUS:+--corpus "$SOURCE"}
    echo "$SOURCE" > "$CORPUS_DIR.tmp/SOURCE"
    mv "$CORPUS_DIR.tmp" "$CORPUS_DIR"
fi

step "2/6 sentencepiece model -> $SPM_DIR"
if [[ -d $SPM_DIR ]]; then
    echo "reusing $SPM_DIR"
else
    rm -rf "$SPM_DIR.tmp"
    "$PYTHON" scripts/train_spm.py --corpus-dir "$CORPUS_DIR" --output-dir "$SPM_DIR.tmp"
    mv "$SPM_DIR.tmp" "$SPM_DIR"
fi

step "3/6 fairseq-preprocess -> $DATA_BIN"
if [[ -d $DATA_BIN ]]; then
    echo "reusing $DATA_BIN"
else
    rm -rf "$DATA_BIN.tmp"
    # every piece of the sentencepiece model (a model trained before tupe-train-spm wrote dict.txt: none)
    SRCDICT=()
    [[ -f $SPM_DIR/dict.txt ]] && SRCDICT=(--srcdict "$SPM_DIR/dict.txt")
    "$BIN/fairseq-preprocess" --user-dir tupe_plugin --only-source "${SRCDICT[@]}" \
        --trainpref "$SPM_DIR/train.bpe" --validpref "$SPM_DIR/valid.bpe" --testpref "$SPM_DIR/test.bpe" \
        --destdir "$DATA_BIN.tmp" --workers 2
    # The hub loader (from_pretrained) looks for the sentencepiece model here.
    cp "$SPM_DIR/spm.model" "$DATA_BIN.tmp/sentencepiece.bpe.model"
    mv "$DATA_BIN.tmp" "$DATA_BIN"
fi

WARMUP=$(( UPDATES / 10 > 0 ? UPDATES / 10 : 1 ))
SAVE_INTERVAL=$(( UPDATES / 4 > 0 ? UPDATES / 4 : 1 ))

PREPARED=$SECONDS
step "4/6 fairseq-train --arch $ARCH, $UPDATES updates -> $SAVE_DIR"
rm -rf "$SAVE_DIR" "$TENSORBOARD_DIR"
mkdir -p "$RUN_DIR"
TRAIN=("$BIN/fairseq-train" "$DATA_BIN" --user-dir tupe_plugin
    --task masked_lm --criterion masked_lm --arch "$ARCH"
    --sample-break-mode complete --tokens-per-sample 128
    --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-6 --clip-norm 1.0
    --lr 5e-4 --lr-scheduler polynomial_decay --warmup-updates "$WARMUP"
    --total-num-update "$UPDATES" --max-update "$UPDATES" --batch-size 16
    --log-format simple --log-interval 10
    --save-dir "$SAVE_DIR" --tensorboard-logdir "$TENSORBOARD_DIR"
    --no-epoch-checkpoints --save-interval-updates "$SAVE_INTERVAL" --keep-interval-updates 1
    --seed 1 --num-workers 0 --cpu "${EXTRA_TRAIN_ARGS[@]}")
# fairseq-train's log goes to train.log only; the screen gets one progress line
# over the UPDATES requested (not fairseq's per-epoch count), which the log's
# lines would otherwise break up. A failed run shows the end of its log.
echo "fairseq-train's log: $TRAIN_LOG"
if ! "${TRAIN[@]}" 2>&1 | "$PYTHON" scripts/show_progress.py --total "$UPDATES" --label train --log "$TRAIN_LOG"
then
    tail -n 20 "$TRAIN_LOG" >&2
    die "fairseq-train failed; its log: $TRAIN_LOG"
fi
TRAINED=$SECONDS

step "5/6 fairseq-validate $SAVE_DIR/checkpoint_last.pt"
"$BIN/fairseq-validate" "$DATA_BIN" --user-dir tupe_plugin --path "$SAVE_DIR/checkpoint_last.pt" \
    --task masked_lm --batch-size 16 --num-workers 0 --cpu 2>&1 | tee "$VALID_LOG"
VALIDATED=$SECONDS

step "6/6 summary"
# The first training loss comes from the tensorboard events, which hold every
# logged update.
TENSORBOARD_DIR=$TENSORBOARD_DIR VALID_LOG=$VALID_LOG "$PYTHON" - <<'EOF'
import math
import os
import re
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

events = EventAccumulator(os.path.join(os.environ["TENSORBOARD_DIR"], "train_inner"))
events.Reload()
if "loss" not in events.Tags()["scalars"]:
    sys.exit(f"demo.sh: error: no training loss in {events.path}: was tensorboard installed?")
first = events.Scalars("loss")[0]
with open(os.environ["VALID_LOG"], encoding="utf-8") as log:
    found = re.findall(r"valid on 'valid' subset \| loss ([^ ]+)", log.read())
if not found:
    sys.exit(f"demo.sh: error: no validation loss in {os.environ['VALID_LOG']}")
valid = float(found[-1])
print(f"first logged training loss (update {first.step}, mean of updates 1-{first.step}): "
      f"{first.value:.3f} bits")
print(f"validation loss of the last checkpoint: {valid:.3f} bits")
if not math.isfinite(valid) or valid >= first.value:
    sys.exit("demo.sh: error: the validation loss is not finite or not below the first training loss")
print(f"OK: the validation loss is {first.value - valid:.3f} bits below the first training loss")
EOF
cat <<EOF
time:        $(( SECONDS - START )) s (data $(( PREPARED - START )), training $(( TRAINED - PREPARED )), validation $(( VALIDATED - TRAINED )))
checkpoint:  $SAVE_DIR/checkpoint_last.pt
logs:        $TRAIN_LOG, $VALID_LOG
tensorboard: $TENSORBOARD_DIR  (view with: $BIN/tensorboard --logdir $TENSORBOARD_DIR)
data-bin:    $DATA_BIN  (sentencepiece model: $DATA_BIN/sentencepiece.bpe.model)
EOF

ANALYSIS_DIR=$RUN_DIR/analysis
step "what the positions learned: scripts/analyze_positions.py -> $ANALYSIS_DIR"
"$PYTHON" scripts/analyze_positions.py --path "$SAVE_DIR/checkpoint_last.pt" --data "$DATA_BIN" \
    --out "$ANALYSIS_DIR" --device cpu
echo "analysis:    $ANALYSIS_DIR  (PNGs and positions.json, explained in docs/analysis.md)"
