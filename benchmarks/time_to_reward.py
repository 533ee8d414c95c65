"""Time to reward: wall-clock and rollouts until a target reward, fastgrpo's μ settings against TRL, several seeds.

    python benchmarks/time_to_reward.py                                   # the built-in job's settings, 3 seeds
    python benchmarks/time_to_reward.py --suite sweep --seeds 0           # learning rate × μ × ε, fastgrpo
    python benchmarks/time_to_reward.py --suite addition                  # correctness only (reasoning-gym addition)
    python benchmarks/time_to_reward.py --suite dapo --seeds 0 --append   # dynamic sampling off/on (one seed per call, appended)
    python benchmarks/time_to_reward.py --suite vllm                      # the own sampler vs vLLM colocate (needs `make vllm`)
    python benchmarks/time_to_reward.py --suite async                     # vLLM server: synchronous vs max_staleness 1, 4 (needs `make vllm`)
    python benchmarks/time_to_reward.py --suite best                      # TRL bf16 autocast and fp32 against fastgrpo's defaults (built-in job, ± group filter)
    python benchmarks/time_to_reward.py --suite reuse                     # μ ∈ {1, 2, 4} and target_kl, 256-token completions (sampling-heavy)
    python benchmarks/time_to_reward.py --report benchmarks/results/<file>.json   # re-render tables and plots

Every run is its own process (ttr_worker.py) with a wall-clock budget. Runs go
seed by seed, every setting once per seed, so drift on a shared machine hits
all settings alike. Figures (written to `<out>/<date>-ttr-<suite>.{json,md,png}`):

- rolling reward: the mean reward (sum of the reward functions) of the
  completions of the last ROLLING rollouts, at each rollout's scoring time
  (seconds since `train()` began: generation, scoring and updates all count).
  With dynamic sampling a scoring call is one sampling round of any size, so
  the "dapo" suite averages the last ROLLING_COMPLETIONS sampled completions
  instead (the same 48 as 3 rollouts of the fixed-size job).
- time to target: the first scoring time at which the rolling reward reaches
  the suite's target; "—" if the budget ran out first. Median and range over seeds.
- rollouts to target: the same, counted in rollouts (the seed's own measure).
- kernel s to target: the run's kernel-mode CPU seconds from `train()`'s start
  to that scoring call, per seed: on the benchmark VM mostly first touches of
  memory, which its host backs page by page (2–3 s per GiB).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from report import load_results  # noqa: E402
from run import positive_int, run_worker, writable_folder  # noqa: E402

ROLLING = 3  # rollouts: 48 completions on the built-in job
ROLLING_COMPLETIONS = 48  # the "dapo" suite's window: sampling rounds differ in size

BUILTIN = [  # (name, system, overrides): the comparison on the built-in job
    ("TRL μ=1", "trl", {"num_iterations": 1}),
    ("fastgrpo μ=1", "fastgrpo", {"num_iterations": 1}),
    ("TRL μ=4", "trl", {"num_iterations": 4}),
    ("fastgrpo μ=2", "fastgrpo", {"num_iterations": 2}),
    ("fastgrpo μ=4", "fastgrpo", {"num_iterations": 4}),
    ("fastgrpo μ=4 target_kl=0.005", "fastgrpo", {"num_iterations": 4, "target_kl": 0.005}),
]
SWEEP = [  # fastgrpo only, around the built-in suite (lr 1e-5, ε 0.2): learning rate × μ, ε and target_kl at μ = 4
    *[(f"fastgrpo μ={mu} lr=3e-05", "fastgrpo", {"num_iterations": mu, "learning_rate": 3e-5}) for mu in (1, 2, 4)],
    ("fastgrpo μ=4 lr=3e-05 target_kl=0.005", "fastgrpo", {"num_iterations": 4, "learning_rate": 3e-5, "target_kl": 0.005}),
    ("fastgrpo μ=4 ε=0.1", "fastgrpo", {"num_iterations": 4, "epsilon": 0.1}),
    ("fastgrpo μ=4 ε=0.3", "fastgrpo", {"num_iterations": 4, "epsilon": 0.3}),
    ("fastgrpo μ=4 target_kl=0.002", "fastgrpo", {"num_iterations": 4, "target_kl": 0.002}),
    ("fastgrpo μ=4 target_kl=0.02", "fastgrpo", {"num_iterations": 4, "target_kl": 0.02}),
]
LR3 = [  # the sweep's fastest learning rate, side by side with TRL at the same rate
    ("TRL μ=1 lr=3e-05", "trl", {"num_iterations": 1, "learning_rate": 3e-5}),
    ("fastgrpo μ=1 lr=3e-05", "fastgrpo", {"num_iterations": 1, "learning_rate": 3e-5}),
    ("fastgrpo μ=4 lr=3e-05 target_kl=0.005", "fastgrpo", {"num_iterations": 4, "learning_rate": 3e-5, "target_kl": 0.005}),
]
DAPO = [  # dynamic sampling (filter_groups) off and on, on the built-in job (addition, exact answers only)
    ("fastgrpo μ=1", "fastgrpo", {"num_iterations": 1, "filter_groups": False}),
    ("fastgrpo μ=1 filter_groups", "fastgrpo", {"num_iterations": 1, "filter_groups": True}),
    ("fastgrpo μ=2 filter_groups", "fastgrpo", {"num_iterations": 2, "filter_groups": True}),
]
VLLM = [  # the own sampler against vLLM (colocate) on the built-in job, both at this CPU's fastest precision (bf16)
    ("fastgrpo μ=1 bf16", "fastgrpo", {"num_iterations": 1, "bf16": True}),
    ("fastgrpo μ=1 bf16 vLLM colocate", "fastgrpo", {"num_iterations": 1, "bf16": True, "use_vllm": True}),
]
ASYNC = [  # the vLLM server (core 0) and one trainer (core 1): the synchronous loop against the overlap (filter_groups off in all)
    (name, "fastgrpo", {"num_iterations": 1, "bf16": True, "use_vllm": True, "vllm_mode": "server", "filter_groups": False,
                        **({} if staleness is None else {"max_staleness": staleness})})
    for name, staleness in (("synchronous (vLLM server)", None), ("max_staleness=1", 1), ("max_staleness=4", 4))
]
BEST = [  # each system at its fastest: TRL bf16 autocast (use_cpu, no checkpointing) on a CPU with bf16 units, fp32 on one
    # without (AVX2 only: emulated bf16 is slower than fp32; pick one with --settings), fastgrpo's defaults (bf16 where it is fast)
    ("TRL μ=1 bf16 autocast", "trl", {"num_iterations": 1, "bf16": True, "use_cpu": True}),
    ("TRL μ=1 fp32", "trl", {"num_iterations": 1, "bf16": False, "use_cpu": True}),
    ("fastgrpo built-in job", "fastgrpo", {"bf16": None, "filter_groups": True}),
    ("fastgrpo built-in job without group filter", "fastgrpo", {"bf16": None, "filter_groups": False}),
]
REUSE = [  # "when reuse pays" where sampling weighs most: the built-in job (bf16, group filter) with 256-token completions
    *[(f"fastgrpo μ={mu}", "fastgrpo", {"num_iterations": mu, "bf16": None, "filter_groups": True, "max_completion_length": 256}) for mu in (1, 2, 4)],
    ("fastgrpo μ=4 target_kl=0.005", "fastgrpo", {"num_iterations": 4, "target_kl": 0.005, "bf16": None, "filter_groups": True, "max_completion_length": 256}),
]
SUITES = {
    "builtin": {"task": "arithmetic", "settings": BUILTIN, "target": 0.7, "budget": 150},
    "sweep": {"task": "arithmetic", "settings": SWEEP, "target": 0.7, "budget": 150},
    "lr3": {"task": "arithmetic", "settings": LR3, "target": 0.7, "budget": 120},
    "addition": {"task": "addition", "settings": BUILTIN, "target": 0.4, "budget": 120},
    "vllm": {"task": "addition", "settings": VLLM, "target": 0.4, "budget": 120},
    "async": {"task": "addition", "settings": ASYNC, "target": 0.4, "budget": 75, "server": True, "threads": 1},
    "best": {"task": "addition", "settings": BEST, "target": 0.4, "budget": 120, "rolling_completions": ROLLING_COMPLETIONS},
    "reuse": {"task": "addition", "settings": REUSE, "target": 0.4, "budget": 120, "rolling_completions": ROLLING_COMPLETIONS},
    "dapo": {"task": "addition", "settings": DAPO, "target": 0.4, "budget": 120, "rolling_completions": ROLLING_COMPLETIONS},
}


def run_one(spec: dict, log) -> dict:
    """One ttr_worker.py process; returns its raw result."""
    result, seconds = run_worker("ttr_worker.py", spec)
    curve = rolling(result)
    log(f"  seed {spec['seed']} {spec['name']:32s} {seconds:6.1f} s, {len(curve)} rollouts, "
        f"rolling reward {curve[0][1]:.2f} → {curve[-1][1]:.2f}")
    return result


def rollout_rewards(run: dict) -> list[tuple[float, list[float]]]:
    """(scoring time, per-completion total reward) per rollout: the reward functions' values summed."""
    names = list(dict.fromkeys(c["reward"] for c in run["calls"]))
    out = []
    for i in range(0, len(run["calls"]), len(names)):
        group = run["calls"][i : i + len(names)]
        out.append((max(c["time"] for c in group), [sum(vals) for vals in zip(*(c["values"] for c in group))]))
    return out


