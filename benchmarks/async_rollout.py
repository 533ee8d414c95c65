"""Seconds per trained rollout on the built-in job: the synchronous loop against the overlap at max_staleness 1, 2, 4.

    python benchmarks/async_rollout.py                       # 2 rounds × 4 systems, 10 steps each (≈ 9 min here)
    python benchmarks/async_rollout.py --rounds 1 --steps 6  # a quick look

The vLLM server (`fastgrpo vllm-serve`, the built-in model in bf16, started once) runs on core 0 (taskset, and
vLLM's own thread binding `VLLM_CPU_OMP_THREADS_BIND=0`), each training run in its own process on core 1 (taskset,
one torch thread): the sampler and the trainer each own a core, as a GPU split gives each its own devices. The job
is the built-in one (SmolLM2-135M-Instruct, one-digit addition, G = 8, 16 completions per rollout = 2 optimizer
steps, ≤ 32 tokens) with `filter_groups` off in every system (the overlap refuses DAPO's rounds). Systems alternate
within each round.

Seconds per trained rollout: the wall-clock between the end of the first rollout's last step and the end of the
run's last step (a callback stamps each `on_step_end`), over the rollouts in between: start-up and vLLM's first
compiles stay out. Phase seconds per rollout (the synchronous runs' `seconds/*`) feed the paper estimate in
docs/benchmarks.md. Writes benchmarks/results/<date>-async-rollout.{json,md}. Every argument is checked before
the server starts.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import positive_int, writable_folder  # noqa: E402
from vllm_rollout import free_port, start_server  # noqa: E402

SYSTEMS = {"synchronous": None, "max_staleness=1": 1, "max_staleness=2": 2, "max_staleness=4": 4}
PHASES = ("weight_sync", "generate", "score", "old_logps", "ref_logps", "update")


def worker(spec: dict) -> dict:
    """One training run in this process: the built-in job with the spec's overrides; → step end times and records."""
    import torch
    from transformers import TrainerCallback

    from fastgrpo import GRPOConfig, GRPOTrainer
    from fastgrpo.cli import BUILTIN_JOB
    from fastgrpo.rollout.rewards import resolve_reward
    from fastgrpo.run.datasets import load_dataset_spec

    torch.set_num_threads(1)
    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        fields = {**BUILTIN_JOB["config"], "output_dir": out, "filter_groups": False, "max_steps": spec["steps"], "logging_steps": 1,
                  "save_strategy": "no", "disable_tqdm": True, "seed": spec["seed"], "use_vllm": True, "vllm_mode": "server",
                  "vllm_server_base_url": spec["url"], "max_staleness": spec["max_staleness"], "log_completions": False}
        args = GRPOConfig(**fields)
        dataset = load_dataset_spec(BUILTIN_JOB["dataset"], size=BUILTIN_JOB["dataset_size"], seed=args.seed)
        trainer = GRPOTrainer(BUILTIN_JOB["model"], [resolve_reward(r) for r in BUILTIN_JOB["reward"]], args=args,
                              train_dataset=dataset, callbacks=[Stamp()])
        trainer.train()
        with open(os.path.join(out, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f if '"step"' in line]
    return {"stamps": stamps, "records": records, "steps_per_rollout": args.steps_per_rollout}


def one_run(url: str, max_staleness: int | None, steps: int, seed: int) -> dict:
    """A worker process on core 1; → seconds per trained rollout, phase seconds per rollout, staleness."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec_path, "w") as f:
            json.dump({"url": url, "max_staleness": max_staleness, "steps": steps, "seed": seed}, f)
        proc = subprocess.run(["taskset", "-c", "1", sys.executable, __file__, "--worker", spec_path, out_path], capture_output=True,
                              text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            raise RuntimeError(f"max_staleness={max_staleness} failed:\n{proc.stderr[-3000:]}")
        with open(out_path) as f:
            got = json.load(f)
    spr, stamps, records = got["steps_per_rollout"], got["stamps"], got["records"]
    rollout_ends = stamps[spr - 1 :: spr]  # the end of each rollout's last step
    per_rollout = (rollout_ends[-1] - rollout_ends[0]) / (len(rollout_ends) - 1)
    later = records[spr:]  # the phases of the rollouts after the first
    phases = {p: sum(r.get(f"seconds/{p}", 0.0) for r in later) / (len(later) / spr) for p in PHASES}
    lags = [r["sample/staleness_mean"] for r in records if "sample/staleness_mean" in r]
    return {"per_rollout": per_rollout, **phases, "staleness_mean": statistics.mean(lags) if lags else 0.0,
            "reward": statistics.mean(r["reward"] for r in records if "reward" in r)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=positive_int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per run, 4 or more (2 per rollout)")
    parser.add_argument("--out", type=writable_folder, default=os.path.join(HERE, "results"))
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.steps < 4:
        parser.error(f"--steps {ns.steps}: give 4 or more (2 steps per rollout; the time per rollout is measured from the end of the first to the last)")
    if importlib.util.find_spec("vllm") is None:
        parser.error("vLLM is not installed (make vllm): fastgrpo vllm-serve cannot start")
    if shutil.which("taskset") is None or not {0, 1} <= os.sched_getaffinity(0):
        parser.error(f"the server runs on core 0 and each run on core 1 (taskset): this needs `taskset` (util-linux) and both "
                     f"cores, and this process may use cores {sorted(os.sched_getaffinity(0))}")
    if ns.worker:
        with open(ns.worker[0]) as f:
            result = worker(json.load(f))
        with open(ns.worker[1], "w") as f:
            json.dump(result, f)
        return
    import torch

    caps = torch.cpu.get_capabilities()
    port = free_port()
    server = start_server(port, core=0)
    runs: dict[str, list[dict]] = {name: [] for name in SYSTEMS}
    try:
        for r in range(ns.rounds):
            for name, staleness in SYSTEMS.items():
                row = one_run(f"http://127.0.0.1:{port}", staleness, ns.steps, seed=r)
                runs[name].append(row)
                print(f"round {r + 1} {name:16s} {row['per_rollout']:.2f} s/rollout  generate {row['generate']:.2f}  "
                      f"update {row['update']:.2f}  sync {row['weight_sync']:.2f}  lag {row['staleness_mean']:.2f}", flush=True)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
    med = {name: {k: statistics.median(x[k] for x in rows) for k in rows[0]} for name, rows in runs.items()}
    base = med["synchronous"]["per_rollout"]
    lines = [f"CPU: {caps.get('cpu_name')}, avx512_bf16 {caps.get('avx512_bf16')}, amx_bf16 {caps.get('amx_bf16')}; server on core 0, "
             f"trainer on core 1; {ns.rounds} rounds × {ns.steps} steps, medians; "
             f"`python benchmarks/async_rollout.py --rounds {ns.rounds} --steps {ns.steps}`", "",
             "| system | s per trained rollout | × synchronous | generate s | update s | weight sync s | old+ref logps s | mean lag | reward |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, m in med.items():
        lines.append(f"| {name} | {m['per_rollout']:.2f} | {m['per_rollout'] / base:.2f} | {m['generate']:.2f} | {m['update']:.2f} | "
                     f"{m['weight_sync']:.2f} | {m['old_logps'] + m['ref_logps']:.2f} | {m['staleness_mean']:.2f} | {m['reward']:.3f} |")
    stem = os.path.join(ns.out, f"{datetime.date.today().isoformat()}-async-rollout")
    with open(stem + ".json", "w") as f:
        json.dump({"runs": runs, "medians": med, "cpu": caps.get("cpu_name")}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
