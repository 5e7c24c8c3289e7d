# Developer entry points. `make test` and `make demo` work on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# pytest-xdist workers for `make unit`: the suite waits on brokers and timeouts as much
# as it computes: two workers on two cores took 21-22 min against 36.6 (0: one process)
TEST_WORKERS ?= 2

.PHONY: setup test lint typecheck unit demo replay-example bench schemas clean services services-stop

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)  ## create .venv with the package and its development tools

lint: setup
	$(BIN)/ruff check evaluator tests bench scripts
	$(BIN)/ruff format --check evaluator tests bench scripts

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

test: lint typecheck unit  ## everything CI runs

demo: setup  ## simulated traffic through the live pipeline; dashboard on http://127.0.0.1:8000/
	MALLOC_MMAP_THRESHOLD_=131072 $(BIN)/evaluator demo

replay-example: setup  ## evaluate the bundled example events
	$(BIN)/evaluator replay examples/impressions.jsonl examples/interactions.jsonl

bench: setup
	$(BIN)/python bench/bench_ndcg.py
	$(BIN)/python bench/bench_replay.py

schemas: setup  ## regenerate schemas/*.schema.json from the event models
	$(BIN)/evaluator schema --out-dir schemas

services:  ## start a real Kafka broker (KRaft) and Redis on loopback; prints their settings
	python3 scripts/services.py start

services-stop:
	python3 scripts/services.py stop

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
