# blis-simpy — developer entry points. Every target creates .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/blis-simpy run --scenario scenarios/quickstart.yaml

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check blis_simpy tests bench

bench: $(STAMP)
	$(BIN)/python bench/bench_replay.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
