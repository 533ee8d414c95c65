"""Seconds per multi-turn rollout: the KV cache kept across turns (CachedTurns) against re-prefilling each turn (Reprefill).

    PYTHONPATH=src python benchmarks/agent_turns.py --pairs 3 --out benchmarks/results/<date>-agent-turns.json

SmolLM2-135M-Instruct on the built-in calculator task (3-shot prompts of
~500 tokens, the `multiply` tool), 2 prompts × G = 8 rows per rollout,
max_completion_length 80, temperature 1. Both sides sample with the same
`Sampler` (same model, processors, precision); one rollout each, alternated
in pairs, each pair from the same seed; medians and their ratio. Re-prefill is
what TRL does without vLLM's prefix cache (it regenerates each turn from the
whole sequence). Turns and tool calls per rollout are reported, since the two
sides draw different random numbers and so take different paths.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from fastgrpo.generation.cached_turns import CachedTurns
from fastgrpo.tasks.calculator import Calculator, calculator_dataset
from fastgrpo.rollout.agents.chat_format import prepare_tool_tokenizer
from fastgrpo.rollout.agents.environments import Environments
from fastgrpo.rollout.agents.multiturn import MultiTurn
from fastgrpo.generation.reprefill import Reprefill
from fastgrpo.rollout.prompts import PromptEncoder
from fastgrpo.generation.contract import SamplingSettings
from fastgrpo.model.loading import load_model, load_tokenizer
from fastgrpo.generation.sampler import Sampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import positive_int, writable_folder  # noqa: E402


def json_path(text: str) -> str:
    """argparse type: a .json file in a folder that can be written (created if missing), checked before the first rollout."""
    if not text.endswith(".json"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a .json file (e.g. benchmarks/results/<date>-agent-turns.json)")
    writable_folder(os.path.dirname(text) or ".")
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=positive_int, default=3)
    parser.add_argument("--out", type=json_path, help="write the runs and medians to this .json file")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    tokenizer, _ = prepare_tool_tokenizer(load_tokenizer("smollm2-135m-instruct"))
    model = load_model("smollm2-135m-instruct").eval()
    eos, T, G = tokenizer.eos_token_id, 80, 8
    sampler = Sampler(model, SamplingSettings(max_completion_length=T, eos_token_ids=[eos], pad_token_id=eos))
    rows = list(calculator_dataset(2 * args.pairs, seed=1))
    kinds = {"cached": lambda: CachedTurns(sampler), "reprefill": lambda: Reprefill(sampler, eos, [eos])}
    results = {k: [] for k in kinds}
    for pair in range(args.pairs):
        for kind, turns in kinds.items():
            producer = MultiTurn(tokenizer, PromptEncoder(tokenizer, None), turns, [], Environments(Calculator, []),
                                 max_completion_length=T, max_tool_calling_iterations=None, chat_template_kwargs={},
                                 eos_token_ids=[eos], pad_token_id=eos)
            torch.manual_seed(pair)
            start = time.perf_counter()
            out = producer(rows[2 * pair : 2 * pair + 2], G)
            seconds = time.perf_counter() - start
            turns_taken = sum(sum(m["role"] == "assistant" for m in c) for c in out.completions)
            results[kind].append({"seconds": seconds, "assistant_turns": turns_taken, "tool_calls": out.tool_calls,
                                  "model_tokens": int(out.tool_mask.mul(out.completion_mask).sum())})
            print(kind, pair, results[kind][-1], flush=True)
    summary = {k: statistics.median(r["seconds"] for r in v) for k, v in results.items()}
    summary["reprefill_over_cached"] = summary["reprefill"] / summary["cached"]
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"runs": results, "median_seconds": summary, "rows_per_rollout": 2 * G, "max_completion_length": T}, f, indent=1)


if __name__ == "__main__":
    main()
