# One virtual environment, created from scratch when absent. Everything goes through it.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: help venv test test-all lint run bundles clean

help:
	@echo "make run      set up, build the default bundles if absent, serve them on 127.0.0.1:8000"
	@echo "make test     set up and run the default test suite"
	@echo "make test-all also the slow tests"
	@echo "make lint     ruff"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[train,serve,test]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
