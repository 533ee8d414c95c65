"""Where one optimizer step's time goes, by op, and its FLOPs against this run's measured peaks.

    python benchmarks/update_profile.py --threads 1            # bf16 (this CPU's default)
    python benchmarks/update_profile.py --threads 1 --bf16 false --steps 1                  # the fp32 path
    PYTHONPATH=OTHER/src python benchmarks/update_profile.py --time-only --steps 3          # A/B: seconds only, no profiler

The seed configuration on the built-in SmolLM2 (per_device 4, GA 4, G 8,
64/64 tokens, μ = 4, β = 0, the seed's length reward; worker.py's prompts):
one rollout is collected, one optimizer step runs as a warm-up, and the next
`--steps` steps over the same rollout (the μ passes) run under
`torch.profiler`. Every op's *self* time is attributed once, by where it ran
(forward, backward, the optimizer, gradient clipping) and by what it is:

- matmul: `mm`/`addmm`/`bmm` outside the LM head;
- weight/grad cast: a dtype copy whose input has a parameter's shape (autocast
  casting an fp32 weight to bf16 in the forward; its backward casting the bf16
  weight gradient back to fp32);
- LM head: everything inside `ChunkedHead` (its matmuls, log-softmax, entropy);
- attention: the scaled-dot-product kernels;
- norms/elementwise: the rest (RMSNorm, SiLU, rotary, adds, activation casts, indexing).

Shares of the profiled time are robust on a shared machine (others' load
stretches every op alike); the seconds are not. FLOPs are counted from the
packed rows the step actually ran (`flops.step_flops`); the peaks are
`F.linear` at 1024³ in fp32 and bf16 measured in the same process, before and
after (the best of both). Writes `<out>/<date>-update-profile-<precision>.json`.
Every argument is checked before the trainer is built (`check_args`).

`--time-only`: no profiler, no file; one line with each timed step's seconds,
which `fastgrpo` tree ran (A/B pairs alternate trees through PYTHONPATH), the
step's FLOPs and the best step's share of the fp32 and bf16 peaks measured in
the same process (of what it executes, and of its model FLOPs: without the
recomputed head logits and attention scores, `flops.step_flops`), and the
process's peak RSS. `--update-token-budget N` runs
the timed or profiled steps with micro-batches merged into passes of at most N
tokens; `--dense-attention` runs shared-prompt rows through sdpa's dense mask
instead of grouped attention (`LogProbs.grouped_attention`); `--gradient-checkpointing`
runs them with `gradient_checkpointing=True` (the FLOPs stay the model's: the
recomputed forward is not counted); `--per-device` and
`--grad-accum` apply here too.
`--ab-working-copy N`: N pairs of steps in one process, alternating the
update with and without the bf16 working copy (model/working_copy.py; without
it autocast casts every weight at every forward), the order swapped each pair;
one line with both sides' seconds and the median per-pair ratio.
`--ab-token-budget N` alternates the step's micro-batches merged into passes of
at most `--budget` tokens (`update_token_budget`) with one pass per micro-batch;
`--ab-fused-adamw N` AdamW's fused kernel (`adamw_torch_fused`) with its
for-loop (`adamw_torch` on CPU), the same optimizer state;
`--ab-head-keep N` the LM head's softmax kept from forward for backward
(`head_keep_bytes`, update/chunked_head.py) with it recomputed in backward;
`--ab-grouped-attention N` a shared-prompt row's attention piece by piece
(update/grouped_attention.py) with sdpa over the dense (L, L) mask (with
`--per-device`, `--grad-accum` and `--update-token-budget`).

Not here: whole runs against TRL (run.py), the peak table (bf16_peaks.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import flops  # noqa: E402
from run import positive_int, writable_folder  # noqa: E402
from worker import linear_peak, prompts, reward_len  # noqa: E402

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
CASTS = ("aten::_to_copy", "aten::copy_", "aten::to")
ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
             "aten::_scaled_dot_product_attention_math", "aten::_efficient_attention_forward", "aten::_softmax", "aten::_softmax_backward_data")


def build_trainer(bf16: bool | None, steps: int, model: str = "smollm2-135m-instruct", **overrides):
    """The seed configuration's trainer on SmolLM2 (as benchmarks/run.py's smollm2 case runs it, μ = 4)."""
    from datasets import Dataset

    from fastgrpo import GRPOConfig, GRPOTrainer

    values = dict(
        output_dir=tempfile.mkdtemp(prefix="update-profile-"), per_device_train_batch_size=4, gradient_accumulation_steps=4,
        num_generations=8, max_prompt_length=64, max_completion_length=64, num_iterations=4, beta=0.0, learning_rate=2e-5,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, temperature=1.0, top_p=1.0, top_k=0,
        epsilon=0.2, loss_type="dapo", max_steps=steps, seed=42, shuffle_dataset=False, bf16=bf16, disable_dropout=True,
        logging_steps=10, report_to="none", disable_tqdm=True, log_completions=False, save_strategy="no",
    )
    values.update(overrides)
    dataset = Dataset.from_list([{"prompt": r} for r in prompts(8)])
    return GRPOTrainer(model=model, reward_funcs=reward_len, args=GRPOConfig(**values), train_dataset=dataset)


@contextmanager
def head_scope():
    """Name the chunked head's forward in the profile (its backward is named by autograd: ChunkedHeadBackward)."""
    from fastgrpo.update import logprobs

    forward = logprobs.ChunkedHead.forward

    def named(ctx, *args):
        with torch.profiler.record_function("ChunkedHead.forward"):
            return forward(ctx, *args)

    logprobs.ChunkedHead.forward = staticmethod(named)
    try:
        yield
    finally:
        logprobs.ChunkedHead.forward = staticmethod(forward)


