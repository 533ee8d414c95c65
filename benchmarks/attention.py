"""One layer's attention over a shared-prompt packed row: sdpa with the dense (L, L) mask against grouped_attention.

    python benchmarks/attention.py --threads 1            # SmolLM2's heads (9 query, 3 key, 64 wide), bf16

Rows of 1, 2, 4 and 8 groups of G = 8 completions (4 for one group, the seed
configuration's micro-batch), prompts of 45 tokens, completions of 20–64
tokens (seeded): the shapes of update_profile.py's passes. The dense side is
what a Llama layer runs without grouped attention: transformers'
`sdpa_attention_forward` with packing.pack's (1, 1, L, L) mask (which, given a
mask, repeats the key heads rather than use sdpa's grouped-query path). Each
side runs forward + backward on the same q, k, v (bf16, as the update's bf16
products make them; (1, heads, L, 64) views of (1, L, heads, 64) blocks, as
the layer's projections leave them), alternated, the median of 6 after a
warm-up; one line per row size with both sides' milliseconds and the
query–key pairs each computes, and which of the two pack chooses for the row
(`grouped_attention.use_layout`; the grouped side is timed either way).

Not here: whole optimizer steps (update_profile.py --ab-grouped-attention).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch

from transformers.integrations.sdpa_attention import sdpa_attention_forward

from fastgrpo.update.grouped_attention import grouped_attention
from fastgrpo.update import packing
from fastgrpo.update.grouped_attention import use_layout
from fastgrpo.update.packing import pack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import positive_int  # noqa: E402

HEADS, KV_HEADS, DIM, PROMPT, COMPLETION = 9, 3, 64, 45, 64


def rows(groups: int, seed: int = 0):
    """The dense-mask and grouped packings of `groups` prompts with their completions."""
    g = torch.Generator().manual_seed(seed)
    G = 8 if groups > 1 else 4
    prompt_ids = torch.randint(1, 999, (groups, PROMPT), generator=g).repeat_interleave(G, 0)
    lengths = torch.randint(20, COMPLETION + 1, (groups * G,), generator=g)
    completion_mask = (torch.arange(COMPLETION)[None] < lengths[:, None]).long()
    completion_ids = torch.randint(1, 999, (groups * G, COMPLETION), generator=g)
    args = (prompt_ids, torch.ones_like(prompt_ids), completion_ids, completion_mask, True)
    take_layout, packing.use_layout = packing.use_layout, lambda layout, length: True  # the layout whatever pack would choose
    try:
        return pack(*args), pack(*args, grouped=True)
    finally:
        packing.use_layout = take_layout


def timed(fn, repeats: int = 6) -> float:
    """Median milliseconds of forward + backward."""
    fn().float().sum().backward()  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn().float().sum().backward()
        seconds.append(time.perf_counter() - start)
    return 1e3 * statistics.median(seconds)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=positive_int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    module = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True)
    for groups in (1, 2, 4, 8):
        dense, grouped = rows(groups)
        L = dense.input_ids.shape[1]
        g = torch.Generator().manual_seed(groups)
        leaves = [torch.randn(1, L, n, DIM, generator=g).to(torch.bfloat16).requires_grad_() for n in (HEADS, KV_HEADS, KV_HEADS)]
        q, k, v = (x.transpose(1, 2) for x in leaves)  # as the layer's projections leave them
        sides = {
            "dense mask": lambda: sdpa_attention_forward(module, q, k, v, dense.attention_mask)[0],
            "grouped": lambda: grouped_attention(module, q, k, v, None, attention_layout=grouped.layout)[0],
        }
        ms = {name: [] for name in sides}
        for turn in range(2):  # alternated
            for name in (list(sides) if turn == 0 else list(sides)[::-1]):
                ms[name].append(timed(sides[name]))
        pairs = {"dense mask": L * L, "grouped": grouped.layout.pairs}
        print(json.dumps({"groups": groups, "L": L, "ms_forward_backward": {n: round(min(t), 2) for n, t in ms.items()},
                          "pairs_per_head": pairs, "grouped / dense": round(min(ms["grouped"]) / min(ms["dense mask"]), 2),
                          "pack chooses": "grouped" if use_layout(grouped.layout, L) else "dense mask"}))


if __name__ == "__main__":
    main()
