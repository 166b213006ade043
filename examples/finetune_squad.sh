#!/usr/bin/env bash
# Fine-tune a plugin checkpoint on SQuAD span prediction (v1.1 or v2.0) and print the official EM and F1.
#
#   examples/finetune_squad.sh VERSION CKPT DATA_BIN [extra fairseq-train args...]
#
# VERSION   1.1 or 2.0 (2.0: unanswerable questions, no answer predicted above NULL_THRESHOLD)
# CKPT      pre-trained plugin checkpoint (its --arch and --max-positions are read from it)
# DATA_BIN  the pre-training data-bin: its sentencepiece.bpe.model and dict.txt encode SQuAD
#
# 1. scripts/prepare_squad.py: TRAIN_FILE and VALID_FILE into BIN_DIR (windows of MAX_SEQ_LENGTH tokens,
#    DOC_STRIDE apart; questions over MAX_QUERY_LENGTH pieces are skipped and counted).
# 2. fairseq-train --task squad_span --criterion squad_span with Wang et al.'s SQuAD setting (App. A.3,
#    Table 4: length 384, 3 epochs, lr 3e-5, batch 32, weight decay 0.01; best checkpoint every 1000
#    updates) and the huggingface recipe it follows for the rest (linear decay to 0 without warm-up,
#    Adam eps 1e-6 betas (0.9, 0.999), dropout 0.1, doc stride 128, questions up to 64 pieces; at most a
#    third and a half of a shorter MAX_SEQ_LENGTH).
# 3. scripts/evaluate_squad.py on SAVE_DIR/checkpoint_best.pt: SAVE_DIR/predictions.json and EM / F1.
# Extra arguments go last to fairseq-train and override any of these.
#
# Environment (defaults): SQUAD_DIR (squad in the current folder, holding the official SQuAD files from
#   rajpurkar.github.io/SQuAD-explorer) TRAIN_FILE (SQUAD_DIR/train-vVERSION.json)
#   VALID_FILE (SQUAD_DIR/dev-vVERSION.json)
#   BIN_DIR (squad-bin/vVERSION) SAVE_DIR (checkpoints/squad/vVERSION/ARCH/seedSEED)
#   LR (3e-5) SEED (1) MAX_EPOCH (3) BATCH_SIZE (32) WARMUP_RATIO (0, in percent of all updates)
#   MAX_SEQ_LENGTH (384, at most the checkpoint's max_positions)
#   DOC_STRIDE (128, at most MAX_SEQ_LENGTH / 3) MAX_QUERY_LENGTH (64, at most MAX_SEQ_LENGTH / 2)
#   MAX_ANSWER_LENGTH (30) NULL_THRESHOLD (0.0) MAX_ARTICLES (all; N keeps the first N articles of each file)
#   CPU (empty; 1 adds --cpu) PYTHON (the repository's .venv/bin/python when present, else python)
# Validate the result with
#   fairseq-validate BIN_DIR --user-dir tupe_plugin --path SAVE_DIR/checkpoint_best.pt \
#       --task squad_span --criterion squad_span --batch-size 32
set -euo pipefail

if [[ $# -lt 3 ]]; then
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
VERSION=$1 CKPT=$2 DATA_BIN=$3
shift 3
case $VERSION in
    1.1) NEGATIVE=() ;;
    2.0) NEGATIVE=(--version-2-with-negative --null-threshold "${NULL_THRESHOLD:-0.0}") ;;
    *) echo "finetune_squad.sh: VERSION must be 1.1 or 2.0, got '$VERSION'" >&2; exit 2 ;;
esac
REPO=$(cd "$(dirname "$0")/.." && pwd)
# The project's .venv when there is one (no need to activate it); PYTHON= chooses another Python, whose
# fairseq-train is then used too.
if [[ -z ${PYTHON:-} && -x $REPO/.venv/bin/python ]]; then PYTHON=$REPO/.venv/bin/python; fi
PYTHON=${PYTHON:-python}
PATH=$(dirname "$(command -v "$PYTHON" || echo "$PYTHON")"):$PATH
SQUAD_DIR=${SQUAD_DIR:-squad}
TRAIN_FILE=${TRAIN_FILE:-$SQUAD_DIR/train-v$VERSION.json}
VALID_FILE=${VALID_FILE:-$SQUAD_DIR/dev-v$VERSION.json}
BIN_DIR=${BIN_DIR:-squad-bin/v$VERSION}
LR=${LR:-3e-5}
SEED=${SEED:-1}
MAX_EPOCH=${MAX_EPOCH:-3}
BATCH_SIZE=${BATCH_SIZE:-32}
WARMUP_RATIO=${WARMUP_RATIO:-0}

