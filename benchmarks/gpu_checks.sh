#!/bin/bash
# The GPU checks in one go (docs/benchmarks.md, "GPU"): one layer's attention on each candidate kernel, the
# base-size benchmarks in bf16, fp16 and bf16 without attention dropout, with the kernel each contender
# takes (--kernels), and the fp16/bf16 numerics tests on CUDA (tests/test_numerics_cuda.py, and the Triton
# kernel's tests/test_triton_bias_attention.py compiled for the GPU). Run from the repository root:
#
#   benchmarks/gpu_checks.sh [OUTDIR]       # default gpu-results; each step time-limited, 480 s in all
#
# (a command limited to 600 s loses the tail of the last step, every encoding once: the steps run in order
# of importance and each writes its file when it ends). Writes OUTDIR/run.log, numerics.xml (JUnit; each
# test's measured error is a <property>) and attention_bf16.json, attention_bf16_ad01.json, bench_bf16.json,
# bench_bf16_relative.json, bench_fp16.json, bench_bf16_ad0.json, bench_bf16_encodings.json; the runs the
# docs' tables cite are also kept as
# results files in RESULTS (a folder of the repository, default benchmarks/results: commit them, then run
# python benchmarks/report.py --write).
# A copy of the working tree without git's folder (a lent GPU machine) records the commit it ran at only
# when told: BENCHMARK_COMMIT=$(git rev-parse HEAD), taken where the copy was made.
#
# On a machine without network whose python3 has torch but not fairseq, set WHEELS to a folder of
# wheels made beforehand where pip works (ve-fairseq publishes cp312 builds; fairseq itself has none):
#
#   P="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
#      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
#   pip download --no-deps --only-binary=:all: $P -d WHEELS ve-fairseq==0.12.3 hydra-core==1.3.2 \
#       omegaconf==2.3.1 bitarray cffi pycparser
#   pip wheel --no-deps -w WHEELS antlr4-python3-runtime==4.9.3     # sdist only: build it here
#
# (about 22 MB; sacrebleu, regex, scikit-learn, torchaudio, numpy, pyyaml, pytest and pytest-xdist
# are expected on the machine already). The script installs them into /tmp/site.
set -u
OUTDIR=${1:-gpu-results}
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

# Base size (12 layers, d 768, 12 heads), 32 768 tokens a step at both lengths: B = 256 at T = 128,
# B = 64 at T = 512, so that the GPU work of a step (tens of ms) outweighs the per-op launch cost of
# fairseq's Adam (a Python loop over ~200 parameters). In order of importance, so that a session cut short
# still measured the choice: one layer's attention on each candidate kernel for a learned bias (the
# memory-efficient SDPA kernel the plugin takes by default, its Triton kernel, FlexAttention without
# dropout; cuDNN without a bias is the floor; Shaw keys and DeBERTa gathered into SDPA's mask and read by
# offset in the Triton kernel), then the step benchmark of the contenders with targets (the triton_ ones
# on --attention-backend triton), the CUDA numerics of the model and of the Triton kernel, the training
# steps of Shaw keys and DeBERTa on both paths and of RoPE (its rotation fused on CUDA), fp16 and dropout-free steps, and every encoding once
# (3 rounds) at T = 512.
# PYTHONWARNINGS hides fairseq's SyntaxWarnings on Python 3.12.
export PYTHONWARNINGS=ignore::SyntaxWarning
ATTENTION="python3 benchmarks/benchmark_attention.py --device cuda --seq-lens 512 --tokens 32768 --heads 12"
date; timeout 45 $ATTENTION --rounds 7 --calls 10 --json "$OUTDIR/attention_bf16.json" \
    --results-dir "$RESULTS"; echo "rc=$?"
date; timeout 30 $ATTENTION --rounds 7 --calls 10 --attention-dropout 0.1 \
    --json "$OUTDIR/attention_bf16_ad01.json" --results-dir "$RESULTS"; echo "rc=$?"
TARGETS="roberta bert_a tupe_r tupe_a bert_r plain_tupe_r triton_tupe_r triton_tupe_a triton_bert_r"
BENCH="python3 benchmarks/benchmark.py --device cuda --size base --warmup 2"
date; timeout 140 $BENCH --seq-lens 128 512 --rounds 5 --kernels --contenders $TARGETS --bf16 \
    --batch-sizes 256 64 --json "$OUTDIR/bench_bf16.json" --results-dir "$RESULTS"; echo "rc=$?"
date; timeout -s INT -k 10 90 python3 -m pytest -q -p no:cacheprovider tests/test_numerics_cuda.py \
    tests/test_triton_bias_attention.py -n 8 -o junit_family=xunit1 --junitxml="$OUTDIR/numerics.xml" -rf 2>&1 \
    | tail -40; echo "rc=$?"
RELATIVE="bert_a keys_bert_rpe triton_keys_bert_rpe deberta triton_deberta bert_rope"
date; timeout 55 $BENCH --seq-lens 512 --rounds 3 --kernels --contenders $RELATIVE --bf16 --batch-sizes 64 \
    --json "$OUTDIR/bench_bf16_relative.json" --results-dir "$RESULTS"; echo "rc=$?"
date; timeout 45 $BENCH --seq-lens 128 512 --rounds 5 --contenders bert_a tupe_r triton_tupe_r --fp16 \
    --batch-sizes 256 64 --json "$OUTDIR/bench_fp16.json" --results-dir "$RESULTS"; echo "rc=$?"
date; timeout 40 $BENCH --seq-lens 128 512 --rounds 5 --contenders bert_a tupe_r triton_tupe_r --bf16 \
    --batch-sizes 256 64 --attention-dropout 0 --json "$OUTDIR/bench_bf16_ad0.json" --results-dir "$RESULTS"
echo "rc=$?"
date; timeout 35 $BENCH --seq-lens 512 --rounds 3 --kernels --bf16 --batch-sizes 64 \
    --json "$OUTDIR/bench_bf16_encodings.json" --results-dir "$RESULTS"; echo "rc=$?"; date
