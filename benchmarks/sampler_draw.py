"""The own sampler's per-step maths: `generation/draw.py` against the single float64 cumulative sum it replaced.

    python benchmarks/sampler_draw.py                        # 32 rows × SmolLM2's 49 152 tokens, 2 threads
    python benchmarks/sampler_draw.py --rows 16 --vocab 151936 --threads 1

Times one decode step's maths on bf16 logits (what the bf16 weight copy's head gives), in a process whose
freed memory stays in glibc's heap as a CPU trainer's does (run/allocator.py): the finiteness
check, the softmax, the inverse-CDF draw and the token's log-prob at T = 1 and T = 0.7, no other
processors. The reference is the code as landed before (an `isfinite` mask over (n, V), one float64
cumulative sum over V, `log_softmax` then gather). Calls alternate (reference, draw, …) in rounds of 20;
medians of 7 rounds. Then the two draws' tokens are compared on the same uniform numbers over four
vocabularies with a third of the tokens at probability 0, and the log-probs against float64.
Prints a markdown table (the one in docs/benchmarks.md, "The sampler's per-step maths").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from transformers import LogitsProcessorList

from fastgrpo.generation.contract import SamplingSettings
from fastgrpo.generation.draw import draw, inverse_cdf
from fastgrpo.generation.processors import logits_processors
from fastgrpo.run.allocator import keep_freed_memory

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import positive_int  # noqa: E402


def reference_inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """(n,) the first index whose float64 cumulative probability exceeds u · total (the draw as landed before)."""
    cdf = probs.double().cumsum(-1)
    return torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).squeeze(1).clamp(max=probs.shape[1] - 1)


def reference_draw(logits, history, uniform, processors, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-step maths as landed before `draw`: (n,) tokens and (n,) log-probs."""
    logits = logits.float()
    if not torch.isfinite(logits).all():
        raise ValueError("non-finite logits")
    token = reference_inverse_cdf(processors(history, logits).softmax(-1), uniform)
    return token, (logits / temperature).log_softmax(-1).gather(1, token[:, None]).squeeze(1)


def per_call_ms(fn, calls: int = 20) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=positive_int, default=32)
    parser.add_argument("--vocab", type=positive_int, default=49152)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--rounds", type=positive_int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the trainer on a CPU
    torch.manual_seed(0)
    logits = (torch.randn(args.rows, args.vocab) * 3).bfloat16()
    history = torch.zeros(args.rows, 1, dtype=torch.long)
    uniform = torch.rand(args.rows, 1, dtype=torch.float64)
    caps = torch.cpu.get_capabilities()
    print(f"CPU: {caps.get('cpu_name', '?')}, avx512_bf16 {caps.get('avx512_bf16')}, amx_bf16 {caps.get('amx_bf16')}; "
          f"{args.rows} rows × {args.vocab} tokens, {args.threads} threads\n")
    print("| T | reference ms/step | draw ms/step | ratio |\n| --- | --- | --- | --- |")
    for temperature in (1.0, 0.7):
        processors = logits_processors(SamplingSettings(1, [0], 0, temperature=temperature))  # transformers' warper when T ≠ 1

        def ours():
            return draw(logits, history, uniform, processors, temperature, "x")

        def theirs():
            return reference_draw(logits, history, uniform, processors, temperature)

        ref, new = [], []
        for _ in range(2):
            ours(), theirs()  # warm-up
        for _ in range(args.rounds):
            ref.append(per_call_ms(theirs))
            new.append(per_call_ms(ours))
        r, n = statistics.median(ref), statistics.median(new)
        print(f"| {temperature} | {r:.2f} | {n:.2f} | {n / r:.2f}× |")

    print("\n| vocabulary | draws | tokens that differ | max |log-prob − float64| reference | draw |\n| --- | --- | --- | --- | --- | --- |")
    for vocab in (49152, 32000, 151936, 50257):
        differ, draws, ref_err, new_err = 0, 0, 0.0, 0.0
        for _ in range(20):
            scores = torch.randn(64, vocab) * 4
            probs = scores.softmax(-1)
            probs[:, ::3] = 0  # cut tokens, as top-k/top-p leave them
            u = torch.rand(64, 1, dtype=torch.float64)
            a, b = reference_inverse_cdf(probs, u), inverse_cdf(probs, u)
            assert (probs.gather(1, b[:, None]) > 0).all(), "drew a token of probability 0"
            differ, draws = differ + int((a != b).sum()), draws + 64
            token, logp = draw(scores, history[:1].expand(64, 1), u, LogitsProcessorList(), 0.7, "x")
            exact = (scores.double() / 0.7).log_softmax(-1).gather(1, token[:, None]).squeeze(1)
            ref_lp = (scores / 0.7).log_softmax(-1).gather(1, token[:, None]).squeeze(1)
            ref_err = max(ref_err, float((ref_lp.double() - exact).abs().max()))
            new_err = max(new_err, float((logp.double() - exact).abs().max()))
        print(f"| {vocab} | {draws} | {differ} | {ref_err:.1e} | {new_err:.1e} |")


if __name__ == "__main__":
    main()