for f in "$CKPT" "$DATA_BIN/sentencepiece.bpe.model" "$DATA_BIN/dict.txt"; do
    [[ -f $f ]] || { echo "finetune_squad.sh: $f: no such file" >&2; exit 1; }
done
for name in TRAIN_FILE VALID_FILE; do
    [[ -f ${!name} ]] || {
        echo "finetune_squad.sh: $name=${!name}: no such file: set SQUAD_DIR to the folder of the official" \
             "SQuAD files (train-v$VERSION.json, dev-v$VERSION.json; rajpurkar.github.io/SQuAD-explorer)," \
             "or set $name" >&2
        exit 1
    }
done

# The checkpoint's architecture and max_positions (fine-tuning keeps the pre-training length).
read -r ARCH MAX_POSITIONS < <(cd "$REPO" && "$PYTHON" -c '
import sys
import tupe_plugin  # noqa: F401  (registers the model; lets torch read fairseq checkpoints)
from fairseq.checkpoint_utils import load_checkpoint_to_cpu
model = load_checkpoint_to_cpu(sys.argv[1])["cfg"]["model"]
print(model.arch, model.max_positions)' "$(realpath "$CKPT")")
MAX_SEQ_LENGTH=${MAX_SEQ_LENGTH:-$(( MAX_POSITIONS < 384 ? MAX_POSITIONS : 384 ))}
SAVE_DIR=${SAVE_DIR:-checkpoints/squad/v$VERSION/$ARCH/seed$SEED}

PREPARE=(--train-file "$TRAIN_FILE" --valid-file "$VALID_FILE" --out "$BIN_DIR"
         --sentencepiece-model "$DATA_BIN/sentencepiece.bpe.model" --dict "$DATA_BIN/dict.txt"
         --max-seq-length "$MAX_SEQ_LENGTH")
# prepare_squad.py's defaults of the stride and the question length fit the window
[[ -n ${DOC_STRIDE:-} ]] && PREPARE+=(--doc-stride "$DOC_STRIDE")
[[ -n ${MAX_QUERY_LENGTH:-} ]] && PREPARE+=(--max-query-length "$MAX_QUERY_LENGTH")
[[ -n ${MAX_ARTICLES:-} ]] && PREPARE+=(--max-articles "$MAX_ARTICLES")
"$PYTHON" "$REPO/scripts/prepare_squad.py" "${PREPARE[@]}"

# Linear schedule over all updates: ceil(features / batch) per epoch.
TRAIN_FEATURES=$(wc -l < "$BIN_DIR/train.features.jsonl")
TOTAL_UPDATES=$(( (TRAIN_FEATURES + BATCH_SIZE - 1) / BATCH_SIZE * MAX_EPOCH ))
WARMUP_UPDATES=$(( TOTAL_UPDATES * WARMUP_RATIO / 100 ))

EXTRA=() EVAL=()
[[ ${CPU:-} == 1 ]] && { EXTRA+=(--cpu); EVAL+=(--cpu); }
[[ -n ${MAX_ARTICLES:-} ]] && EVAL+=(--max-articles "$MAX_ARTICLES")
mkdir -p "$SAVE_DIR"

fairseq-train "$BIN_DIR" --user-dir "$REPO/tupe_plugin" \
    --task squad_span --criterion squad_span --arch "$ARCH" \
    --restore-file "$CKPT" --reset-optimizer --reset-dataloader --reset-meters \
    --max-positions "$MAX_POSITIONS" \
    --batch-size "$BATCH_SIZE" --max-epoch "$MAX_EPOCH" --seed "$SEED" \
    --optimizer adam --adam-betas '(0.9,0.999)' --adam-eps 1e-6 --clip-norm 1.0 --weight-decay 0.01 \
    --lr "$LR" --lr-scheduler polynomial_decay --power 1 --end-learning-rate 0 \
    --warmup-updates "$WARMUP_UPDATES" --total-num-update "$TOTAL_UPDATES" \
    --dropout 0.1 --attention-dropout 0.1 \
    --validate-interval-updates 1000 --save-interval-updates 1000 --keep-interval-updates 1 \
    --save-dir "$SAVE_DIR" --no-epoch-checkpoints --find-unused-parameters \
    --log-format simple --log-interval 10 \
    "${EXTRA[@]}" "$@" 2>&1 | tee "$SAVE_DIR/train.log"

"$PYTHON" "$REPO/scripts/evaluate_squad.py" --path "$SAVE_DIR/checkpoint_best.pt" --data "$BIN_DIR" \
    --gold-file "$VALID_FILE" --output "$SAVE_DIR/predictions.json" \
    --max-answer-length "${MAX_ANSWER_LENGTH:-30}" "${NEGATIVE[@]}" "${EVAL[@]}" \
    2>&1 | tee "$SAVE_DIR/eval.log"
