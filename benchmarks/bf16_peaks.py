"""fp32 vs bf16 product speed on this machine: the shapes behind `bf16=None`'s decision.

    python benchmarks/bf16_peaks.py --threads 1

For each shape of issue 18's table (M×K×N: the update's MLP and LM-head
products, decode at batch 16), GFLOP/s of `F.linear(x, w)` = x @ wᵀ (nn.Linear's
layout, what every forward runs) in fp32 and in bf16, best of 3 after a warm-up,
and the precision `precision.resolve_bf16` picks for this CPU. Writes
benchmarks/results/<date>-bf16-peaks.json and .md.

Not here: whole training runs (run.py --cases bf16).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch

from fastgrpo.model.precision import resolve_bf16

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import positive_int, writable_folder  # noqa: E402

SHAPES = [(2048, 2048, 2048), (256, 576, 1536), (512, 1536, 576), (256, 576, 49152), (16, 576, 1536), (16, 576, 49152)]


def gflops(M: int, K: int, N: int, dtype: torch.dtype, repeats: int = 3) -> float:
    x, w = torch.randn(M, K, dtype=dtype), torch.randn(N, K, dtype=dtype)
    torch.nn.functional.linear(x, w)  # warm-up
    best = min(_seconds(lambda: torch.nn.functional.linear(x, w)) for _ in range(repeats))  # noqa: B023
    return 2 * M * K * N / best / 1e9


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--out", type=writable_folder, default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    caps = torch.cpu.get_capabilities()
    rows = []
    for M, K, N in SHAPES:
        fp32, bf16 = gflops(M, K, N, torch.float32), gflops(M, K, N, torch.bfloat16)
        rows.append({"shape": [M, K, N], "fp32_gflops": fp32, "bf16_gflops": bf16})
        print(f"{M}×{K}×{N}: fp32 {fp32:.1f}, bf16 {bf16:.1f} GFLOP/s ({bf16 / fp32:.2f}×)", flush=True)
    decision = resolve_bf16(None, use_cuda=False, cpu_capabilities=caps)
    date = datetime.date.today().isoformat()
    result = {"date": date, "threads": args.threads, "torch": torch.__version__, "cpu": caps.get("cpu_name"),
              "bf16_units": {k: bool(caps.get(k)) for k in ("amx_bf16", "avx512_bf16")}, "decision": decision._asdict(), "rows": rows}
    with open(os.path.join(args.out, f"{date}-bf16-peaks.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"# fp32 vs bf16 products, {date} ({result['cpu']}, {args.threads} thread(s), torch {torch.__version__})", "",
             f"bf16=None decides: {decision.notice}", "",
             "| shape (M×K×N) | fp32 GFLOP/s | bf16 GFLOP/s | bf16 / fp32 |", "| --- | --- | --- | --- |"]
    lines += [f"| {'×'.join(map(str, r['shape']))} | {r['fp32_gflops']:.1f} | {r['bf16_gflops']:.1f} | {r['bf16_gflops'] / r['fp32_gflops']:.2f}× |" for r in rows]
    with open(os.path.join(args.out, f"{date}-bf16-peaks.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
