# harmonykit: `make demo` and `make test` are all a fresh machine needs (Python 3.10+).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck unit engines bench fuzz mutants wheel-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy

# The real engines the tests run against (vLLM CPU, llama.cpp server, a tiny gpt-oss), made once
# under $$HARMONYKIT_ENGINES (default ~/.cache/harmonykit/engines) and reused after that.
engines: $(STAMP)
	$(BIN)/python tests/real/setup.py

unit: $(STAMP) engines
	$(BIN)/pytest

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python benchmarks/bench.py
	$(BIN)/python benchmarks/gateway.py
	$(BIN)/python benchmarks/grammar.py
	$(BIN)/python benchmarks/data.py
	$(BIN)/python benchmarks/scaling.py
	$(BIN)/python benchmarks/store.py
	$(BIN)/python benchmarks/tools.py

# Hypothesis's random search, long (not in CI, where it runs derandomized): each property test
# tries FUZZ times its examples (tests/budget.py). Failures are kept in .hypothesis/ and replayed.
FUZZ ?= 50
fuzz: $(STAMP)
	HARMONYKIT_FUZZ=$(FUZZ) $(BIN)/pytest -q -m "not real_engines" \
		$$(grep -l "@given\|@SETTINGS\|@examples" tests/test_*.py)

# One-line bugs applied to the core and the gateway, each against the tests that cover it
# (tests/mutants.py): every one must be caught. Not in CI (it runs the suite once a mutant).
mutants: $(STAMP)
	$(BIN)/python tests/mutants.py

# The built wheel works outside the checkout: a fresh venv, the CLI and an import smoke test.
wheel-check: $(STAMP)
	rm -rf build/wheel-check && mkdir -p build/wheel-check
	$(BIN)/python -m pip wheel --quiet --disable-pip-version-check --no-deps -w build/wheel-check .
	$(PYTHON) -m venv build/wheel-check/venv
	build/wheel-check/venv/bin/python -m pip install --quiet --disable-pip-version-check build/wheel-check/*.whl
	cd build/wheel-check && ./venv/bin/python ../../tests/smoke.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
