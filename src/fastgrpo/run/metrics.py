"""Metric aggregation and output: phase timers, logging windows, metrics.jsonl and completions.jsonl.

Metrics are kept as sums over a logging window (tokens, completions, steps) and reduced across processes once
per logging step, so every logged mean is a true mean over the window, never the last micro-batch's value.

Not here: computing any metric's value (losses.py, trainer.py).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from accelerate.utils import gather_object

from . import runs
from .overlap_metrics import overlap_record
from ..algo.reductions import EXTREMES

PHASES = ("weight_sync", "generate", "score", "old_logps", "ref_logps", "update")


class PhaseTimer:
    """Wall-clock seconds per named phase (`weight_sync`, `generate`, `score`, `old_logps`, `ref_logps`, `update`).

    The public seam for timing a run (`trainer.timer.listen(fn)`): each listener gets
    (phase, start, end) in `time.perf_counter()` seconds as each phase ends (benchmarks/ use it).
    """

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.listeners: list = []

    def listen(self, fn) -> None:
        """Call fn(phase, start, end) at the end of every phase from now on."""
        self.listeners.append(fn)

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self.seconds[phase] += end - start
            for fn in self.listeners:
                fn(phase, start, end)

    def pop(self) -> dict[str, float]:
        """Seconds per phase since the last pop, then reset."""
        out = {phase: self.seconds.get(phase, 0.0) for phase in PHASES}
        self.seconds.clear()
        return out


class Window:
    """Sums of metrics over a logging window, reduced across processes on demand.

    `add(name, value)` adds a number or 0-d tensor to a sum; `extreme(name,
    value)` keeps a min, a max or the last value (`algo.reductions.EXTREMES` says which); `record`
    routes each metric by that table.
    """

    def __init__(self):
        self.sums: dict[str, float] = defaultdict(float)
        self.extremes: dict[str, float] = {}

    def add(self, name: str, value) -> None:
        self.sums[name] += float(value)

    def extreme(self, name: str, value) -> None:
        value, kind = float(value), EXTREMES[name]
        self.extremes[name] = value if kind == "last" else (min if kind == "min" else max)(self.extremes.get(name, value), value)

    def record(self, values: dict) -> None:
        """Each metric into its sum or its extreme, as `EXTREMES` declares."""
        for name, value in values.items():
            (self.extreme if name in EXTREMES else self.add)(name, value)

    def align(self, accelerator) -> None:
        """Give this window every key any process's window holds (a missing sum is 0, a missing min or max the
        neutral ±inf, which `reduce` callers drop), so `reduce` lines the same names up on every process. One
        object gather; nothing on one process."""
        if accelerator.num_processes == 1:
            return
        for names in gather_object([sorted({*self.sums, *self.extremes})]):
            for name in names:
                if name in EXTREMES:
                    self.extremes.setdefault(name, math.inf if EXTREMES[name] == "min" else -math.inf)
                else:
                    self.sums[name] += 0.0

    def reduce(self, accelerator) -> tuple[dict[str, float], dict[str, float]]:
        """(sums, extremes) over all processes: one all-reduce and one gather per call."""
        names = sorted(self.sums)
        sums = torch.tensor([self.sums[n] for n in names], dtype=torch.float64, device=accelerator.device)
        ext_names = sorted(self.extremes)
        ext = torch.tensor([self.extremes[n] for n in ext_names], dtype=torch.float64, device=accelerator.device)
        if accelerator.num_processes > 1:
            sums = accelerator.reduce(sums, reduction="sum")
            if ext_names:  # every process holds the same keys, so all take this branch or none
                gathered = accelerator.gather(ext.unsqueeze(0))  # (world, E)
                ext = torch.stack([gathered[:, i].min() if EXTREMES[n] == "min" else gathered[:, i].max() for i, n in enumerate(ext_names)])  # last: one value
        return dict(zip(names, sums.tolist())), dict(zip(ext_names, ext.tolist()))


@dataclass(frozen=True)
class CompletionRows:
    """What completions.jsonl keeps of a rollout, on the CPU: cheap to hold until the log and to gather."""

    prompts: list  # N prompts
    completions: list  # N completions as reward functions saw them
    rewards: torch.Tensor  # (N, R)
    advantages: torch.Tensor  # (N,)
    extra: dict | None = None  # column → N values that reward functions logged with log_extra

    @classmethod
    def of(cls, rollout, extra: dict | None = None) -> CompletionRows:
        return cls(rollout.prompts, rollout.completions, rollout.rewards.cpu(), rollout.advantages.cpu(), extra)

    def __len__(self) -> int:
        return len(self.completions)


class MetricsLog:
    """Writes metrics.jsonl and completions.jsonl in output_dir (the step lines: console.py; the trackers: transformers'
    callbacks, callbacks.py; TRL's completions table: completion_tables.py).

    Only the main process writes; the others call nothing here. `previous_run`: what a new run replaces, removed before its first write.
    """

    def __init__(self, output_dir: str, console):
        self.console, self.previous_run = console, runs.PreviousRun(output_dir, [], console)
        self.metrics_path = os.path.join(output_dir, "metrics.jsonl")
        self.completions_path = os.path.join(output_dir, "completions.jsonl")
        os.makedirs(output_dir, exist_ok=True)

    def sizes(self) -> dict[str, int]:
        """Bytes written so far to each log (0 before its first line), by file name within output_dir: where a checkpoint
        saved now cuts them back to, wherever the run's folder is later moved."""
        return {os.path.basename(p): os.path.getsize(p) if os.path.exists(p) else 0 for p in (self.metrics_path, self.completions_path)}

    def cut_back(self, step: int, sizes: dict[str, int] | None = None) -> None:
        """Cut both logs back to what they held when the checkpoint was saved: no record logged twice.

        Args:
            step: the checkpoint's step; without `sizes` (a checkpoint from before they
                were saved), records after it are dropped.
            sizes: `sizes()` at the checkpoint: each file is truncated to it, which also
                drops what was logged at the checkpoint's own step after it was saved. Keys are
                file names; older checkpoints keyed them by absolute path, read by their file name.
        """
        recorded = None if sizes is None else {os.path.basename(k): v for k, v in sizes.items()}
        for path in (self.metrics_path, self.completions_path):
            if not os.path.exists(path):
                continue
            if recorded is not None:
                os.truncate(path, min(os.path.getsize(path), recorded.get(os.path.basename(path), 0)))
                continue
            with open(path) as f:
                kept = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
            with open(path + ".tmp", "w") as f:  # rewritten under a temporary name and renamed into place
                f.writelines(kept)
            os.replace(path + ".tmp", path)

    def write(self, record: dict) -> None:
        """Append one record. Its console line is the console callback's (console.py), the trackers' its tracker callbacks', from on_log."""
        self.previous_run.remove()
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def completions(self, step: int, rows: CompletionRows, reward_names: list[str]) -> None:
        """Every completion of `rows` (one rollout's) to completions.jsonl (the console sample and TRL's parquet table: completion_tables.py)."""
        self.previous_run.remove()
        with open(self.completions_path, "a") as f:
            for i in range(len(rows)):
                f.write(
                    json.dumps(
                        {
                            "step": step,
                            "prompt": rows.prompts[i],
                            "completion": rows.completions[i],
                            "rewards": dict(zip(reward_names, _floats(rows.rewards[i]))),
                            "advantage": float(rows.advantages[i]),
                            **{column: values[i] for column, values in (rows.extra or {}).items()
                               if i < len(values) and column not in COMPLETION_FIELDS},  # the row's own fields win (reward_hooks.py)
                        },
                        default=str,
                    )
                    + "\n"
                )


def rollout_metrics(rollout, reward_names: list[str], weights: torch.Tensor, num_generations: int) -> dict[str, float]:
    """Sums (and extremes) describing one rollout, for a logging window.

    Keys: completions, reward_sum and reward_sqsum (weighted rewards of the
    scorable completions), scorable, groups,
    zero_std_groups (groups whose rewards' std is 0, TRL's `isclose`: no learning signal),
    reward_none (completions no reward function applied to),
    terminated_length_sum/_min/_max and terminated (completions that ended with EOS),
    rewards/<name>_sum, _sqsum and _count (applicable completions only),
    completion_length_sum/_min/_max (tokens), completion_tokens, input_tokens (prompt + completion tokens, as TRL
    counts num_input_tokens_seen), truncated,
    truncated_prompts; with tools, tool_calls and tool_failures. Lengths count
    the model's tokens only (tool/environment replies excluded, as TRL logs them).
    """
    rewards = rollout.rewards.to(weights.device)
    scorable = ~torch.isnan(rewards).all(dim=-1)  # TRL: a completion no reward applied to is left out of reward / reward_std
    total = torch.nansum(rewards * weights, dim=-1)  # (N,) as the advantages saw it
    groups = torch.where(scorable, total, torch.nan).view(-1, num_generations)  # (num_prompts, G)
    centred = groups - torch.nanmean(groups, dim=1, keepdim=True)  # TRL's nanstd per group: NaN-aware, n − 1
    count = (~torch.isnan(groups)).sum(dim=1)
    group_std = torch.sqrt(torch.nanmean(centred.square(), dim=1) * count / (count - 1))
    lengths = rollout.model_mask().sum(-1).float()
    ended = lengths[~rollout.is_truncated]
    out = {
        "completions": len(rollout),
        "reward_sum": float(total[scorable].sum()),
        "reward_sqsum": float(total[scorable].double().square().sum()),
        "scorable": float(scorable.sum()),
        "completion_length_sum": float(lengths.sum()),
        "completion_length_min": float(lengths.min()),
        "completion_length_max": float(lengths.max()),
        "terminated_length_sum": float(ended.sum()), "terminated": float(len(ended)),
        "completion_tokens": float(lengths.sum()),
        "input_tokens": float(rollout.prompt_mask.sum() + lengths.sum()),  # TRL's num_input_tokens_seen: prompt (each of G) + model tokens
        "truncated": float(rollout.is_truncated.sum()),
        "truncated_prompts": float(rollout.num_truncated_prompts),
        "groups": groups.shape[0],
        "zero_std_groups": float(torch.isclose(group_std, torch.zeros_like(group_std)).sum()),  # NaN std (≤ 1 reward) is not 0, as TRL
        "reward_none": float((~scorable).sum()),  # no reward applied: Â = 0
    }
    if len(ended):
        out.update(terminated_length_min=float(ended.min()), terminated_length_max=float(ended.max()))
    if rollout.tool_calls is not None:
        out.update(tool_calls=float(rollout.tool_calls), tool_failures=float(rollout.tool_failures))
    for k, name in enumerate(reward_names):
        column = rewards[:, k]
        present = ~torch.isnan(column)
        out[f"rewards/{name}_sum"] = float(column[present].sum())
        out[f"rewards/{name}_sqsum"] = float(column[present].double().square().sum())
        out[f"rewards/{name}_count"] = float(present.sum())
    return out


USER_SUM, USER_COUNT = "/user_sum", "/user_count"  # window keys of log_metric values
TRAINER_KEYS = ("learning_rate", "target_kl_stops", "num_tokens", "epoch")  # what the trainer adds to `window_record`'s record
ALWAYS_LOGGED = ("step", "loss", "grad_norm", "step_time", "reward", "reward_std", "frac_reward_zero_std", "frac_reward_none", "entropy", "kl_old",
                 *(f"completions/{k}" for k in ("mean_length", "min_length", "max_length", "clipped_ratio", "mean_terminated_length",
                                                "min_terminated_length", "max_terminated_length")),
                 *(f"seconds/{phase}" for phase in PHASES), *TRAINER_KEYS)  # keys of every training record, whatever the config


def logged_names(reward_names: list[str], last_record: dict) -> set[str]:
    """The names the trainer's records hold, as known now: every record's (`ALWAYS_LOGGED`, each reward function's
    `rewards/<fn>/mean` and `/std`) and the last logged record's (what only some configs log: kl, clip_ratio/*, …)."""
    return {*ALWAYS_LOGGED, *last_record, *(f"rewards/{n}/{part}" for n in reward_names for part in ("mean", "std"))}


def taken_name(name: str) -> ValueError:
    """The error for a reward function's `log_metric(name, …)` under a name the trainer logs itself (TRL merges the two)."""
    return ValueError(f"a reward function called log_metric({name!r}, …), but {name!r} is a metric fastgrpo logs itself "
                      f"(its value would replace the trainer's); log it under another name, e.g. 'custom/{name}'.")
COMPLETION_FIELDS = ("step", "prompt", "completion", "rewards", "advantage")  # what MetricsLog.completions writes per row


def window_record(step: int, sums: dict, extremes: dict, seconds: dict, reward_names: list[str], overlap: bool = False) -> dict:
    """One metrics.jsonl record from a window's reduced sums (see `Window`) and this process's phase seconds; `overlap`:
    a run that overlaps generation with training (max_staleness) adds TRL AsyncGRPOTrainer's keys.

    Means are over tokens (loss terms, KL, entropy, clip fractions), completions
    (rewards, lengths) or optimizer steps (loss, step_time), as each quantity's
    definition needs (grad_norm: the window's last step's, as Trainer logs it); a metric whose denominator is empty in
    the window is left out, except the loss's token means
    (entropy, kl, clip_ratio/*), which log 0 (their min / max None) as TRL's do when every token was masked.
    Raises ValueError for a `log_metric` name among the record's keys or `TRAINER_KEYS` (TRL's user `loss` replaces its own).
    """
    record: dict = {"step": step}

    def mean(key: str, over: str, name: str | None = None) -> None:
        if key in sums and sums.get(over, 0) > 0:
            record[name or key] = sums[key] / sums[over]

    mean("loss", "steps")
    if "grad_norm" in extremes:  # Trainer's: the last step's norm, not the window's mean
        record["grad_norm"] = extremes["grad_norm"]
    mean("policy_loss", "steps")  # the loss without the entropy bonus (entropy_coef)
    mean("entropy_coef", "steps")
    mean("vespo/phi_seq", "sequences", "vespo/phi_seq_mean")
    mean("step_time", "steps")  # TRL's: wall seconds per optimizer step, the sampling of a rollout it starts included
    mean("aux_loss", "aux_micro_batches")  # the router's load-balancing loss, mean over micro-batches (TRL's)
    mean("reward_sum", "scorable", "reward")  # TRL's: over the completions some reward applied to
    if sums.get("scorable", 0) > 1:  # TRL's nanstd of the weighted rewards over the batch (n − 1)
        n, total = sums["scorable"], sums["reward_sum"]
        record["reward_std"] = math.sqrt(max(sums["reward_sqsum"] - total * total / n, 0.0) / (n - 1))
    if sums.get("completions", 0) > 0:  # TRL's log(): None for a value no completion gave (its nanmean/nanstd: NaN)
        record.setdefault("reward", None), record.setdefault("reward_std", None)
    mean("zero_std_groups", "groups", "frac_reward_zero_std")
    mean("reward_none", "completions", "frac_reward_none")
    # dynamic sampling (rollout/group_filter.py): fresh groups sampled vs kept, before the filter, carry-over
    mean("ds_kept_groups", "ds_sampled_groups", "dynamic_sampling/keep_rate")
    mean("ds_rounds", "rollouts", "dynamic_sampling/rounds")
    mean("ds_sampled_groups", "ds_kept_groups", "dynamic_sampling/prompts_per_kept_group")
    mean("ds_carried_groups", "groups", "dynamic_sampling/carried_fraction")
    mean("ds_dropped_groups", "ds_sampled_groups", "dynamic_sampling/dropped_fraction")
    mean("ds_at_cap", "rollouts", "dynamic_sampling/at_cap")
    mean("ds_filled_groups", "groups", "dynamic_sampling/filled_fraction")  # groups without spread that filled a rollout at the cap
    mean("ds_zero_std_sampled", "ds_sampled_groups", "dynamic_sampling/frac_reward_zero_std_before")
    mean("ds_reward_sampled", "ds_completions_sampled", "dynamic_sampling/reward_before")
    record.update(reward_stats(sums, reward_names, "rewards"))
    mean("completion_length_sum", "completions", "completions/mean_length")  # TRL's completions/* (model tokens only)
    for key, name in (("completion_length_min", "min_length"), ("completion_length_max", "max_length"),
                      ("terminated_length_min", "min_terminated_length"), ("terminated_length_max", "max_terminated_length")):
        if key in extremes:
            record[f"completions/{name}"] = extremes[key]
    if "terminated" in sums:  # TRL logs 0 when no completion ended with EOS
        record["completions/mean_terminated_length"] = sums["terminated_length_sum"] / sums["terminated"] if sums["terminated"] else 0.0
        record.setdefault("completions/min_terminated_length", 0.0)
        record.setdefault("completions/max_terminated_length", 0.0)
    mean("truncated", "completions", "completions/clipped_ratio")
    mean("tool_calls", "completions", "tools/call_frequency")  # TRL's: calls per completion, failures per call
    if "tool_calls" in sums:
        record["tools/failure_frequency"] = sums["tool_failures"] / sums["tool_calls"] if sums["tool_calls"] > 0 else 0.0
    if "truncated_prompts" in sums:
        record["truncated_prompts"] = int(sums["truncated_prompts"])
    for key, over, name in (("kl", "tokens", "kl"), ("kl_old", "tokens", "kl_old"), ("entropy", "tokens", "entropy"),
                            ("clip_low", "clip_units", "clip_ratio/low_mean"), ("clip_high", "clip_units", "clip_ratio/high_mean"),
                            ("clip_region", "clip_units", "clip_ratio/region_mean"), ("cispo_clipped", "clip_units", "cispo_clip_ratio")):
        if key in sums:  # TRL's global_masked_mean: a window whose every token was masked logs 0 (its count clamped at 1)
            record[name] = sums[key] / max(sums.get(over, 0), 1)
    for key, name in (("clip_low_min", "clip_ratio/low_min"), ("clip_high_max", "clip_ratio/high_max")):
        if key in extremes:  # no sequence with an active token in the window: None, as TRL's nanmin / nanmax
            record[name] = extremes[key] if math.isfinite(extremes[key]) else None
    mean("logp_diff_sum", "logp_diff_count", "sampling/sampling_logp_difference/mean")  # TRL's names (algo/sampling_correction.py)
    mean("is_ratio_sum", "is_ratio_count", "sampling/importance_sampling_ratio/mean")
    mean("is_masked", "is_ratio_count", "sampling/importance_sampling_ratio/masked_fraction")
    for key, name in (("logp_diff_max", "sampling_logp_difference/max"), ("is_ratio_min", "importance_sampling_ratio/min"),
                      ("is_ratio_max", "importance_sampling_ratio/max")):
        if key in extremes:
            record[f"sampling/{name}"] = extremes[key]
    if sums.get("padded_tokens", 0) > 0:  # the update's passes (logprobs.py): padded layout tokens never computed
        record["pad_fraction"] = 1 - sums["real_tokens"] / sums["padded_tokens"]
        record["shared_prompt_fraction"] = 1 - sums["packed_tokens"] / sums["real_tokens"]
    if overlap:  # TRL AsyncGRPOTrainer's own keys (overlap_metrics.py); beta > 0's kl keeps GRPOTrainer's meaning
        for key, value in overlap_record(sums, extremes, reward_names).items():
            record.setdefault(key, value)
    record.update({f"seconds/{phase}": round(s, 4) for phase, s in seconds.items()})
    if seconds.get("generate", 0) > 0 and "completion_tokens" in sums:
        record["generation_tokens_per_second"] = sums["completion_tokens"] / seconds["generate"]
    if seconds.get("update", 0) > 0 and "tokens" in sums:
        record["train_tokens_per_second"] = sums["tokens"] / seconds["update"]
    for key in sums:
        if key.endswith(USER_SUM):  # reward functions' log_metric values: mean over the window
            if (name := key[: -len(USER_SUM)]) in record or name in TRAINER_KEYS:  # a name only the config's record has (`kl`, …)
                raise taken_name(name)  # (one every record has is refused at the call: reward_hooks.py)
            record[name] = sums[key] / sums[f"{name}{USER_COUNT}"] if sums[f"{name}{USER_COUNT}"] > 0 else None  # None: NaNs only
    return record


def reward_stats(sums: dict, reward_names: list[str], prefix: str) -> dict[str, float]:
    """TRL's `<prefix>/<name>/mean` and `/std` of each reward function over the completions it applied to.

    The std is the sample (n − 1) std over all of the window's completions (TRL takes it per
    generation batch and averages over the window: the same for a window of one rollout); one that
    applied to one completion has std 0. A function that returned None for every completion the
    window scored logs None for both, as TRL's `log()` turns the NaN of its nanmean and nanstd of an
    all-None column into None (JSON loggers fail on NaN; evaluation's too); a window that scored nothing
    (a reused rollout's steps) logs neither, as TRL's.
    """
    out = {}
    for name in reward_names:
        n, total, squares = sums.get(f"rewards/{name}_count", 0), sums.get(f"rewards/{name}_sum", 0.0), sums.get(f"rewards/{name}_sqsum", 0.0)
        if n > 0:
            out[f"{prefix}/{name}/mean"] = total / n
            out[f"{prefix}/{name}/std"] = math.sqrt(max(squares - total * total / n, 0.0) / (n - 1)) if n > 1 else 0.0
        elif sums.get("completions", 0) > 0:
            out[f"{prefix}/{name}/mean"] = out[f"{prefix}/{name}/std"] = None
    return out


def _floats(row: torch.Tensor) -> list:
    return [None if v != v else v for v in row.tolist()]  # NaN (not applicable) → None