def recorded(trainer, rollout):
    """One optimizer step that records π_old (the rollout's first), → the rollout with it, as the trainer keeps it.

    Steps after it reuse the rollout with π_old set; without it π_old is still
    unset (NaN where not yet recorded) and the loss is NaN.
    """
    import dataclasses

    out = trainer.update(rollout, 0, True, 0)
    return rollout if out.old_logps is None else dataclasses.replace(rollout, old_logps=out.old_logps)


def classify(prof, param_shapes: set) -> dict:
    """({(where, what): self µs}, {(where, what, op name): self µs}) over every event of the profile (module docstring)."""
    table, ops = defaultdict(float), defaultdict(float)
    for event in prof.events():
        chain, parent = [], event.cpu_parent
        while parent is not None:
            chain.append(parent.name)
            parent = parent.cpu_parent
        if any(n.startswith("Optimizer.step") for n in chain) or event.name.startswith("Optimizer.step"):
            where = "optimizer"
        elif any(n == "clip_grad_norm" for n in chain):
            where = "clip"
        elif any(n.startswith("autograd::engine") for n in chain) or event.name.startswith("autograd::engine"):
            where = "backward"
        else:
            where = "forward"
        if any("ChunkedHead" in n for n in chain + [event.name]):
            what = "LM head"
        elif event.name in MATMULS:
            what = "matmul"
        elif event.name in CASTS and event.input_shapes and tuple(event.input_shapes[0]) in param_shapes:
            what = "weight/grad cast"
        elif event.name in ATTENTION:
            what = "attention"
        elif where in ("optimizer", "clip"):
            what = "AdamW" if where == "optimizer" else "clip"
        else:
            what = "norms/elementwise"
        table[(where, what)] += event.self_cpu_time_total
        ops[(where, what, event.name)] += event.self_cpu_time_total
    return table, ops


