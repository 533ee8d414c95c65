"""From raw runs (worker.py) to figures, a Markdown table and PNG plots.

    python benchmarks/report.py benchmarks/results/<date>-<case>.json    # re-render one case

Definitions (docs/benchmarks.md repeats them):

- steady window: from the end of the first rollout's last optimizer step to
  the end of the run (the first rollout carries one-off warm-up costs); a run
  with a single rollout uses all of it.
- seconds per optimizer step: window seconds / optimizer steps in it; the
  phase split divides each phase's seconds in the window the same way;
  other = step time − generation − logps − update (loop, logging, data).
- completion tokens per second: completion tokens generated in the window /
  window seconds (and / generation seconds, "generation throughput").
- rolling reward: mean reward of the last ROLLING rollouts, at each
  rollout's scoring time. Target: r0 + ½ (r_end − r0), r0 the mean first-rollout
  reward of all runs in the case (same initial policy), r_end the median final
  rolling reward of the baseline (TRL, μ = 1). Time to target: the first scoring
  time at which the rolling reward reaches it.
- reward at equal wall-clock: each run's rolling reward at the last scoring
  time ≤ the shortest run's last scoring time in the case.
- limit fraction: useful FLOPs / phase seconds / matmul peak. Useful FLOPs
  per token: 2 (forward) or 6 (forward + backward) × the parameters it
  multiplies by — the body for every non-pad token, the LM head only for the
  completion tokens whose logits are kept; attention's quadratic term and pad
  tokens are not counted. Generation: 2 × body × (prompt + completion) + 2 ×
  head × completion per completion (KV cache: each token once).
  "Non-pad tokens" are the tokens a system's forward really computed: TRL's
  attention-mask tokens (its pads are computed but not counted), fastgrpo's
  packed row (pads removed, each prompt once per group).
- update tokens computed / padded: non-pad tokens of the update's passes over
  the B × (P + T) tokens of the padded micro-batches.
- kernel seconds per step (`kernel_at_step_ends`): the process's kernel-mode
  CPU seconds within each optimizer step, and its minor page faults (each the
  first touch of a 4 KiB page). It is time the kernel spends backing memory the
  process touches for the first time, not the step's arithmetic; in a VM
  whose host takes freed guest memory back (Firecracker's free page
  reporting), each fault also waits for the host, so a step that grows the
  peak pays ≈ 2–3 s per GiB there.
- memory split (worker.memory_split): weights, gradients, optimizer state
  counted from the tensors; runtime = RSS after the imports; activations and
  the rest = peak RSS − those four.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

ROLLING = 3  # rollouts (48 completions at the seed configuration)
PHASES = ("generation", "logps", "update", "other")
MEMORY = ("weights", "gradients", "optimizer_state", "runtime", "activations_and_rest")


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def run_figures(run: dict) -> dict:
    """Figures of one run (see the module docstring for each definition)."""
    spec = run["spec"]
    per_rollout = spec["num_iterations"] * spec["steps_per_generation"] // spec["gradient_accumulation_steps"]
    ends = run["step_ends"]
    warm = per_rollout if len(ends) > per_rollout else 0
    start, end = (ends[warm - 1] if warm else 0.0), ends[-1]
    steps = len(ends) - warm
    inside = lambda s, e: s >= start and e <= end  # noqa: E731
    phase = lambda name: sum(e - s for n, s, e in run["phases"] if n == name and inside(s, e))  # noqa: E731
    passes = [p for p in run["passes"] if inside(p["start"], p["end"])]
    logps_s = sum(p["end"] - p["start"] for p in passes if not p["grad"])
    generation_s = phase("rollout") - logps_s
    update_s = phase("update")
    window = end - start
    split = {"generation": generation_s / steps, "logps": logps_s / steps, "update": update_s / steps}
    split["other"] = window / steps - sum(split.values())

    peak = run["linear_peak_flops"]["bf16"] if run["spec"].get("bf16") else run["matmul_peak_flops"]  # bf16 runs: the bf16 limit
    body, head = run["body_parameters"], run["head_parameters"]
    flops = lambda p, k: k * (body * p["tokens"] + head * p["logit_tokens"])  # noqa: E731
    update_flops = sum(flops(p, 6) for p in passes if p["grad"])
    logps_flops = sum(flops(p, 2) for p in passes if not p["grad"])
    rollouts = [r for r in run["rollouts"] if start <= r["time"] <= end]
    prompt_mean = statistics.mean(run["prompt_tokens_by_row"])
    completion_tokens = sum(sum(r["completion_tokens"]) for r in rollouts)
    generation_flops = 2 * (body * (prompt_mean * sum(len(r["completion_tokens"]) for r in rollouts) + completion_tokens) + head * completion_tokens)
    fraction = lambda f, s: f / s / peak if s > 0 else None  # noqa: E731
    grad_passes = [p for p in passes if p["grad"] and p.get("padded_tokens")]
    return {
        "seconds_per_step": window / steps,
        "update_seconds_per_step": split["update"],
        "update_tokens_computed_over_padded": sum(p["tokens"] for p in grad_passes) / sum(p["padded_tokens"] for p in grad_passes) if grad_passes else None,
        "memory_split_bytes": run.get("memory_split_bytes"),
        **kernel_per_step(run),
        "phase_seconds_per_step": split,
        "steady_steps": steps,
        "completion_tokens_per_second": completion_tokens / window,
        "generation_tokens_per_second": completion_tokens / generation_s if generation_s > 0 else None,
        "peak_rss_bytes": run["peak_rss_bytes"],
        "matmul_peak_flops": peak,
        "limit_fraction": {
            "generation": fraction(generation_flops, generation_s),
            "logps": fraction(logps_flops, logps_s),
            "update": fraction(update_flops, update_s),
            "all": fraction(generation_flops + logps_flops + update_flops, window),
        },
        "reward_curve": rolling_rewards(run),
    }


def kernel_per_step(run: dict) -> dict:
    """Each optimizer step's kernel CPU seconds and minor page faults (every step, the first included); {} for older runs."""
    usage = run.get("kernel_at_step_ends")
    if not usage:
        return {}
    return {
        "kernel_seconds_by_step": [b[0] - a[0] for a, b in zip(usage, usage[1:])],
        "page_faults_by_step": [b[1] - a[1] for a, b in zip(usage, usage[1:])],
    }


