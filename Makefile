# blis-simpy — developer entry points. Every target creates .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test lint catalog bench bench-replay bench-startup bench-accuracy clean install-browser

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# headless Chromium for the report page test (tests/report): Debian's package, installed with
# apt-get when /usr/bin/chromium is missing (needs root, as on the dev machines and CI)
install-browser:
	@test -x /usr/bin/chromium || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

run: $(STAMP)
	$(BIN)/blis-simpy run --scenario scenarios/quickstart.yaml

test: $(STAMP) install-browser
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check blis_simpy tests bench

# after editing blis_simpy/catalog/data/*.yaml: rewrite their compiled JSON copies (docs/latency-models.md, "Catalogs")
catalog: $(STAMP)
	$(BIN)/python -m blis_simpy.catalog.shipped

# six workloads, ours (and a Go BLIS when BLIS_BIN is set): make bench [ARGS="--scale 0.1"]
bench: $(STAMP)
	$(BIN)/python bench/compare.py $(ARGS)

# single-instance replay baseline, with simulation-only req/s
bench-replay: $(STAMP)
	$(BIN)/python bench/bench_replay.py

# start-up: --help, --version and a 300-request replay in fresh processes: make bench-startup [ARGS="--runs 21"]
bench-startup: $(STAMP)
	$(BIN)/python bench/startup.py $(ARGS)

# accuracy against real vLLM runs (docs/accuracy.md): make bench-accuracy DATA=DIR [ARGS="--format markdown"]
bench-accuracy: $(STAMP)
	@test -n "$(DATA)" || { echo "usage: make bench-accuracy DATA=DIR [ARGS=...]" >&2; exit 2; }
	$(BIN)/python bench/realdata.py --data $(DATA) $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