def rolling(run: dict) -> list[tuple[float, float]]:
    """(scoring time, rolling reward) per scoring call: mean over the last ROLLING calls' completions, or over the
    last `rolling_completions` completions when the run's spec sets it (dynamic sampling's rounds differ in size)."""
    rollouts = rollout_rewards(run)
    window = run["spec"].get("rolling_completions")
    out, seen = [], []
    for i, (t, vals) in enumerate(rollouts):
        seen += vals
        values = seen[-window:] if window else [v for _, vs in rollouts[max(0, i - ROLLING + 1) : i + 1] for v in vs]
        out.append((t, sum(values) / len(values)))
    return out


def trained_rollouts(run: dict) -> int:
    """Rollouts trained on: the worker's count where it recorded one (dynamic sampling), else one per scoring call."""
    return run.get("rollouts") or len(rollout_rewards(run))


def to_target(run: dict, target: float) -> tuple[float | None, int | None]:
    """(seconds, rollouts) until the rolling reward first reaches `target`; (None, None) if it never does."""
    for i, (t, r) in enumerate(rolling(run)):
        if r >= target:
            return t, i + 1
    return None, None


def kernel_to_target(run: dict, target: float) -> float | None:
    """The process's kernel CPU seconds from `train()`'s start to the scoring that first reaches `target`.

    None if the target is never reached or the run predates the record (ttr_worker's `kernel_seconds`).
    """
    _, n = to_target(run, target)
    names = len(dict.fromkeys(c["reward"] for c in run["calls"]))
    if n is None or "kernel_seconds" not in run["calls"][0]:
        return None
    return max(c["kernel_seconds"] for c in run["calls"][(n - 1) * names : n * names])


