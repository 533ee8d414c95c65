"""fastgrpo's sampler: rollout generation vs TRL's, and decode step time vs the machine's limit.

    python benchmarks/sampler.py            # CPU, 1 thread, fp32 (a few minutes)
    python benchmarks/sampler.py --bf16 --skip-trl --pairs 1                # CPU, the bf16 path; decode vs both peaks
    python benchmarks/sampler.py --device cuda --skip-trl                   # CUDA, bf16 autocast, vs transformers' generate

Part 1, seconds per rollout at the seed configuration (benchmarks/run.py:
2 chat prompts from worker.py × G = 8, 64-token completions, sampling
temperature 1, top_p 1, top_k 0): fastgrpo's `Sampler` against TRL 1.16's own
generation path (`GRPOTrainer._generate_single_turn`: padding, transformers'
`generate` on the prompts repeated G times, EOS masking) — or, with
`--skip-trl`, fastgrpo's `TransformersGenerator` (the same `generate` call).
Runs alternate (fastgrpo, peer, fastgrpo, peer …), each pair with its own seed
shared by both, after one warm-up each; medians and per-pair ratios.

Part 2, decode seconds per step of the sampler at batch 1, 8, 16, 64 and
completion lengths 64 and 256, against the step's limit: the larger of its
matmul FLOPs at this run's measured 2048³ matmul FLOP/s and its bytes read
(weights once, plus the KV cache) at this run's measured read bandwidth. A
step is timed at the mid-completion context (prompt + L/2), which is the mean
step of an L-token completion since only attention grows with the context:
(time of a (1 + k)-token call − time of a 1-token call) / k, best of 2, no EOS.
Beside it, the same step's matmuls alone (`bare_matmuls`): what the GEMM
reaches at these skinny shapes with the weights streamed from memory.

Writes benchmarks/results/<date>-sampler.json and .md (the tables in docs/benchmarks.md); every
argument (and that --out can be written) is checked before the first measurement.
Not here: the trainer benchmark (run.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import positive_int, writable_folder  # noqa: E402
from worker import matmul_peak, prompts, reward_len  # noqa: E402

from fastgrpo.rollout.prompts import PromptEncoder  # noqa: E402
from fastgrpo.generation.contract import SamplingSettings  # noqa: E402
from fastgrpo.generation.transformers_generate import TransformersGenerator  # noqa: E402
from fastgrpo.model.loading import load_model, load_tokenizer, resolve_model_path  # noqa: E402
from fastgrpo.generation.sampler import Sampler  # noqa: E402
from fastgrpo.generation.weight_copy import MergedCopy  # noqa: E402

MODEL = "smollm2-135m-instruct"
G, T, MAX_PROMPT = 8, 64, 64  # the seed configuration (run.py's SEED_CONFIG)


def read_bandwidth(device: torch.device, megabytes: int = 512, repeats: int = 5) -> float:
    """Best bytes/s of summing a `megabytes` fp32 tensor (one read of every byte)."""
    x = torch.ones(megabytes * 2**20 // 4, device=device)
    best = 0.0
    for _ in range(repeats + 1):
        start = time.perf_counter()
        x.sum().item()
        best = max(best, x.numel() * 4 / (time.perf_counter() - start))
    return best


def synced(fn):
    """Seconds of `fn()` (CUDA synchronised before and after)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def trl_generator(model_path: str, tokenizer, device: torch.device, temp_dir: str):
    """TRL 1.16's generation path as a (prompt_ids, prompt_mask, G) → token lists call."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=temp_dir, per_device_train_batch_size=4, gradient_accumulation_steps=4, num_generations=G,
        max_completion_length=T, temperature=1.0, top_p=1.0, top_k=0, bf16=device.type == "cuda",
        report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=device.type == "cpu",
    )
    dataset = Dataset.from_list([{"prompt": p} for p in prompts(2)])
    trainer = GRPOTrainer(model=model_path, reward_funcs=reward_len, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.model.eval()

    def generate(ids, mask, num_generations):
        rows = [row[m.bool()].tolist() for row, m in zip(ids, mask) for _ in range(num_generations)]
        completions, _ = trainer._generate_single_turn(rows, None, {}, num_generations)
        return completions

    return generate


def rollout_seconds(ours, peer, ids, mask, pairs: int) -> list[dict]:
    """Alternating timed rollouts (ours, peer) with a shared seed per pair; tokens counted up to EOS."""
    runs = []
    for pair in range(-1, pairs):  # pair −1: warm-up
        row = {}
        for name, generate in (("fastgrpo", ours), ("peer", peer)):
            torch.manual_seed(pair + 100)
            out = {}
            row[name] = synced(lambda: out.setdefault("ids", generate(ids, mask, G)))  # noqa: B023
            ids_out = out["ids"]
            row[name + "_tokens"] = sum(len(r) for r in ids_out) if isinstance(ids_out, list) else None
        if pair >= 0:
            runs.append(row)
    return runs


def matmul_params(model) -> int:
    """Weights a decode step multiplies by: every Linear in the decoder layers, and the LM head."""
    layers = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    return layers + model.lm_head.weight.numel()


def bare_matmuls(model, batch: int, device: torch.device, autocast) -> float:
    """Seconds of one decode step's matmuls alone: every decoder Linear, then the LM head, at `batch` rows, best of 3.

    The same products as a step, in the same order, with nothing between them:
    what this machine's GEMM reaches at these shapes, as opposed to the 2048³ peak.
    With bf16 (`autocast`), the weights are cast once beforehand, as the sampler's bf16 copy holds them.
    """
    dtype = autocast or torch.float32
    linears = [m for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)] + [model.lm_head]
    weights = [m.weight.detach().to(dtype) for m in linears]
    inputs = {m.in_features: torch.randn(batch, m.in_features, device=device, dtype=dtype) for m in linears}

    def run():
        with torch.no_grad():
            for w in weights:
                torch.nn.functional.linear(inputs[w.shape[1]], w)

    run()
    return min(synced(run) for _ in range(3))


def decode_table(model, tokenizer, ids, mask, device, autocast, peak: float, bandwidth: float, batches, lengths, peaks: dict | None = None) -> list[dict]:
    """Decode seconds per step at each (batch, completion length) vs the compute/read limit.

    `peak` is the run's precision's matmul FLOP/s; `peaks` ({"fp32": …, "bf16": …}, CPU) adds each row's
    step against the limit at either peak (`percent_of_limit_at`), the bytes read at the run's precision.
    """
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    params, bytes_per = matmul_params(model), 4 if autocast is None else 2
    prompt = ids[:1, mask[0].bool()]  # (1, P) the first chat prompt, no padding
    sync = MergedCopy(model) if autocast is not None else None  # bf16: the sampler's own copy, as the trainer builds it
    rows = []
    for length in lengths:
        repeats = -(-(length // 2) // prompt.shape[1])  # lengthen the prompt to prompt + L/2 tokens
        context_ids = torch.cat([prompt] * (repeats + 1), dim=1)[:, : prompt.shape[1] + length // 2]
        context = context_ids.shape[1]
        for batch in batches:
            k = 4 if batch >= 64 else 8
            times = {}
            for steps in (1, 1 + k):
                no_eos = SamplingSettings(max_completion_length=steps, eos_token_ids=[], pad_token_id=tokenizer.pad_token_id)
                sampler = Sampler(model, no_eos, weight_copy=sync)
                one_mask = torch.ones_like(context_ids)
                times[steps] = min(synced(lambda: sampler.sample(context_ids, one_mask, batch)) for _ in range(2))  # noqa: B023
            step = (times[1 + k] - times[1]) / k
            matmuls = bare_matmuls(model, batch, device, autocast)
            attention_flops = 4 * batch * config.num_hidden_layers * config.num_attention_heads * head_dim * context
            flops = 2 * batch * params + attention_flops
            kv_bytes = 2 * batch * config.num_hidden_layers * config.num_key_value_heads * head_dim * context * bytes_per
            limit = max(flops / peak, (params * bytes_per + kv_bytes) / bandwidth)
            at = {k: 100 * max(flops / v, (params * bytes_per + kv_bytes) / bandwidth) / step for k, v in (peaks or {}).items()}
            rows.append({"batch": batch, "completion_length": length, "context": context, "step_seconds": step, "percent_of_limit_at": at,
                         "limit_seconds": limit, "fraction_of_limit": limit / step, "bare_matmul_seconds": matmuls, "gflops_per_second": flops / step / 1e9,
                         "compute_bound": flops / peak >= (params * bytes_per + kv_bytes) / bandwidth})
            print(f"decode batch {batch:3d} L {length:3d}: {step * 1e3:7.1f} ms/step, limit {limit * 1e3:6.1f} ms ({limit / step:.0%}), "
                  f"bare matmuls {matmuls * 1e3:6.1f} ms", flush=True)
    return rows


def markdown(result: dict) -> str:
    r = result
    lines = [f"# Sampler benchmark, {r['date']} ({r['device']}, {r['threads']} thread(s), {r['precision']})", "",
             f"matmul peak {r['matmul_flops'] / 1e9:.1f} GFLOP/s (2048³)"
             + ("".join(f", {k} {v / 1e9:.1f}" for k, v in r["matmul_peaks"].items()) if r.get("matmul_peaks") else "")
             + f", read bandwidth {r['read_bandwidth'] / 1e9:.1f} GB/s", "",
             f"## Seconds per rollout: 2 prompts × G = {G}, {T}-token completions (fastgrpo vs {r['peer']})", "",
             "| pair | fastgrpo s | tokens | peer s | tokens | ratio |", "| --- | --- | --- | --- | --- | --- |"]
    for i, run in enumerate(r["rollouts"]):
        lines.append(f"| {i} | {run['fastgrpo']:.2f} | {run['fastgrpo_tokens']} | {run['peer']:.2f} | {run['peer_tokens']} | {run['fastgrpo'] / run['peer']:.2f} |")
    lines += [f"| median | {r['rollout_median']['fastgrpo']:.2f} | | {r['rollout_median']['peer']:.2f} | | {r['rollout_median']['ratio']:.2f} |", "",
              "## Decode step vs its limit (mid-completion context)", "",
              "| batch | completion length | context | ms/step | limit ms | % of limit | % of limit at the fp32 / bf16 peak | GFLOP/s | bound | bare matmuls ms |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for d in r["decode"]:
        at = d.get("percent_of_limit_at") or {}
        both = " / ".join(f"{at[k]:.0f} %" for k in ("fp32", "bf16") if k in at) or "—"
        lines.append(f"| {d['batch']} | {d['completion_length']} | {d['context']} | {d['step_seconds'] * 1e3:.1f} | {d['limit_seconds'] * 1e3:.1f} | "
                     f"{d['fraction_of_limit']:.0%} | {both} | {d['gflops_per_second']:.1f} | {'compute' if d['compute_bound'] else 'reads'} | "
                     f"{d['bare_matmul_seconds'] * 1e3:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (cuda:N) on a machine with a CUDA GPU")
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--pairs", type=positive_int, default=3, help="timed rollout pairs after the warm-up")
    parser.add_argument("--batches", type=positive_int, nargs="+", default=[1, 8, 16, 64])
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[64, 256], help="completion lengths (tokens)")
    parser.add_argument("--bf16", action="store_true", help="CPU: the bf16 path (autocast, the sampler's bf16 copy), as the trainer's bf16=None on a CPU with bf16 units")
    parser.add_argument("--skip-trl", action="store_true", help="compare with fastgrpo's TransformersGenerator instead of TRL")
    parser.add_argument("--out", type=writable_folder, default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda") or (device.type == "cuda" and not torch.cuda.is_available()):
        parser.error(f"--device {args.device!r}: give cpu, or cuda (cuda:N) on a machine with a CUDA GPU")
    torch.set_num_threads(args.threads)
    # bf16 on CUDA, and on CPU with --bf16: the trainer's bf16 path (the sampler multiplies its own bf16 copy)
    autocast = torch.bfloat16 if device.type == "cuda" or args.bf16 else None
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)} if device.type == "cpu" else None
    peak = _cuda_peak() if peaks is None else peaks["bf16" if autocast else "fp32"]
    bandwidth = read_bandwidth(device)
    tokenizer = load_tokenizer(MODEL)
    model = load_model(MODEL).to(device).eval()
    ids, mask, _ = PromptEncoder(tokenizer, MAX_PROMPT)(prompts(2))
    ids, mask = ids.to(device), mask.to(device)
    sampling = SamplingSettings(max_completion_length=T, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id)
    ours = Sampler(model, sampling, weight_copy=MergedCopy(model) if autocast is not None else None)
    if args.skip_trl:
        generate = TransformersGenerator(model, sampling)
        peer_name, peer = "transformers generate", lambda i, m, g: _autocast_call(generate, autocast, i, m, g)  # noqa: E731
    else:
        peer_name, peer = "TRL 1.16", trl_generator(resolve_model_path(MODEL), tokenizer, device, tempfile.mkdtemp())
    # token counts for fastgrpo's padded output: up to and including the first EOS
    counted = lambda i, m, g: _token_lists(ours.sample(i, m, g).completion_ids, tokenizer.eos_token_id)  # noqa: E731
    rollouts = rollout_seconds(counted, peer, ids, mask, args.pairs)
    for run in rollouts:
        print(f"rollout: fastgrpo {run['fastgrpo']:.2f} s, {peer_name} {run['peer']:.2f} s, ratio {run['fastgrpo'] / run['peer']:.2f}", flush=True)
    decode = decode_table(model, tokenizer, ids, mask, device, autocast, peak, bandwidth, args.batches, args.lengths, peaks)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "device": args.device,
        "threads": args.threads, "precision": "bf16 autocast" if autocast else "fp32", "platform": platform.platform(),
        "torch": torch.__version__, "matmul_flops": peak, "matmul_peaks": peaks, "read_bandwidth": bandwidth, "peer": peer_name,
        "rollouts": rollouts, "decode": decode,
        "rollout_median": {"fastgrpo": statistics.median(r["fastgrpo"] for r in rollouts),
                           "peer": statistics.median(r["peer"] for r in rollouts),
                           "ratio": statistics.median(r["fastgrpo"] / r["peer"] for r in rollouts)},
        "command": " ".join(sys.argv),
    }
    stem = os.path.join(args.out, f"{datetime.date.today()}-sampler{'' if args.device == 'cpu' else '-' + args.device}")
    table = markdown(result)  # before either file is opened: a failure here leaves an earlier pair of files whole
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(table)
    print(table)


def _token_lists(completion_ids: torch.Tensor, eos: int) -> list[list[int]]:
    lists = []
    for row in completion_ids.tolist():
        lists.append(row[: row.index(eos) + 1] if eos in row else row)
    return lists


def _autocast_call(generate: TransformersGenerator, dtype: torch.dtype | None, ids, mask, num_generations):
    """`generate` under the trainer's autocast (bf16 on CUDA), as token lists up to EOS."""
    with torch.autocast(ids.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        return _token_lists(generate.sample(ids, mask, num_generations).completion_ids, generate.config.eos_token_id[0])


def _cuda_peak(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    synced(lambda: a @ a)
    return 2 * n**3 / min(synced(lambda: a @ a) for _ in range(5))


if __name__ == "__main__":
    main()
