"""The chunked LM head against an earlier revision's, alternated in one process: forward + backward seconds and their ratio.

    python benchmarks/head_ab.py --baseline 25512f9 --pairs 6            # bf16 autocast, 1 thread
    python benchmarks/head_ab.py --baseline 25512f9 --bf16 false                             # fp32
    python benchmarks/head_ab.py --baseline 40c9859 --tokens 881 --as-trained                # the trainer's bf16 path

SmolLM2-135M's head shapes (V = 49 152, H = 576, tied: the weight takes a
gradient) on `--tokens` completion tokens, one micro-batch of the seed
configuration (≈ 220 head tokens per micro-batch, benchmarks/flops.py), β = 0
(no π_ref) unless `--beta`; random values (the time does not depend on them).
`--baseline` is a git revision whose `ChunkedHead` (in `src/fastgrpo/update/logprobs.py`
or `update/chunked_head.py`) is loaded from the repository's history; the
current tree's is the other side. Pairs alternate which side runs first; the
report is each side's median and the median of per-pair ratios (current /
baseline), with the values compared bit for bit. `--as-trained` runs the head
as a one-process bf16 run calls it: the weight's bf16 working copy given
(no cast per call; the weight gradient added into `.grad`), the (chunk, V)
blocks kept from call to call (a `Scratch` per side) and glibc's heap kept
(run/allocator.keep_freed_memory).

Not here: the whole optimizer step (update_profile.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from run import positive_int  # noqa: E402


def baseline_head(revision: str):
    """`ChunkedHead` as it was at `revision` (its module's source, run in a fresh namespace).

    Raises:
        ValueError: no `ChunkedHead` in either module at `revision` (or no such revision).
    """
    for path in ("src/fastgrpo/update/chunked_head.py", "src/fastgrpo/update/logprobs.py"):
        done = subprocess.run(["git", "-C", ROOT, "show", f"{revision}:{path}"], capture_output=True, text=True)
        if done.returncode == 0 and "class ChunkedHead" in done.stdout:
            source = done.stdout.replace("from ..algo.losses import", "from fastgrpo.algo.losses import").replace("from .chunked_head import", "from fastgrpo.update.chunked_head import")
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
                f.write(source)
            module = types.ModuleType(f"baseline_{revision}")
            module.__file__ = f.name
            sys.modules[module.__name__] = module  # dataclasses look their module up
            exec(compile(source, f.name, "exec"), module.__dict__)
            return module.ChunkedHead
    raise ValueError(f"--baseline {revision}: no ChunkedHead in update/chunked_head.py or update/logprobs.py at that revision")


def run_once(head, inputs, bf16: bool, beta: bool, trained=None):
    """Seconds of one forward + backward, and (log-probs, ∂hidden, ∂weight); `trained`: (bf16 weight copy, Scratch) or None."""
    hidden, weight, labels, ref_hidden, ref_weight, grad = inputs
    hidden.grad = weight.grad = None
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logps, _, kl = head.apply(hidden, weight, None, labels, 1.0, ref_hidden if beta else None, ref_weight if beta else None, None, 256, False,
                                  *(trained or ()))
    ((logps * grad).sum() + 0.04 * kl.sum()).backward()
    return time.perf_counter() - start, (logps.detach(), hidden.grad.clone(), weight.grad.clone())


def main(argv=None) -> None:
    from fastgrpo.run.allocator import keep_freed_memory
    from fastgrpo.update.chunked_head import ChunkedHead, Scratch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", required=True, help="git revision of the other side")
    parser.add_argument("--tokens", type=positive_int, default=220)
    parser.add_argument("--pairs", type=positive_int, default=6)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--bf16", choices=("true", "false"), default="true")
    parser.add_argument("--beta", action="store_true", help="with π_ref (the exact KL's second head)")
    parser.add_argument("--as-trained", action="store_true", help="bf16 working copy, kept blocks, kept heap (the trainer's path)")
    args = parser.parse_args(argv)
    if args.as_trained and args.bf16 != "true":
        parser.error("--as-trained is the bf16 path: drop --bf16 false")
    try:
        baseline = baseline_head(args.baseline)
    except ValueError as err:
        parser.error(str(err))
    if args.as_trained:
        keep_freed_memory()
    torch.set_num_threads(args.threads)
    bf16 = args.bf16 == "true"
    g = torch.Generator().manual_seed(0)
    V, H, n = 49152, 576, args.tokens
    inputs = (
        torch.randn(n, H, generator=g).requires_grad_(), (0.02 * torch.randn(V, H, generator=g)).requires_grad_(),
        torch.randint(0, V, (n,), generator=g), torch.randn(n, H, generator=g), 0.02 * torch.randn(V, H, generator=g),
        torch.randn(n, generator=g),
    )
    sides = {"baseline": baseline, "current": ChunkedHead}
    copy = inputs[1].detach().to(torch.bfloat16)
    trained = {name: (copy, Scratch()) if args.as_trained else None for name in sides}
    for name, head in sides.items():  # warm-up: oneDNN primitives, the allocator
        run_once(head, inputs, bf16, args.beta, trained[name])
    seconds, values = {k: [] for k in sides}, {}
    for pair in range(args.pairs):
        for name in (("baseline", "current") if pair % 2 == 0 else ("current", "baseline")):
            s, values[name] = run_once(sides[name], inputs, bf16, args.beta, trained[name])
            seconds[name].append(s)
    ratios = [c / b for c, b in zip(seconds["current"], seconds["baseline"])]
    same = all(torch.equal(a, b) for a, b in zip(values["baseline"], values["current"]))
    print(f"{'bf16' if bf16 else 'fp32'}{' as trained' if args.as_trained else ''}, {n} tokens, {args.threads} thread(s), beta {'0.04' if args.beta else '0'}, cpu "
          f"{torch.cpu.get_capabilities().get('cpu_name', '?')}: baseline {args.baseline} median {statistics.median(seconds['baseline']):.3f} s, "
          f"current {statistics.median(seconds['current']):.3f} s, ratio median {statistics.median(ratios):.2f} "
          f"[{min(ratios):.2f}-{max(ratios):.2f}] over {args.pairs} pairs; values bit for bit equal: {same}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(ROOT, "src"))
    main()