def summary(record: dict) -> list[dict]:
    """One row per setting: time and rollouts to target (median, range, reached/seeds), final rolling reward."""
    rows = []
    for name in dict.fromkeys(r["spec"]["name"] for r in record["runs"]):
        runs = [r for r in record["runs"] if r["spec"]["name"] == name]
        hits = [to_target(r, record["target"]) for r in runs]
        secs = [s for s, _ in hits if s is not None]
        rolls = [n for _, n in hits if n is not None]
        rows.append({
            "name": name, "seeds": len(runs), "reached": len(secs),
            "seconds": statistics.median(secs) if len(secs) == len(runs) else None, "seconds_range": (min(secs), max(secs)) if secs else None,
            "rollouts": statistics.median(rolls) if len(rolls) == len(runs) else None, "rollouts_range": (min(rolls), max(rolls)) if rolls else None,
            "final": statistics.median(rolling(r)[-1][1] for r in runs),
            "kernel_seconds": [kernel_to_target(r, record["target"]) for r in runs],
            "seconds_per_rollout": statistics.median(rolling(r)[-1][0] / trained_rollouts(r) for r in runs),
        })
    return rows


def markdown(record: dict) -> str:
    base = next((r for r in summary(record) if r["name"].startswith("TRL μ=1")), None)
    completions = record["runs"][0]["spec"].get("rolling_completions") if record["runs"] else None
    window = f"mean of the last {completions} sampled completions" if completions else f"mean of the last {ROLLING} rollouts"
    lines = [
        f"Target: rolling reward ≥ {record['target']} ({window}), budget {record['budget']} s per run, "
        f"seeds {record['seeds']}, {record['threads']} thread(s). Medians over seeds, [min–max] of the seeds that reached it.", "",
        f"| setting | reached | seconds to target | rollouts to target | s / rollout | final rolling reward | vs {base['name'] if base else 'TRL μ=1'} (time) "
        "| kernel s to target, by seed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    fmt = lambda v, r: "—" if v is None else f"{v:.0f} [{r[0]:.0f}–{r[1]:.0f}]"  # noqa: E731
    for row in summary(record):
        ratio = "—" if not (base and base["seconds"] and row["seconds"]) else f"{base['seconds'] / row['seconds']:.2f}× sooner"
        lines.append(f"| {row['name']} | {row['reached']}/{row['seeds']} | {fmt(row['seconds'], row['seconds_range'] or (0, 0))} | "
                     f"{fmt(row['rollouts'], row['rollouts_range'] or (0, 0))} | {row['seconds_per_rollout']:.1f} | {row['final']:.2f} | {ratio} | "
                     + ", ".join("—" if k is None else f"{k:.1f}" for k in row["kernel_seconds"]) + " |")
    return "\n".join(lines) + "\n"


def phase_rows(record: dict) -> list[dict]:
    """Per setting, medians over the runs that recorded phases: where a rollout's seconds go.

    sampling = generation of the completions; rest of rollout = prompt encoding,
    decoding, scoring, advantages and the π_old/π_ref passes; update = everything
    else of the run (forward, backward, optimizer steps), per optimizer step and per rollout.
    """
    rows = []
    for name in dict.fromkeys(r["spec"]["name"] for r in record["runs"]):
        runs = [r for r in record["runs"] if r["spec"]["name"] == name and r.get("phase_seconds")]
        if not runs:
            continue
        med = lambda f: statistics.median(f(r, trained_rollouts(r)) for r in runs)  # noqa: E731
        rows.append({
            "name": name, "runs": len(runs),
            "sampling": med(lambda r, n: r["phase_seconds"]["generate"] / n),
            "rest": med(lambda r, n: (r["phase_seconds"]["rollout"] - r["phase_seconds"]["generate"]) / n),
            "update_per_step": med(lambda r, n: (r["train_seconds"] - r["phase_seconds"]["rollout"]) / r["steps"]),
            "steps_per_rollout": med(lambda r, n: r["steps"] / n),
            "update": med(lambda r, n: (r["train_seconds"] - r["phase_seconds"]["rollout"]) / n),
            "sampling_share": med(lambda r, n: r["phase_seconds"]["generate"] / r["train_seconds"]),
        })
    return rows


def phase_markdown(record: dict) -> str:
    rows = phase_rows(record)
    if not rows:
        return ""
    lines = ["", "Seconds per rollout by phase (medians over the seeds' runs):", "",
             "| setting | runs | sampling | rest of rollout | update | optimizer steps per rollout | update per step | sampling share of the run |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['runs']} | {r['sampling']:.2f} | {r['rest']:.2f} | {r['update']:.2f} | {r['steps_per_rollout']:.1f} | "
                     f"{r['update_per_step']:.2f} | {100 * r['sampling_share']:.0f} % |")
    return "\n".join(lines) + "\n"


def plot(record: dict, path: str) -> None:
    """Rolling reward vs wall-clock and vs rollouts: each setting's mean over seeds, shaded min–max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_rollout) = plt.subplots(1, 2, figsize=(13, 4.8))
    grid = [record["budget"] * i / 200 for i in range(201)]
    for name in dict.fromkeys(r["spec"]["name"] for r in record["runs"]):
        curves = [rolling(r) for r in record["runs"] if r["spec"]["name"] == name]
        at = lambda c, t: next((r for s, r in reversed(c) if s <= t), None)  # noqa: E731  last value at or before t
        ts, mean, low, high = [], [], [], []
        for t in grid:
            vals = [at(c, t) for c in curves]
            if None not in vals and t <= min(c[-1][0] for c in curves):
                ts.append(t), mean.append(sum(vals) / len(vals)), low.append(min(vals)), high.append(max(vals))
        (line,) = by_time.step(ts, mean, where="post", label=name)
        by_time.fill_between(ts, low, high, step="post", alpha=0.15, color=line.get_color())
        n = min(len(c) for c in curves)
        xs = range(1, n + 1)
        per = [[c[i][1] for c in curves] for i in range(n)]
        by_rollout.plot(xs, [sum(v) / len(v) for v in per], label=name, color=line.get_color())
        by_rollout.fill_between(xs, [min(v) for v in per], [max(v) for v in per], alpha=0.15, color=line.get_color())
    completions = record["runs"][0]["spec"].get("rolling_completions") if record["runs"] else None
    window = f"last {completions} sampled completions" if completions else f"last {ROLLING} rollouts"
    for ax, xlabel in ((by_time, "seconds since train() began"), (by_rollout, "scoring calls" if completions else "rollouts")):
        ax.axhline(record["target"], color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel), ax.set_ylabel(f"rolling reward ({window})"), ax.grid(alpha=0.3)
    by_rollout.legend(fontsize=8)
    fig.suptitle(f"{record['suite']}: {record['task']}, {len(record['seeds'])} seeds (mean, min–max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def load_record(path: str) -> dict:
    """Read a results file this script wrote (a .json object with its suite, task, target, budget, seeds and runs).

    Raises:
        ValueError: not a .json file, or see report.load_results; naming the path.
    """
    what = "a time-to-reward results file (<out>/<date>-ttr-<suite>.json)"
    if not path.endswith(".json"):
        raise ValueError(f"{path}: give {what}")
    return load_results(path, ("suite", "task", "target", "budget", "seeds", "runs"), what)


def render(path: str) -> str:
    """Write the Markdown tables and the plot of a results file next to it; → the tables."""
    record = load_record(path)
    table = markdown(record) + phase_markdown(record)
    with open(path[: -len(".json")] + ".md", "w") as f:
        f.write(table)
    plot(record, path[: -len(".json")] + ".png")
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="builtin", choices=sorted(SUITES))
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (data and training)")
    parser.add_argument("--settings", help="comma-separated setting names to run (default: the suite's)")
    parser.add_argument("--budget", type=positive_seconds, help="wall-clock seconds per run (default: the suite's)")
    parser.add_argument("--threads", type=positive_int, help="torch threads per run (default: the suite's, else 2)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or local folder")
    parser.add_argument("--out", type=writable_folder, default=os.path.join(HERE, "results"))
    parser.add_argument("--report", help="re-render tables and plots of a results JSON, run nothing")
    parser.add_argument("--append", action="store_true", help="add these runs to today's results file of the suite (one seed per call)")
    ns = parser.parse_args(argv)
    if ns.report:
        try:
            print(render(ns.report))
        except ValueError as err:
            parser.error(f"--report: {err}")
        return 0
    from ttr_worker import job_config

    suite = SUITES[ns.suite]
    ns.threads = ns.threads or suite.get("threads", 2)
    settings, seeds, path = check_args(parser, ns, suite)
    record = {"suite": ns.suite, "task": suite["task"], "target": suite["target"], "budget": ns.budget or suite["budget"],
              "seeds": seeds, "threads": ns.threads, "job": job_config(), "command": " ".join(["python", *sys.argv]), "runs": []}
    if ns.append and os.path.exists(path):
        earlier = load_record(path)
        record["runs"], record["seeds"] = earlier["runs"], sorted(set(earlier["seeds"]) | set(seeds))
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    server = None
    if suite.get("server"):  # one vLLM server for every run, on core 0; the runs on core 1 (async_rollout.py's split)
        from vllm_rollout import free_port, start_server

        port = free_port()
        server = start_server(port, core=0)
        os.sched_setaffinity(0, {1})  # the worker processes inherit it
        settings = [(name, system, {**o, "vllm_server_base_url": f"http://127.0.0.1:{port}"}) for name, system, o in settings]
    try:
        run_all(record, settings, seeds, ns, suite, path, log)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGKILL)  # the server's engine processes too (start_new_session)
    print(render(path))
    return 0


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{value}: give a positive number of seconds, e.g. 120")
    return value


def check_args(parser: argparse.ArgumentParser, ns, suite: dict) -> tuple[list, list[int], str]:
    """Every argument checked before the first run; → (the settings to run, the seeds, the results path). Exits via parser.error."""
    from fastgrpo.model.loading import resolve_model_path

    names = [s[0] for s in suite["settings"]]
    wanted = [w.strip() for w in ns.settings.split(",")] if ns.settings else names
    if unknown := [w for w in wanted if w not in names]:
        parser.error(f"--settings: suite {ns.suite!r} has no {', '.join(map(repr, unknown))}; its settings are {', '.join(map(repr, names))}")
    try:
        seeds = [int(s) for s in ns.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds {ns.seeds!r}: give whole numbers, comma-separated (e.g. 0,1,2)")
    if not seeds or min(seeds) < 0:
        parser.error(f"--seeds {ns.seeds!r}: give seeds ≥ 0, comma-separated (e.g. 0,1,2)")
    try:
        ns.model = resolve_model_path(ns.model)
    except ValueError as err:
        parser.error(f"--model: {err}")
    path = os.path.join(ns.out, f"{datetime.date.today().isoformat()}-ttr-{ns.suite}.json")
    return [s for s in suite["settings"] if s[0] in wanted], seeds, path


def run_all(record: dict, settings: list, seeds: list[int], ns, suite: dict, path: str, log) -> None:
    """Every setting once per seed, seed by seed; the record saved after each run to `path`.partial, which replaces
    `path` only once all runs are done: a failed run leaves an earlier complete results file as it was."""
    for seed in seeds:
        for name, system, overrides in settings:
            spec = {"name": name, "system": system, "overrides": overrides, "seed": seed, "task": suite["task"],
                    "budget_seconds": record["budget"], "job": record["job"], "threads": ns.threads, "dataset_size": 400,
                    "model_path": ns.model, "rolling_completions": suite.get("rolling_completions")}
            record["runs"].append(run_one(spec, log))
            with open(path + ".partial", "w") as f:  # keep what is done if a later run fails
                json.dump(record, f)
    os.replace(path + ".partial", path)


if __name__ == "__main__":
    sys.exit(main())
