#!/bin/bash
# The GPU checks (docs/benchmarks.md, "GPU"), in two parts of under 8 minutes each, the most important first:
#
#   benchmarks/gpu_checks.sh [OUTDIR] [PART ...]     # default gpu-results, parts 1 2
#
# Part 1 (470 s), what decides the kernel and the main targets: one layer's attention on each candidate
# kernel at T = 512 (bf16, without and with attention dropout: attention_bf16.json, attention_bf16_ad01.json),
# the training steps of the contenders with targets on SDPA and Triton (bench_bf16.json), every test marked
# gpu (make test-gpu: numerics.xml, JUnit, each test's measured error a <property>), the same steps on
# cuDNN's graph (bench_bf16_cudnn.json).
# Part 2 (380 s): the training steps of the relative encodings and RoPE (bench_bf16_relative.json),
# dropout-free steps (bench_bf16_ad0.json; FlexAttention's apart, bench_bf16_ad0_flex.json), fp16 steps
# (bench_fp16.json), real fairseq-train updates of tupe_r against bert_a (train_bf16.json), every encoding
# once (bench_bf16_encodings.json, 3 rounds: no verdicts).
# Each step is time-limited and writes its file when it ends (a command limited to 600 s loses only the tail
# of a part); OUTDIR/run.log has everything. The runs the docs' tables cite are also kept in RESULTS (a
# folder of the repository, default benchmarks/results: commit them, then python benchmarks/report.py
# --write). A copy of the working tree without git's folder (a lent GPU machine) records the commit it ran
# at only when told: BENCHMARK_COMMIT=$(git rev-parse HEAD), taken where the copy was made.
#
# On a machine without network whose python3 has torch but not fairseq, set WHEELS to a folder of wheels
# made beforehand where pip works (ve-fairseq publishes cp312 builds; fairseq itself has none):
#
#   P="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
#      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
#   pip download --no-deps --only-binary=:all: $P -d WHEELS ve-fairseq==0.12.3 hydra-core==1.3.2 \
#       omegaconf==2.3.1 bitarray cffi pycparser nvidia-cudnn-frontend==1.32.0
#   pip wheel --no-deps -w WHEELS antlr4-python3-runtime==4.9.3     # sdist only: build it here
#
# (about 34 MB; sacrebleu, regex, scikit-learn, numpy, pyyaml, pytest and pytest-xdist are expected on the
# machine already; the cuDNN frontend loads the cuDNN library torch ships). The script installs them into
# /tmp/site.
set -u
OUTDIR=${1:-gpu-results}
shift $(( $# > 0 ? 1 : 0 ))
PARTS=${*:-1 2}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
RESULTS=${RESULTS:-benchmarks/results}
exec > >(tee -a "$OUTDIR/run.log") 2>&1
cd "$(dirname "$0")/.."
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python3 -c "import sys, torch, fairseq, tupe_plugin; print(sys.version); print('torch', torch.__version__,
'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'fairseq', fairseq.__version__,
torch.cuda.get_device_name())" || exit 1
python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())" \
    || echo "no cuDNN frontend: the cudnn-graph candidates are left out"
# PYTHONWARNINGS hides fairseq's SyntaxWarnings on Python 3.12.
export PYTHONWARNINGS=ignore::SyntaxWarning

# Base size (12 layers, d 768, 12 heads), 32 768 tokens a step at both lengths: B = 256 at T = 128,
# B = 64 at T = 512, so that the GPU work of a step (tens of ms) outweighs the per-op launch cost of
# fairseq's Adam (a Python loop over ~200 parameters).
ATTENTION="python3 benchmarks/benchmark_attention.py --device cuda --seq-lens 512 --tokens 32768 --heads 12"
BENCH="python3 benchmarks/benchmark.py --device cuda --size base --warmup 2"
# make test-gpu's tests, collected from the files that mark them only (the others may import packages this
# machine lacks: transformers, matplotlib, ...)
GPU_TESTS=$(grep -l "pytest.mark.gpu" tests/test_*.py)
step() {  # step SECONDS COMMAND...: one time-limited step, its exit status logged
    local limit=$1
    shift
    date
    timeout -s INT -k 10 "$limit" "$@"
    echo "rc=$?"
}