def rolling_rewards(run: dict) -> list[list[float]]:
    """[(scoring time, mean reward of the last ROLLING rollouts)] of one run."""
    means = [statistics.mean(r["rewards"]) for r in run["rollouts"]]
    return [[r["time"], statistics.mean(means[max(0, i + 1 - ROLLING) : i + 1])] for i, r in enumerate(run["rollouts"])]


def summarize(runs: list[dict]) -> dict:
    """Per (system, μ): medians over runs; per μ: the per-pair fastgrpo/TRL ratios; time-to-reward figures."""
    figures = [run_figures(r) for r in runs]
    keys = sorted({(r["system"], r["spec"]["num_iterations"]) for r in runs}, key=lambda k: (k[1], k[0]))
    first = [statistics.mean(r["rollouts"][0]["rewards"]) for r in runs]
    r0 = statistics.mean(first)
    baseline = [f["reward_curve"][-1][1] for r, f in zip(runs, figures) if r["system"] == "trl" and r["spec"]["num_iterations"] == 1]
    if not baseline:  # no TRL μ=1 in this case: fall back to any μ=1 run
        baseline = [f["reward_curve"][-1][1] for r, f in zip(runs, figures) if r["spec"]["num_iterations"] == 1]
    r_end = _median(baseline)
    # A rise within the noise of one rollout's mean (2 standard errors of its 16–odd rewards) is no rise:
    # then there is no target, and time to target is reported as not measurable rather than as luck.
    noise = 2 * statistics.mean(statistics.stdev(r["rollouts"][0]["rewards"]) for r in runs) / len(runs[0]["rollouts"][0]["rewards"]) ** 0.5
    clear_rise = r_end is not None and r_end - r0 > noise
    target = r0 + 0.5 * (r_end - r0) if clear_rise else None
    equal_time = min(f["reward_curve"][-1][0] for f in figures)
    for f in figures:
        hits = [t for t, v in f["reward_curve"] if target is not None and v >= target]
        f["time_to_target_seconds"] = hits[0] if hits else None
        f["reward_at_equal_time"] = [v for t, v in f["reward_curve"] if t <= equal_time][-1] if f["reward_curve"][0][0] <= equal_time else None

    groups = {}
    for system, mu in keys:
        mine = [f for r, f in zip(runs, figures) if (r["system"], r["spec"]["num_iterations"]) == (system, mu)]
        groups[f"{system}/mu{mu}"] = {
            "system": system, "num_iterations": mu, "runs": len(mine),
            "seconds_per_step": _median([f["seconds_per_step"] for f in mine]),
            "update_tokens_computed_over_padded": _median([f["update_tokens_computed_over_padded"] for f in mine]),
            "memory_split_bytes": {k: _median([(f["memory_split_bytes"] or {}).get(k) for f in mine]) for k in MEMORY},
            "phase_seconds_per_step": {p: _median([f["phase_seconds_per_step"][p] for f in mine]) for p in PHASES},
            "completion_tokens_per_second": _median([f["completion_tokens_per_second"] for f in mine]),
            "generation_tokens_per_second": _median([f["generation_tokens_per_second"] for f in mine]),
            "peak_rss_bytes": _median([f["peak_rss_bytes"] for f in mine]),
            "time_to_target_seconds": _median([f["time_to_target_seconds"] for f in mine]) if all(f["time_to_target_seconds"] is not None for f in mine) else None,
            "reward_at_equal_time": _median([f["reward_at_equal_time"] for f in mine]),
            "limit_fraction": {p: _median([f["limit_fraction"][p] for f in mine]) for p in ("generation", "logps", "update", "all")},
            "matmul_peak_flops": _median([f["matmul_peak_flops"] for f in mine]),
            "kernel_seconds_first_step": _median([f["kernel_seconds_by_step"][0] for f in mine if f.get("kernel_seconds_by_step")]),
            "kernel_seconds_per_later_step": _median([sum(f["kernel_seconds_by_step"][1:]) / (len(f["kernel_seconds_by_step"]) - 1)
                                                      for f in mine if len(f.get("kernel_seconds_by_step", [])) > 1]),
            "page_faults_first_step": _median([f["page_faults_by_step"][0] for f in mine if f.get("page_faults_by_step")]),
        }

    ratios = {}
    ours = [r["system"] for r in runs if r["system"] != "trl"]
    mine = "fastgrpo" if "fastgrpo" in ours or not ours else ours[0]  # fastgrpo's defaults against TRL, else the case's first system
    for mu in sorted({k[1] for k in keys}):
        fast = [f for r, f in zip(runs, figures) if r["system"] == mine and r["spec"]["num_iterations"] == mu]
        trl = [f for r, f in zip(runs, figures) if r["system"] == "trl" and r["spec"]["num_iterations"] == mu]
        pairs = list(zip(fast, trl))  # run order alternates fastgrpo, TRL: pair i = the i-th of each
        per_pair = {
            name: [a[name] / b[name] for a, b in pairs]
            for name in ("seconds_per_step", "update_seconds_per_step", "peak_rss_bytes", "completion_tokens_per_second")
        }
        ratios[f"mu{mu}"] = {"system": mine, "per_pair": per_pair, "median": {k: _median(v) for k, v in per_pair.items()}}

    def speedup(fast_key, trl_key):
        a, b = groups.get(fast_key, {}).get("time_to_target_seconds"), groups.get(trl_key, {}).get("time_to_target_seconds")
        return b / a if a and b else None

    time_to_reward = {
        "rolling_rollouts": ROLLING, "r0": r0, "baseline_final": r_end, "noise": noise, "clear_rise": clear_rise, "target": target, "equal_time_seconds": equal_time,
        "speedup_fastgrpo_mu4_vs_trl_mu1": speedup("fastgrpo/mu4", "trl/mu1"),
        "speedup_fastgrpo_mu4_vs_trl_mu4": speedup("fastgrpo/mu4", "trl/mu4"),
        "speedup_fastgrpo_mu1_vs_trl_mu1": speedup("fastgrpo/mu1", "trl/mu1"),
    }
    return {"per_run": figures, "groups": groups, "ratios": ratios, "time_to_reward": time_to_reward}


