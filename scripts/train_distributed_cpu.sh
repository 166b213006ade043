#!/usr/bin/env bash
# Data-parallel fairseq-train on several CPU processes of one machine (torch.distributed, gloo).
#
#   NPROC=4 scripts/train_distributed_cpu.sh DATA-BIN --user-dir tupe_plugin --arch tupe_r_tiny ...
#
# torchrun starts NPROC copies of fairseq-train; each reads its RANK and WORLD_SIZE from the
# environment torchrun sets. fairseq's default --ddp-backend pytorch_ddp works on CPU thanks to
# tupe_plugin/fairseq_fixes/distributed_cpu.py (so --user-dir tupe_plugin is required). Each process draws
# --batch-size sentences per step: the effective batch is NPROC x --batch-size x --update-freq, the
# same as one process with --update-freq multiplied by NPROC. Extra torchrun options (e.g. a fixed
# --master-port) go in TORCHRUN_ARGS. torchrun and fairseq-train come from the repository's .venv when
# there is one (no need to activate it), else from PATH.
#
# The processes share the machine's cores: unless OMP_NUM_THREADS is set already, each gets
# OMP_NUM_THREADS = cores (nproc) / NPROC, at least 1. More threads than cores in all makes training
# crawl (two 2-thread processes on 2 cores: 0.5 instead of 26 updates/s).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
if [[ -x $REPO/.venv/bin/torchrun ]]; then PATH=$REPO/.venv/bin:$PATH; fi

NPROC=${NPROC:-2}
if (($# == 0)); then
    echo "usage: NPROC=N $0 DATA-BIN [fairseq-train arguments]" >&2
    exit 2
fi
if ! [[ $NPROC =~ ^[1-9][0-9]*$ ]]; then
    echo "$0: NPROC must be a positive integer, got '$NPROC'" >&2
    exit 2
fi
if [[ -z ${OMP_NUM_THREADS:-} ]]; then
    CORES=$(nproc)
    export OMP_NUM_THREADS=$(( CORES >= NPROC ? CORES / NPROC : 1 ))
fi

# shellcheck disable=SC2016  # $RANK and $WORLD_SIZE are expanded by each worker, not here
exec torchrun --standalone --nproc_per_node "$NPROC" ${TORCHRUN_ARGS:-} --no-python \
    bash -c 'exec fairseq-train "$@" --cpu --distributed-world-size "$WORLD_SIZE" \
        --distributed-rank "$RANK" --distributed-init-method env:// --distributed-no-spawn \
        --distributed-backend gloo' fairseq-train "$@"
