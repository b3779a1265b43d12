VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint install

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/specscope serve --host 127.0.0.1 --port 7860

test: $(STAMP)
	$(PY) -m pytest -q
	$(VENV)/bin/ruff check .

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy backend/engine backend/tracing.py backend/model/checkpoint.py backend/model/config.py \
		backend/model/transformer.py backend/bench.py backend/server backend/store kernels
