# Install, test and demo tupe-plugin.  Run `make help` for the targets.
#
# Everything runs from the virtualenv in .venv, created with `python3 -m venv`
# when missing.  torch is pinned in every pip command: left unpinned, pip
# resolves a CUDA build plus gigabytes of nvidia wheels.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
REQUIREMENTS := torch==2.13.0 ve-fairseq==0.12.3 ninja sentencepiece tensorboard tensorboardX matplotlib pytest hypothesis \
	submitit transformers==5.24.0 accelerate triton==3.9.0 ruff==0.17.6 pytest-xdist==3.8.0
# The Python files `make lint` checks with ruff (its settings: ruff.toml).
LINTED := tupe_plugin tests benchmarks scripts setup.py

# Demo settings, passed to examples/demo.sh (see its header).
CORPUS ?=
ARCH ?= tupe_r_tiny
UPDATES ?= 400
WORKDIR ?= demo
# WORKDIR holds the data shared by every architecture; each architecture's run is WORKDIR/ARCH/.
DEMO_DATA := corpus corpus.tmp spm spm.tmp data-bin data-bin.tmp
DEMO_RUN_OUTPUTS := checkpoints tensorboard train.log valid.log analysis

# Study settings, passed to tupe-study (the config is described in docs/study.md).
STUDY_CONFIG ?= examples/study-tiny.yaml
STUDY_DIR ?= study-tiny

# Benchmark settings, passed to benchmarks/benchmark.py (see its --help).
BENCH_ARGS ?=
BENCH_JSON ?= benchmark.json
BENCH_DATA ?=

.PHONY: help install check lint test test-slow test-gpu demo study bench bench-train bench-report clean distclean

help:
	@echo "make install     create .venv and install the plugin and its dependencies"
	@echo "make check       lint and the smoke tests (marked smoke), under 2 minutes: the loop between edits"
	@echo "make lint        ruff over the Python files, with ruff.toml"
	@echo "make test        fast test suite (tests not marked slow)"
	@echo "make test-slow   tests marked slow"
	@echo "make test-gpu    fp16/bf16 checks on a CUDA device (tests marked gpu; needs a GPU)"
	@echo "make demo        pre-train a tiny model on CPU end to end (examples/demo.sh);"
	@echo "                 settings: CORPUS=file ARCH=$(ARCH) UPDATES=$(UPDATES) WORKDIR=$(WORKDIR)"
	@echo "make study       compare position encodings (scripts/study.py): pre-train, analysis, and GLUE/SQuAD"
	@echo "                 when the config has them (examples/study-glue.yaml: GLUE from glue_data/),"
	@echo "                 report in STUDY_DIR=$(STUDY_DIR)/report.md; config STUDY_CONFIG=$(STUDY_CONFIG)"
	@echo "make bench       side-by-side training-step benchmark (benchmarks/benchmark.py): prints the"
	@echo "                 markdown tables, writes $(BENCH_JSON); extra flags: BENCH_ARGS=\"...\""
	@echo "make bench-train real fairseq-train updates side by side, words/s from its log"
	@echo "                 (benchmarks/benchmark_train.py): BENCH_DATA=data-bin folder, BENCH_ARGS=\"...\""
	@echo "make bench-report regenerate the benchmark tables of the docs from benchmarks/results/"
	@echo "                 (benchmarks/report.py --write); make bench and bench-train keep their run there"
	@echo "                 with BENCH_ARGS=\"--results-dir benchmarks/results\""
	@echo "make clean       remove the demo outputs in WORKDIR (data and every architecture's run)"
	@echo "make distclean   clean, and remove .venv"

install: $(STAMP)

$(STAMP): setup.py Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(REQUIREMENTS)
	# ve-fairseq pulls in torchaudio, whose last release does not load against torch 2.13 (its
	# _torchaudio.abi3.so fails, and transformers' model classes import torchaudio when it is there).
	# fairseq imports it only inside its speech tasks and audio utilities, which the plugin never runs.
	$(BIN)/pip uninstall -y torchaudio
	$(BIN)/pip install --no-deps -e .
	touch $@

lint: install
	$(BIN)/ruff check --config ruff.toml $(LINTED)

# The tests run on every core (pytest-xdist), a test file to a worker: a file's module fixtures are built
# once, and the fixtures files share are built once a run (tests/conftest.py, built_once).
PARALLEL := -n auto --dist loadfile

# The smoke tests also run in `make test`: this is a subset for between edits, not a replacement.
check: lint
	$(BIN)/python -m pytest -q $(PARALLEL) tests -m "smoke and not slow and not gpu"

test: install
	$(BIN)/python -m pytest -q $(PARALLEL) tests -m "not slow and not gpu"

# pytest exits with 5 when no test is selected: no slow tests is not a failure. The slow tests run one at a
# time: some kill a run part-way, measure speed, or start a process per core.
test-slow: install
	$(BIN)/python -m pytest -q tests -m "slow and not gpu" || test $$? -eq 5

# The CUDA checks refuse to run (rather than skip) where torch sees no GPU.
test-gpu: install
	@$(BIN)/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu: torch sees no CUDA device')"
	$(BIN)/python -m pytest -q tests -m gpu

demo: install
	CORPUS="$(CORPUS)" ARCH="$(ARCH)" UPDATES="$(UPDATES)" WORKDIR="$(WORKDIR)" bash examples/demo.sh

study: install
	$(BIN)/python scripts/study.py $(STUDY_CONFIG) --out $(STUDY_DIR)

bench: install
	$(BIN)/python benchmarks/benchmark.py --json $(BENCH_JSON) $(BENCH_ARGS)

bench-train: install
	@test -n "$(BENCH_DATA)" || { echo "make bench-train: set BENCH_DATA to a fairseq-preprocess output folder (make demo writes one)" >&2; exit 2; }
	$(BIN)/python benchmarks/benchmark_train.py $(BENCH_DATA) --json benchmark_train.json $(BENCH_ARGS)

bench-report: install
	$(BIN)/python benchmarks/report.py --write

clean:
	rm -rf $(addprefix $(WORKDIR)/,$(DEMO_DATA))
	for run in $(WORKDIR)/*/; do \
		test -e "$$run/train.log" || test -d "$$run/checkpoints" || continue; \
		(cd "$$run" && rm -rf $(DEMO_RUN_OUTPUTS)); rmdir "$$run" 2>/dev/null || true; \
	done
	rmdir $(WORKDIR) 2>/dev/null || true

distclean: clean
	rm -rf $(VENV)
