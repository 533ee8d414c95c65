"""DDP against FSDP2 on 2 CPU processes (1 thread each, gloo) with SmolLM2-135M: memory per process and time per step.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 benchmarks/fsdp.py OUT ddp
    OMP_NUM_THREADS=1 ACCELERATE_USE_FSDP=true FSDP_VERSION=2 torchrun --nproc_per_node 2 benchmarks/fsdp.py OUT fsdp
    python benchmarks/fsdp.py --report OUT        # the table, from OUT/*.json

Each run trains `--steps` GRPO steps (real sampling, μ = 1, fp32) and process 0
writes OUT/<name>.json: peak resident memory of each process (getrusage), the
bytes each process holds in parameters, gradients (just before the optimizer
step) and AdamW state (all local shards), seconds per optimizer step after the
first, and under FSDP the sampler copy's bytes and the seconds of each
rollout's gather (`generation/weight_copy.GatheredCopy`).

Not here: a multi-node or GPU measurement.
"""

import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
from datasets import Dataset


def local_bytes(tensors) -> int:
    """Bytes of these tensors held by this process (a DTensor's local shard only), each tensor once (tied weights).

    Keyed by the tensor's own address, not its storage's: FSDP2 keeps views into one flat buffer.
    """
    from torch.distributed.tensor import DTensor

    seen, total = set(), 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        if (local.data_ptr(), local.numel()) not in seen:
            seen.add((local.data_ptr(), local.numel()))
            total += local.numel() * local.element_size()
    return total


def reward_len(completions, **kwargs):
    return [-abs(20 - len(c[0]["content"])) / 20 for c in completions]


def run(out: str, name: str, steps: int) -> None:
    from fastgrpo import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=os.path.join(out, name), seed=0, max_steps=steps, num_generations=4, per_device_train_batch_size=4,
        gradient_accumulation_steps=1, generation_batch_size=8, max_completion_length=32, learning_rate=1e-6,
        logging_steps=1, save_strategy="no", disable_tqdm=True, bf16=False, report_to=[],
    )
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {n}."}]} for n in range(64)])
    trainer = GRPOTrainer("smollm2-135m-instruct", reward_len, args=args, train_dataset=prompts)
    optimizer = trainer.optimizer.optimizer
    grads, step_ends, gathers = [], [], []
    original_step = optimizer.step

    def measured_step(*a, **k):
        grads.append(local_bytes(p.grad for p in trainer.model.parameters() if p.grad is not None))
        result = original_step(*a, **k)
        step_ends.append(time.perf_counter())
        if trainer.backend.weight_copy is not None:
            gathers.append(trainer.backend.weight_copy.seconds)
        return result

    optimizer.step = measured_step
    trainer.train()
    states = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    mine = {
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "params_mib": local_bytes(trainer.model.parameters()) / 2**20,
        "grads_mib": max(grads) / 2**20,
        "optimizer_mib": local_bytes(states) / 2**20,
    }
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        copy = trainer.backend.weight_copy
        result = {
            "name": name, "processes": everyone, "steps": steps,
            "seconds_per_step": [b - a for a, b in zip(step_ends, step_ends[1:])],
            "gather_seconds": gathers, "sampler_copy_mib": copy.nbytes / 2**20 if copy is not None else None,
            "command": " ".join(sys.argv),
        }
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(result, f, indent=1)


def load_runs(out: str) -> dict:
    """OUT/ddp.json and OUT/fsdp.json, as `run` writes them.

    Raises:
        ValueError: one is missing, not JSON or not a run's file; naming it and the command that writes it.
    """
    from report import load_results

    runs = {}
    for name in ("ddp", "fsdp"):
        path = os.path.join(out, f"{name}.json")
        what = f"a run's file with step times (write it with torchrun ... benchmarks/fsdp.py {out} {name})"
        runs[name] = load_results(path, ("processes", "seconds_per_step", "gather_seconds", "sampler_copy_mib"), what)
        if not runs[name]["seconds_per_step"]:
            raise ValueError(f"{path} is not {what}: it has no seconds_per_step")
    return runs


def report(runs: dict) -> str:
    """A markdown table from the runs `load_runs` read."""
    import statistics

    lines = ["| | DDP | FSDP2 | FSDP2 / DDP |", "| --- | --- | --- | --- |"]

    def row(label, values):
        ratio = values[1] / values[0] if values[0] else float("nan")
        lines.append(f"| {label} | {values[0]:.0f} | {values[1]:.0f} | {ratio:.2f} |")

    for key, label in (("params_mib", "parameters (MiB)"), ("grads_mib", "gradients (MiB)"), ("optimizer_mib", "AdamW state (MiB)")):
        row(label + ", per process", [max(p[key] for p in runs[n]["processes"]) for n in ("ddp", "fsdp")])
    row("parameters + gradients + AdamW (MiB), per process",
        [max(p["params_mib"] + p["grads_mib"] + p["optimizer_mib"] for p in runs[n]["processes"]) for n in ("ddp", "fsdp")])
    row("peak resident memory (MiB), per process", [max(p["peak_rss_mib"] for p in runs[n]["processes"]) for n in ("ddp", "fsdp")])
    step = [statistics.median(runs[n]["seconds_per_step"]) for n in ("ddp", "fsdp")]
    lines.append(f"| seconds per step (median) | {step[0]:.1f} | {step[1]:.1f} | {step[1] / step[0]:.2f} |")
    fsdp = runs["fsdp"]
    lines.append(f"\nFSDP2 sampler copy: {fsdp['sampler_copy_mib']:.0f} MiB per process; gather per rollout: "
                 f"median {statistics.median(fsdp['gather_seconds']):.2f} s.")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", metavar="OUT", help="the folder of the runs' <name>.json")
    parser.add_argument("name", nargs="?", choices=("ddp", "fsdp"), help="the run to make (not with --report)")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps, 2 or more (seconds per step are between step ends)")
    parser.add_argument("--report", action="store_true", help="print the table from OUT/ddp.json and OUT/fsdp.json, run nothing")
    cli = parser.parse_args(argv)
    if cli.report:
        if cli.name:
            parser.error(f"--report runs nothing: drop {cli.name!r}")
        try:
            runs = load_runs(cli.out)
        except ValueError as err:
            parser.error(f"--report: {err}")
        print(report(runs))
        return
    if cli.name is None:
        parser.error("give the run's name after OUT (ddp or fsdp), or --report")
    if cli.steps < 2:
        parser.error(f"--steps {cli.steps}: give 2 or more (seconds per step are measured between step ends)")
    run(cli.out, cli.name, cli.steps)


if __name__ == "__main__":
    main()
