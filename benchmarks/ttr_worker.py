"""One time-to-reward run: one system (fastgrpo or TRL), one task, one setting, one seed, alone in its process.

    python benchmarks/ttr_worker.py SPEC.json OUT.json      (time_to_reward.py writes SPEC and reads OUT)

Both systems get the same model folder, the same reasoning-gym rows in the
same order (`shuffle_dataset=False`, rows generated from the seed), the same
reward functions (fastgrpo's built-ins, plain callables to TRL) and the same
GRPOConfig values. Training stops once `budget_seconds` of wall-clock have
passed since `train()` began (a `TrainerCallback` sets `should_training_stop`
after the step that crosses it; both systems honour it). Every reward call is
recorded: its time (seconds since `train()` began), the process's kernel CPU
seconds by then (`kernel_seconds`) and each function's values,
one call per rollout in both systems (per sampling round with dynamic
sampling); the seconds spent in the rollout (sampling, scoring, advantages,
π_old/π_ref passes) and in sampling alone, and the rollouts trained on.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time

import torch

# The two tasks (time_to_reward.TASKS says why each).
DATASETS = {
    "arithmetic": dict(tasks=["basic_arithmetic"], task_kwargs={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    "addition": dict(
        tasks=["basic_arithmetic"], few_shot=2,
        task_kwargs={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
                     "allow_parentheses": False, "allow_negation": False},
    ),
}


def exact_reward(completions, entry=None, **kwargs) -> list[float]:
    """1.0 when reasoning-gym's scorer gives full marks (the exact answer), else 0: correctness alone."""
    from fastgrpo.tasks.rewards import reasoning_gym_reward

    return [float(s == 1.0) for s in reasoning_gym_reward(completions, entry=entry)]


def reward_funcs(task: str) -> list:
    from fastgrpo.tasks.rewards import brevity_reward, reasoning_gym_reward

    return [reasoning_gym_reward, brevity_reward] if task == "arithmetic" else [exact_reward]


def job_config() -> dict:
    """The built-in job's GRPOConfig fields that shape training (time_to_reward.py fixes them once per suite)."""
    from fastgrpo.cli import BUILTIN_JOB

    # filter_groups: TRL has no such field; a suite sets it (the "dapo" suite, both ways)
    skip = ("output_dir", "filter_groups", "max_prompt_length", "max_steps", "save_steps", "save_total_limit", "log_completions", "num_completions_to_print", "logging_steps")
    return {k: v for k, v in BUILTIN_JOB["config"].items() if k not in skip}


def config_values(spec: dict, output_dir: str) -> dict:
    """GRPOConfig fields both systems receive (TRL names, identical values): the built-in job's, plus the setting's."""
    return {
        **spec["job"], "output_dir": output_dir, "seed": spec["seed"], "max_steps": 100_000, "shuffle_dataset": False,
        "save_strategy": "no", "logging_steps": 1_000_000, "report_to": "none", "disable_tqdm": True, "log_completions": False,
        # TRL defaults to bf16 autocast and gradient checkpointing; fastgrpo to neither on CPU. Same work: both off.
        "bf16": False, "gradient_checkpointing": False, "disable_dropout": True, "top_k": 0,
        **spec["overrides"],
    }


def kernel_seconds() -> float:
    """This process's kernel-mode CPU seconds so far (`getrusage`): on the benchmark VM mostly first touches of
    memory the host backs page by page (docs/benchmarks.md, "Where the first step's extra seconds go")."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def main(spec_path: str, out_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    torch.set_num_threads(spec["threads"])
    from transformers import TrainerCallback

    from fastgrpo.tasks.reasoning_gym import reasoning_gym_dataset

    dataset = reasoning_gym_dataset(size=spec["dataset_size"], seed=spec["seed"], **DATASETS[spec["task"]])
    calls: list[dict] = []
    clock = {"t0": time.perf_counter(), "kernel0": kernel_seconds()}
    now = lambda: time.perf_counter() - clock["t0"]  # noqa: E731

    def recorded(fn):
        def wrapper(*args, **kwargs):
            values = fn(*args, **kwargs)
            calls.append({"time": now(), "kernel_seconds": kernel_seconds() - clock["kernel0"], "reward": fn.__name__,
                          "values": [float(v) for v in values]})
            return values

        wrapper.__name__ = fn.__name__
        return wrapper

    class Budget(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock["t0"], clock["kernel0"] = time.perf_counter(), kernel_seconds()

        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = now() >= spec["budget_seconds"]

    if spec["system"] == "trl":
        from trl import GRPOConfig, GRPOTrainer
    else:
        from fastgrpo import GRPOConfig, GRPOTrainer
    output_dir = tempfile.mkdtemp(prefix=f"ttr-{spec['system']}-")
    values = config_values(spec, output_dir)
    if spec["system"] != "trl":
        values["max_prompt_length"] = 512  # no truncation in either (TRL 1.16 has no such field)
    trainer = GRPOTrainer(model=spec["model_path"], reward_funcs=[recorded(f) for f in reward_funcs(spec["task"])],
                          args=GRPOConfig(**values), train_dataset=dataset, callbacks=[Budget()])
    phases, counts = {"rollout": 0.0, "generate": 0.0}, {"rollout": 0}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start, counts[name] = time.perf_counter(), counts.get(name, 0) + 1
            try:
                return fn(*args, **kwargs)
            finally:
                phases[name] += time.perf_counter() - start

        return wrapper

    if spec["system"] == "trl":  # rollout: sampling, scoring, advantages and the π_old/π_ref passes, in both
        trainer._generate_and_score_completions = timed("rollout", trainer._generate_and_score_completions)
        trainer._generate_single_turn = timed("generate", trainer._generate_single_turn)
    else:  # the trainer's PhaseTimer (run/metrics.py), its public seam: the rollout is every phase but the update
        last = ["update"]

        def phase_ended(phase, start, end):
            if phase != "update":
                phases["rollout"] += end - start
                phases["generate"] += (end - start) if phase == "generate" else 0.0
                counts["rollout"] += int(last[0] == "update")  # a rollout's phases begin after an update (or the start)
            last[0] = phase

        trainer.timer.listen(phase_ended)
    trainer.train()
    result = {"spec": spec, "train_seconds": now(), "steps": trainer.state.global_step, "calls": calls, "phase_seconds": phases, "rollouts": counts["rollout"],
              "target_kl_stops": getattr(trainer, "target_kl_stops", None)}
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(sys.argv[1], sys.argv[2])