def ab_pairs(trainer, pairs: int, sides: dict) -> dict:
    """`pairs` pairs of optimizer steps over one rollout, alternating two settings (order swapped each pair).

    `sides`: {name: () → None setting the trainer up for that side}. → each side's seconds and the median
    per-pair ratio first / second.
    """
    import statistics

    rollout = recorded(trainer, trainer._collect())  # warm-up
    names = list(sides)
    for name in names:  # and one untimed step per side: a side's first step maps its blocks afresh
        sides[name]()
        trainer.update(rollout, 0, False, 0)
    seconds = {name: [] for name in names}
    for pair in range(pairs):
        for name in (names if pair % 2 == 0 else names[::-1]):
            sides[name]()
            start = time.perf_counter()
            trainer.update(rollout, 0, False, 0)
            seconds[name].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(seconds[names[0]], seconds[names[1]])]
    return {"seconds": seconds, "ratio_median": statistics.median(ratios), "ratios": ratios, "ratio": f"{names[0]} / {names[1]}"}


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """Refuse, before any work, two runs in one (--time-only, --ab-*) and a flag the chosen run would ignore;
    → {the --ab-* flag given: its pairs} (empty: the profile or --time-only). Exits via parser.error."""
    ab = {flag: n for flag, n in (("--ab-working-copy", args.ab_working_copy), ("--ab-token-budget", args.ab_token_budget),
                                  ("--ab-fused-adamw", args.ab_fused_adamw), ("--ab-grouped-attention", args.ab_grouped_attention),
                                  ("--ab-head-keep", args.ab_head_keep)) if n}
    if len(runs := [*ab, *(["--time-only"] if args.time_only else [])]) > 1:
        parser.error(f"{' and '.join(runs)}: one of them per call")
    for flag, used, where in (
        ("--gradient-checkpointing", args.time_only, "--time-only"),
        ("--dense-attention", args.time_only, "--time-only"),
        ("--budget", args.ab_token_budget, "--ab-token-budget"),
        ("--per-device", args.time_only or ab, "--time-only and --ab-* runs"),
        ("--grad-accum", args.time_only or ab, "--time-only and --ab-* runs"),
        ("--steps", not ab, "the profile and --time-only (--ab-* N runs N pairs)"),
    ):
        name = flag[2:].replace("-", "_")
        if getattr(args, name) != parser.get_default(name) and not used:
            parser.error(f"{flag} is for {where}: this run would ignore it")
    return ab


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--bf16", choices=("true", "false", "auto"), default="true")
    parser.add_argument("--steps", type=positive_int, default=2, help="profiled optimizer steps after one warm-up step")
    parser.add_argument("--out", type=writable_folder, default=os.path.join(HERE, "results"))
    parser.add_argument("--time-only", action="store_true", help="seconds of --steps steps, no profiler (A/B pairs)")
    parser.add_argument("--ab-working-copy", type=positive_int, default=0, metavar="N", help="N in-process pairs: with / without the working copy")
    parser.add_argument("--ab-token-budget", type=positive_int, default=0, metavar="N", help="N in-process pairs: micro-batches merged under --budget / one pass each")
    parser.add_argument("--budget", type=positive_int, default=4096, help="--ab-token-budget's update_token_budget (tokens)")
    parser.add_argument("--per-device", type=positive_int, default=4, help="per_device_train_batch_size (completions per micro-batch)")
    parser.add_argument("--grad-accum", type=positive_int, default=4, help="gradient_accumulation_steps (micro-batches per optimizer step)")
    parser.add_argument("--ab-fused-adamw", type=positive_int, default=0, metavar="N", help="N in-process pairs: AdamW's fused kernel / its for-loop")
    parser.add_argument("--update-token-budget", type=int, default=None, help="update_token_budget of the timed, profiled or grouped-attention A/B steps")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="--time-only: gradient_checkpointing=True (FLOPs: the model's, recomputation not counted)")
    parser.add_argument("--dense-attention", action="store_true", help="--time-only: sdpa over the dense mask, not grouped attention")
    parser.add_argument("--ab-grouped-attention", type=positive_int, default=0, metavar="N", help="N in-process pairs: grouped attention / sdpa with the dense mask")
    parser.add_argument("--ab-head-keep", type=positive_int, default=0, metavar="N", help="N in-process pairs: the head's softmax kept for backward / recomputed")
    args = parser.parse_args(argv)
    ab = check_args(parser, args)
    torch.set_num_threads(args.threads)
    bf16 = {"true": True, "false": False, "auto": None}[args.bf16]
    if ab:
        (pairs,) = ab.values()
        trainer = build_trainer(bf16, 3 + 2 * pairs, per_device_train_batch_size=args.per_device, gradient_accumulation_steps=args.grad_accum,
                                update_token_budget=args.update_token_budget)
        if args.ab_grouped_attention:
            sides = {"grouped": lambda: setattr(trainer.log_probs, "grouped_attention", True),
                     "dense mask": lambda: setattr(trainer.log_probs, "grouped_attention", False)}
        elif args.ab_head_keep:
            from fastgrpo.update.logprobs import HEAD_KEEP_BYTES

            sides = {"kept": lambda: setattr(trainer.log_probs, "head_keep_bytes", HEAD_KEEP_BYTES),
                     "recomputed": lambda: setattr(trainer.log_probs, "head_keep_bytes", 0)}
        elif args.ab_working_copy:
            working = trainer.log_probs.weights
            if working is None:
                raise SystemExit("--ab-working-copy: this run has no working copy (bf16 off, adapters, several processes or checkpointing)")
            sides = {"with": lambda: setattr(trainer.log_probs, "weights", working), "without": lambda: setattr(trainer.log_probs, "weights", None)}
        elif args.ab_token_budget:
            sides = {"merged": lambda: setattr(trainer.args, "update_token_budget", args.budget), "per micro-batch": lambda: setattr(trainer.args, "update_token_budget", 0)}
        else:
            groups = trainer.optimizer.param_groups
            sides = {"fused": lambda: [g.update(fused=True, foreach=None) for g in groups],
                     "for-loop": lambda: [g.update(fused=None, foreach=False) for g in groups]}
        print(json.dumps(ab_pairs(trainer, pairs, sides)))
        return
    if args.time_only:
        import fastgrpo

        peaks = {"fp32": linear_peak(torch.float32), "bf16": linear_peak(torch.bfloat16)}
        trainer = build_trainer(bf16, 1 + args.steps, update_token_budget=args.update_token_budget,
                                per_device_train_batch_size=args.per_device, gradient_accumulation_steps=args.grad_accum,
                                gradient_checkpointing=args.gradient_checkpointing)
        trainer.log_probs.grouped_attention = not args.dense_attention
        rollout = trainer._collect()
        count = flops.step_flops(trainer.accelerator.unwrap_model(trainer.model), flops.step_rows(trainer, rollout))
        rollout = recorded(trainer, rollout)  # warm-up
        seconds = []
        for _ in range(args.steps):
            start = time.perf_counter()
            trainer.update(rollout, 0, False, 0)
            seconds.append(time.perf_counter() - start)
        peaks = {k: max(v, linear_peak(getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[k]))) for k, v in peaks.items()}
        print(json.dumps({"tree": os.path.dirname(os.path.dirname(fastgrpo.__file__)), "update_token_budget": args.update_token_budget,
                          "per_device": args.per_device, "grad_accum": args.grad_accum, "dense_attention": args.dense_attention,
                          "gradient_checkpointing": args.gradient_checkpointing,
                          "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "step_seconds": seconds, "gflop": count["total"] / 1e9, "model_gflop": count["model"] / 1e9, "peaks_gflops": {k: v / 1e9 for k, v in peaks.items()},
                          "percent_of_peak": {k: 100 * count["total"] / min(seconds) / v for k, v in peaks.items()},
                          "model_percent_of_peak": {k: 100 * count["model"] / min(seconds) / v for k, v in peaks.items()}}))
        return
    peaks_before = {"fp32": linear_peak(torch.float32), "bf16": linear_peak(torch.bfloat16)}
    trainer = build_trainer(bf16, 1 + args.steps, update_token_budget=args.update_token_budget)
    model = trainer.accelerator.unwrap_model(trainer.model)
    param_shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
    rollout = trainer._collect()
    rows = flops.step_rows(trainer, rollout)
    rollout = recorded(trainer, rollout)  # warm-up: oneDNN primitives, allocator
    clip = trainer.accelerator.clip_grad_norm_

    def named_clip(*a, **k):
        with torch.profiler.record_function("clip_grad_norm"):
            return clip(*a, **k)

    trainer.accelerator.clip_grad_norm_ = named_clip
    seconds = []
    with head_scope(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(args.steps):
            start = time.perf_counter()
            trainer.update(rollout, 0, False, 0)
            seconds.append(time.perf_counter() - start)
    trainer.accelerator.clip_grad_norm_ = clip
    peaks_after = {"fp32": linear_peak(torch.float32), "bf16": linear_peak(torch.bfloat16)}
    peaks = {k: max(peaks_before[k], peaks_after[k]) for k in peaks_before}
    table, ops = classify(prof, param_shapes)
    total = sum(table.values())
    count = flops.step_flops(model, rows)
    step = min(seconds)
    date = datetime.date.today().isoformat()
    precision = "fp32" if trainer.autocast is nullcontext else "bf16"
    result = {
        "date": date, "cpu": torch.cpu.get_capabilities().get("cpu_name"), "threads": args.threads, "precision": precision,
        "step_seconds": seconds, "profiled_seconds_total_self": total / 1e6,
        "shares": {f"{w} / {k}": v / total for (w, k), v in sorted(table.items(), key=lambda kv: -kv[1])},
        "top_ops": {f"{w} / {k} / {n}": v / total for (w, k, n), v in sorted(ops.items(), key=lambda kv: -kv[1])[:25]},
        "flops": count, "peaks_flops": peaks, "peaks_before_after": [peaks_before, peaks_after],
        "percent_of_peak": {k: 100 * count["total"] / step / v for k, v in peaks.items()},
    }
    print(f"{precision}: step {step:.2f} s (best of {len(seconds)}; profiler on), {count['total'] / 1e9:.0f} GFLOP "
          f"({count['tokens']} packed tokens, {count['head_tokens']} head tokens)")
    print(f"peaks F.linear 1024³: fp32 {peaks['fp32'] / 1e9:.0f}, bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s; "
          f"step at {result['percent_of_peak']['bf16']:.0f} % of bf16, {result['percent_of_peak']['fp32']:.0f} % of fp32")
    for key, share in result["shares"].items():
        print(f"  {key:40s} {100 * share:5.1f} %")
    print("top ops:")
    for key, share in result["top_ops"].items():
        print(f"  {key:70s} {100 * share:5.1f} %")
    with open(os.path.join(args.out, f"{date}-update-profile-{precision}.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