part1() {
    # the candidates for a learned bias (sdpa-bias: the memory-efficient kernel auto takes; triton-, flex-,
    # cudnn-graph-bias; sdpa without a bias is the floor), RoPE's rotation, Shaw and DeBERTa gathered into
    # SDPA's mask or read by offset, a distance bias expanded or as its Toeplitz rows (FlexAttention's are
    # compiled here: the longest step)
    step 145 $ATTENTION --rounds 7 --calls 10 --json "$OUTDIR/attention_bf16.json" --results-dir "$RESULTS"
    step 55 $ATTENTION --rounds 7 --calls 10 --attention-dropout 0.1 --json "$OUTDIR/attention_bf16_ad01.json" \
        --results-dir "$RESULTS"
    step 120 $BENCH --seq-lens 128 512 --rounds 5 --kernels --bf16 --batch-sizes 256 64 \
        --contenders bert_a tupe_r tupe_a bert_r triton_tupe_r triton_tupe_a triton_bert_r \
        --json "$OUTDIR/bench_bf16.json" --results-dir "$RESULTS"
    step 90 python3 -m pytest -q -p no:cacheprovider $GPU_TESTS -m gpu -n 8 -o junit_family=xunit1 \
        --junitxml="$OUTDIR/numerics.xml" -rf
    # apart (a contender that fails is left out of its run, but a broken CUDA context would end it)
    step 60 $BENCH --seq-lens 128 512 --rounds 5 --kernels --bf16 --batch-sizes 256 64 \
        --contenders bert_a tupe_r cudnn_tupe_r cudnn_tupe_a cudnn_bert_r --json "$OUTDIR/bench_bf16_cudnn.json" \
        --results-dir "$RESULTS"
}

part2() {
    step 65 $BENCH --seq-lens 512 --rounds 5 --kernels --bf16 --batch-sizes 64 \
        --contenders bert_a keys_bert_rpe triton_keys_bert_rpe bert_rpe triton_bert_rpe deberta triton_deberta \
        bert_rope --json "$OUTDIR/bench_bf16_relative.json" --results-dir "$RESULTS"
    step 40 $BENCH --seq-lens 128 512 --rounds 5 --bf16 --batch-sizes 256 64 --attention-dropout 0 \
        --contenders bert_a tupe_r triton_tupe_r --json "$OUTDIR/bench_bf16_ad0.json" --results-dir "$RESULTS"
    # apart, as cuDNN's graph in part 1
    step 60 $BENCH --seq-lens 128 512 --rounds 5 --bf16 --batch-sizes 256 64 --attention-dropout 0 \
        --contenders bert_a flex_tupe_r flex_keys_bert_rpe flex_deberta --json "$OUTDIR/bench_bf16_ad0_flex.json" \
        --results-dir "$RESULTS"
    step 45 $BENCH --seq-lens 128 512 --rounds 5 --fp16 --batch-sizes 256 64 \
        --contenders bert_a tupe_r triton_tupe_r --json "$OUTDIR/bench_fp16.json" --results-dir "$RESULTS"
    rm -rf /tmp/gpu-checks-data
    step 130 python3 benchmarks/benchmark_train.py /tmp/gpu-checks-data --random-tokens 4000000 --device cuda \
        --bf16 --size base --tokens-per-sample 512 --batch-size 64 --updates 10 --skip 3 --repetitions 5 \
        --contenders bert_a tupe_r --json "$OUTDIR/train_bf16.json" --results-dir "$RESULTS"
    step 40 $BENCH --seq-lens 512 --rounds 3 --kernels --bf16 --batch-sizes 64 \
        --json "$OUTDIR/bench_bf16_encodings.json"
}

for part in $PARTS; do
    case $part in
        1) part1 ;;
        2) part2 ;;
        *) echo "unknown part $part: 1 or 2"; exit 2 ;;
    esac
done
date