def _fmt(value, spec=".2f", scale=1.0):
    return "—" if value is None else format(value * scale, spec)


def markdown_table(case: dict) -> str:
    """The case's table: one row per (system, μ), then the fastgrpo/TRL ratio rows."""
    s = case["summary"]
    head = (
        "| system | μ | s/step | generation | logps | update | other | compl. tok/s | peak RSS GiB "
        "| time to target s | reward @ equal time | % peak: gen / logps / update |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    rows = []
    for g in s["groups"].values():
        p, lim = g["phase_seconds_per_step"], g["limit_fraction"]
        rows.append(
            f"| {g['system']} | {g['num_iterations']} | {_fmt(g['seconds_per_step'])} | {_fmt(p['generation'])} | {_fmt(p['logps'])} "
            f"| {_fmt(p['update'])} | {_fmt(p['other'])} | {_fmt(g['completion_tokens_per_second'], '.1f')} "
            f"| {_fmt(g['peak_rss_bytes'], '.2f', 1 / 2**30)} | {_fmt(g['time_to_target_seconds'], '.0f')} "
            f"| {_fmt(g['reward_at_equal_time'], '.1f')} "
            f"| {_fmt(lim['generation'], '.0f', 100)} / {_fmt(lim['logps'], '.0f', 100)} / {_fmt(lim['update'], '.0f', 100)} |"
        )
    for mu, r in s["ratios"].items():
        m = r["median"]
        rows.append(
            f"| **{r['system']} / TRL** | {mu[2:]} | **{_fmt(m['seconds_per_step'])}×** | | | **{_fmt(m['update_seconds_per_step'])}×** | "
            f"| {_fmt(m['completion_tokens_per_second'])}× "
            f"| **{_fmt(m['peak_rss_bytes'])}×** | | | |"
        )
    t = s["time_to_reward"]
    note = (
        f"\nTarget reward {_fmt(t['target'], '.1f')} (r0 {_fmt(t['r0'], '.1f')}, TRL μ=1 final {_fmt(t['baseline_final'], '.1f')}, "
        f"noise ±{_fmt(t['noise'], '.1f')}{'' if t['clear_rise'] else ': the baseline did not clearly rise, so no target'}); "
        f"equal wall-clock {_fmt(t['equal_time_seconds'], '.0f')} s. Time-to-target speed-up: fastgrpo μ=4 vs TRL μ=1 "
        f"{_fmt(t['speedup_fastgrpo_mu4_vs_trl_mu1'])}×, vs TRL μ=4 {_fmt(t['speedup_fastgrpo_mu4_vs_trl_mu4'])}×; "
        f"fastgrpo μ=1 vs TRL μ=1 {_fmt(t['speedup_fastgrpo_mu1_vs_trl_mu1'])}×.\n"
    )
    kernel = (
        "\n| system | μ | kernel s: first step | kernel s / later step | page faults: first step |\n| --- | --- | --- | --- | --- |\n"
        + "".join(f"| {g['system']} | {g['num_iterations']} | {_fmt(g['kernel_seconds_first_step'])} | {_fmt(g['kernel_seconds_per_later_step'])} "
                  f"| {_fmt(g['page_faults_first_step'], ',.0f')} |\n" for g in s["groups"].values())
        if any(g["kernel_seconds_first_step"] is not None for g in s["groups"].values()) else ""
    )
    memory = (
        "\n| system | μ | weights | gradients | optimizer state | runtime | activations and rest | peak RSS (GiB) | update tokens computed / padded |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    for g in s["groups"].values():
        m = g["memory_split_bytes"]
        memory += (
            f"| {g['system']} | {g['num_iterations']} | " + " | ".join(_fmt(m[k], ".2f", 1 / 2**30) for k in MEMORY)
            + f" | {_fmt(g['peak_rss_bytes'], '.2f', 1 / 2**30)} | {_fmt(g['update_tokens_computed_over_padded'], '.2f')} |\n"
        )
    return head + "\n".join(rows) + "\n" + note + kernel + memory


def plots(case: dict, prefix: str) -> list[str]:
    """reward vs wall-clock (every run) and the per-phase split (medians); returns the PNGs' file names (next to the JSON)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"fastgrpo": "tab:blue", "trl": "tab:orange", "fastgrpo-full": "tab:cyan", "fastgrpo-bf16": "tab:green", "fastgrpo-gc": "tab:purple", "fastgrpo-merged": "tab:red", "fastgrpo-unmerged": "tab:brown", "fastgrpo-gc-merged": "tab:pink", "fastgrpo-gc-glibc": "tab:olive"}
    styles = {1: "-", 4: "--"}
    fig, ax = plt.subplots(figsize=(7, 4))
    seen = set()
    for run, f in zip(case["runs"], case["summary"]["per_run"]):
        mu = run["spec"]["num_iterations"]
        label = f"{run['system']} μ={mu}"
        xs, ys = zip(*f["reward_curve"])
        ax.plot(xs, ys, styles.get(mu, ":"), color=colours[run["system"]], label=None if label in seen else label, alpha=0.85)
        seen.add(label)
    target = case["summary"]["time_to_reward"]["target"]
    if target is not None:
        ax.axhline(target, color="grey", lw=0.8, ls=":", label="target")
    ax.set_xlabel("wall-clock seconds (training)")
    ax.set_ylabel(f"reward, rolling mean of {ROLLING} rollouts")
    ax.set_title(f"{case['case']}: reward vs wall-clock")
    ax.legend()
    fig.tight_layout()
    reward_png = f"{prefix}-reward.png"
    fig.savefig(reward_png, dpi=110)
    plt.close(fig)

    groups = list(case["summary"]["groups"].values())
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = [f"{g['system']}\nμ={g['num_iterations']}" for g in groups]
    bottom = [0.0] * len(groups)
    for phase, colour in zip(PHASES, ("tab:green", "tab:purple", "tab:red", "tab:gray")):
        values = [max(g["phase_seconds_per_step"][phase] or 0.0, 0.0) for g in groups]
        ax.bar(names, values, bottom=bottom, color=colour, label=phase)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("seconds per optimizer step (median)")
    ax.set_title(f"{case['case']}: time split per phase")
    ax.legend()
    fig.tight_layout()
    phases_png = f"{prefix}-phases.png"
    fig.savefig(phases_png, dpi=110)
    plt.close(fig)
    return [os.path.basename(reward_png), os.path.basename(phases_png)]


def load_results(path: str, keys: tuple[str, ...], what: str) -> dict:
    """Read a results file a benchmark script wrote: a JSON object holding `keys` (run.py's cases, time_to_reward.py's
    records, fsdp.py's runs).

    Raises:
        ValueError: it cannot be read, is not JSON, or lacks one of `keys`; naming the path and `what` to give instead.
    """
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror}); give {what}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not JSON ({err}); give {what}") from None
    if missing := [k for k in keys if not isinstance(data, dict) or k not in data]:
        raise ValueError(f"{path} is not {what}: it has no {', '.join(missing)}")
    return data


def load_case(path: str) -> dict:
    """Read a case file written by run.py (a .json object with its "case", "description" and a list of "runs").

    Raises:
        ValueError: the path is not a .json file, or see `load_results`; naming the path and what to give instead.
    """
    what = "a case file run.py wrote (benchmarks/results/<date>-<case>.json)"
    if not path.endswith(".json"):
        raise ValueError(f"{path}: give {what}")
    case = load_results(path, ("case", "description", "runs"), what)
    if not isinstance(case["runs"], list):
        raise ValueError(f"{path} is not {what}: its runs are not a list")
    return case


def render(path: str, case: dict | None = None) -> None:
    """Recompute the summary, table and plots of a case file in place (`case`: its contents, already read by `load_case`)."""
    case = load_case(path) if case is None else case
    case["summary"] = summarize(case["runs"])
    prefix = path[: -len(".json")]
    case["plots"] = plots(case, prefix)
    case["table"] = markdown_table(case)
    with open(path, "w") as f:
        json.dump(case, f, indent=1)
    with open(prefix + ".md", "w") as f:
        f.write(f"## {case['case']}\n\n{case['description']}\n\n{case['table']}")


def main(argv: list[str] | None = None) -> None:
    """Re-render case files; every one is read and checked before any is rewritten."""
    parser = argparse.ArgumentParser(description="Recompute the summary, Markdown table and plots of run.py's case files, in place.")
    parser.add_argument("paths", nargs="+", metavar="CASE.json", help="case files run.py wrote (benchmarks/results/<date>-<case>.json)")
    args = parser.parse_args(argv)
    cases = {}
    for path in args.paths:
        try:
            cases[path] = load_case(path)
        except ValueError as err:
            parser.error(str(err))
    for path, case in cases.items():
        render(path, case)


if __name__ == "__main__":
    main()
