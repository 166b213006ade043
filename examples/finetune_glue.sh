#!/usr/bin/env bash
# Fine-tune a plugin checkpoint on one GLUE task with fairseq's sentence_prediction task.
#
#   examples/finetune_glue.sh TASK CKPT DATA_BIN [extra fairseq-train args...]
#
# TASK      a GLUE task: `python -m tupe_plugin.glue.tasks` lists them with their folder in GLUE_DIR
# CKPT      pre-trained plugin checkpoint (its --arch and --max-positions are read from it)
# DATA_BIN  the pre-training data-bin: its sentencepiece.bpe.model and dict.txt encode the task
#
# Prepares GLUE_DIR/TASK into BIN_DIR with scripts/prepare_glue.py, then runs fairseq-train with the
# fine-tuning hyper-parameters of TUPE Table 1: batch 32, peak lr 2e-5, 6% linear warm-up then linear
# decay to 0, Adam eps 1e-6 betas (0.9, 0.999), clip 1.0, dropout 0.1, weight decay 0.01. The task's
# classes, epochs and metric (which chooses the best checkpoint) come from tupe_plugin/glue/tasks.py.
# Extra arguments go last to fairseq-train and override any of these.
#
# Environment (defaults): LR (2e-5) SEED (1) MAX_EPOCH (per task) BATCH_SIZE (32) CPU (empty; 1 adds --cpu)
#   GLUE_DIR (glue_data in the current folder: the GLUE data, TASK/train.tsv and TASK/dev.tsv, as the GLUE
#     benchmark's download script download_glue_data.py writes it; gluebenchmark.com) BIN_DIR (glue-bin/TASK-bin)
#   SAVE_DIR (checkpoints/glue/TASK/ARCH/seedSEED) MAX_EXAMPLES (all; N keeps the first N of each split)
#   PYTHON (the repository's .venv/bin/python when present, else python)
# The training log is SAVE_DIR/train.log and SAVE_DIR/run.json records task, arch, seed and metric for
# scripts/collect_glue_scores.py. Validate the result with
#   fairseq-validate BIN_DIR --user-dir tupe_plugin --path SAVE_DIR/checkpoint_best.pt \
#       --task sentence_prediction --criterion sentence_prediction --batch-size 32
set -euo pipefail

if [[ $# -lt 3 ]]; then
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
TASK=$1 CKPT=$2 DATA_BIN=$3
shift 3
REPO=$(cd "$(dirname "$0")/.." && pwd)
# The project's .venv when there is one (no need to activate it); PYTHON= chooses another Python, whose
# fairseq-train is then used too.
if [[ -z ${PYTHON:-} && -x $REPO/.venv/bin/python ]]; then PYTHON=$REPO/.venv/bin/python; fi
PYTHON=${PYTHON:-python}
PATH=$(dirname "$(command -v "$PYTHON" || echo "$PYTHON")"):$PATH
GLUE_DIR=${GLUE_DIR:-glue_data}
BIN_DIR=${BIN_DIR:-glue-bin/$TASK-bin}
LR=${LR:-2e-5}
SEED=${SEED:-1}
BATCH_SIZE=${BATCH_SIZE:-32}

for f in "$CKPT" "$DATA_BIN/sentencepiece.bpe.model" "$DATA_BIN/dict.txt"; do
    [[ -f $f ]] || { echo "finetune_glue.sh: $f: no such file" >&2; exit 1; }
done

# The task's folder, epochs and metric, and its fairseq-train flags (classes, metric), from the table of
# GLUE tasks; an unknown TASK stops here.
TASK_SETTINGS=$(cd "$REPO" && "$PYTHON" -m tupe_plugin.glue.tasks "$TASK")
{ read -r FOLDER EPOCHS METRIC; read -r -a TASK_ARGS; } <<< "$TASK_SETTINGS"
MAX_EPOCH=${MAX_EPOCH:-$EPOCHS}
[[ -d $GLUE_DIR/$FOLDER ]] || {
    echo "finetune_glue.sh: GLUE_DIR=$GLUE_DIR has no $FOLDER folder: set GLUE_DIR to the GLUE data" \
         "(TASK/train.tsv, TASK/dev.tsv), as the GLUE benchmark's download script (download_glue_data.py," \
         "linked from gluebenchmark.com) writes it" >&2
    exit 1
}

# The checkpoint's architecture and max_positions (fine-tuning keeps the pre-training length).
read -r ARCH MAX_POSITIONS < <(cd "$REPO" && "$PYTHON" -c '
import sys
import tupe_plugin  # noqa: F401  (registers the model; lets torch read fairseq checkpoints)
from fairseq.checkpoint_utils import load_checkpoint_to_cpu
model = load_checkpoint_to_cpu(sys.argv[1])["cfg"]["model"]
print(model.arch, model.max_positions)' "$(realpath "$CKPT")")
SAVE_DIR=${SAVE_DIR:-checkpoints/glue/$TASK/$ARCH/seed$SEED}

PREPARE=(--task "$TASK" --glue-dir "$GLUE_DIR" --out "$BIN_DIR"
         --sentencepiece-model "$DATA_BIN/sentencepiece.bpe.model" --dict "$DATA_BIN/dict.txt")
[[ -n ${MAX_EXAMPLES:-} ]] && PREPARE+=(--max-examples "$MAX_EXAMPLES")
"$PYTHON" "$REPO/scripts/prepare_glue.py" "${PREPARE[@]}"

# Linear schedule over all updates: ceil(examples / batch) per epoch, 6% of them warm-up.
TRAIN_EXAMPLES=$(wc -l < "$BIN_DIR/raw/train.input0")
TOTAL_UPDATES=$(( (TRAIN_EXAMPLES + BATCH_SIZE - 1) / BATCH_SIZE * MAX_EPOCH ))
WARMUP_UPDATES=$(( TOTAL_UPDATES * 6 / 100 ))

EXTRA=()
[[ ${CPU:-} == 1 ]] && EXTRA+=(--cpu)
mkdir -p "$SAVE_DIR"
printf '{"task": "%s", "arch": "%s", "seed": %d, "metric": "%s", "lr": "%s", "checkpoint": "%s"}\n' \
    "$TASK" "$ARCH" "$SEED" "$METRIC" "$LR" "$CKPT" > "$SAVE_DIR/run.json"

fairseq-train "$BIN_DIR" --user-dir "$REPO/tupe_plugin" \
    --task sentence_prediction --criterion sentence_prediction --arch "$ARCH" \
    --restore-file "$CKPT" --reset-optimizer --reset-dataloader --reset-meters \
    --init-token 0 --separator-token 2 "${TASK_ARGS[@]}" --max-positions "$MAX_POSITIONS" \
    --shorten-method truncate \
    --batch-size "$BATCH_SIZE" --max-epoch "$MAX_EPOCH" --seed "$SEED" \
    --optimizer adam --adam-betas '(0.9,0.999)' --adam-eps 1e-6 --clip-norm 1.0 --weight-decay 0.01 \
    --lr "$LR" --lr-scheduler polynomial_decay --power 1 --end-learning-rate 0 \
    --warmup-updates "$WARMUP_UPDATES" --total-num-update "$TOTAL_UPDATES" \
    --dropout 0.1 --attention-dropout 0.1 \
    --maximize-best-checkpoint-metric \
    --save-dir "$SAVE_DIR" --no-epoch-checkpoints --no-last-checkpoints \
    --find-unused-parameters --log-format simple --log-interval 10 \
    "${EXTRA[@]}" "$@" 2>&1 | tee "$SAVE_DIR/train.log"
