# The two commands a newcomer needs:
#   make serve   -> the embedded default: tiny K3 served by real SGLang on CPU, OpenAI API on 127.0.0.1:30000
#   make test    -> the default test suite (installs everything on first use)
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.k3-installed
PYTEST_ARGS ?= --durations=30

.PHONY: serve test test-slow install system-deps

$(STAMP): pyproject.toml setup.py
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "make: $(PYTHON) not found (k3-sglang needs Python 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

system-deps:
	bash scripts/system-deps.sh

serve: $(STAMP)
	$(VENV)/bin/k3 serve

test: $(STAMP) system-deps
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP) system-deps
	$(PY) -m pytest -m "slow" $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests are marked slow"; else exit $$rc; fi
