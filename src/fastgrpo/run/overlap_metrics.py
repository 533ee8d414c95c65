"""The metrics of a run that overlaps generation with training (max_staleness), under TRL 1.16 AsyncGRPOTrainer's keys.

TRL's async trainer logs, besides GRPOTrainer's keys, the rollouts' lag and queue (`sample/*`) and a per-step budget
of time and work (`perf/*`, `batch/*`); a dashboard built on them reads fastgrpo's overlap the same. Each is a mean
over the window's optimizer steps, and each rate Σ tokens / Σ seconds, as TRL's `_reduce_metric` reduces them:

- `perf/fwd_s`: the step's forward passes; `perf/fwd_bwd_s`: its forward and backward passes (TRL's training_step
  calls); `perf/optimizer_s`: `optimizer.step()` alone (TRL's callback times no clipping either);
- `perf/step_s`: from the last step's end to this one's, rollout waits, logging and saving included (the run's first
  step has none: TRL's neither), and `perf/rollout_wait_s`: the trainer's wait for a rollout;
- `batch/microbatches_per_step`, `batch/samples_per_step` (completions), `batch/forwarded_tokens_per_step` (the tokens
  the packed passes compute: a group's shared prompt once, as TRL's packed rows), `batch/trained_tokens_per_step`
  (the completion tokens with a loss), `batch/groups_per_step` (groups handed to the trainer);
- `perf/forwarded_tok_s_fwd_bwd`, `perf/forwarded_tok_s_wall_clock`, `perf/trained_tok_s_wall_clock`;
- `perf/mfu_fwd_bwd`, `perf/mfu_wall_clock`: each step's model FLOPs utilisation in percent over `perf/fwd_bwd_s` and
  `perf/step_s` (model/flops.py: TRL's FLOPs per token and its table of GPU peaks), where the device has a peak in the
  table: on a CPU, or in float32, none is logged, as TRL logs none where its lookup finds no peak;
- `perf/weight_sync_s` and its parts `perf/weight_sync_pause_s`, `_barrier_s` (0.0: one process), `_transfer_s`: the
  mean per weight push of a window's pushes (generation/vllm/backend.VLLMGenerator.pop_syncs says what each part
  times). fastgrpo's push runs in the producer thread before the rollout it samples (the trainer only copies the
  weights), so the keys come with that rollout's step: a step whose rollout was sampled without a push (the first
  max_staleness rollouts are all sampled at version 0) has none, as TRL's step without a sync;
- `ratio` and `kl`: π_θ against the sampler's log-probs (TRL's async loss ratio, whose π_old they are), the token
  means of exp(log π_θ − log μ_s) and its k3 KL estimate (algo/sampling_correction.behaviour_metrics); with beta > 0
  (no TRL async field) `kl` stays GRPOTrainer's KL to the reference model;
- `rewards/<name>`: each reward function's mean over the completions it scored (TRL's per-sample metric, averaged
  nan-aware by its collator and `log()`: None where it scored none), beside GRPOTrainer's `rewards/<name>/mean` and `/std`.

Not logged: TRL's packing-row keys (`batch/row_*`, `batch/pad_frac`: fastgrpo packs no token-budget rows; `pad_fraction` says its padding),
its per-sample token keys (`sample/forwarded_tokens_*`, `sample/trained_tokens_mean`, `batch/masked_token_frac`: the
`batch/*_tokens_per_step` above and `completions/mean_length` carry the counts), `sample/time_in_queue_s`, and its rollout
worker's own gauges (`rollout/*`: fastgrpo's producer is not TRL's worker; `seconds/generate` times its sampling).

Not here: measuring them (update/step.py, rollout/async_producer.py, generation/vllm/backend.py), the window (metrics.py).
"""

from __future__ import annotations


def overlap_record(sums: dict, extremes: dict, reward_names: list[str]) -> dict:
    """TRL AsyncGRPOTrainer's `sample/*`, `perf/*`, `batch/*` and `rewards/<name>` values from a window's reduced sums
    (module docstring).

    `sums` holds the update's per-step sums (`steps`, `step_fwd_s`, `step_fwd_bwd_s`, `step_optimizer_s`, `step_gap_s` and
    `step_gaps`, `micro_batches`, `samples`, `packed_tokens`, `tokens`, `behaviour_*`, `step_mfu_fwd_bwd`, `gap_mfu`), the
    pipeline's (`async_*`, `groups`, `weight_syncs` and `weight_sync_*_s`) and the rollouts' (`completions`,
    `rewards/<name>_sum` and `_count`); a value whose denominator is 0 in the window is left out.
    """
    record: dict = {}
    for name in reward_names:  # TRL's `rewards/<name>` (its rollout worker's per-sample key)
        count = sums.get(f"rewards/{name}_count", 0)
        if count > 0:
            record[f"rewards/{name}"] = sums[f"rewards/{name}_sum"] / count
        elif sums.get("completions", 0) > 0:
            record[f"rewards/{name}"] = None

    def ratio(key: str, over: str, name: str) -> None:
        if key in sums and sums.get(over, 0) > 0:
            record[name] = sums[key] / sums[over]

    ratio("behaviour_ratio_sum", "behaviour_tokens", "ratio")
    ratio("behaviour_kl_sum", "behaviour_tokens", "kl")
    ratio("async_staleness", "async_rollouts", "sample/staleness_mean")
    if "async_staleness_max" in extremes:
        record["sample/staleness_max"], record["sample/dropped_stale_total"] = extremes["async_staleness_max"], int(sums["async_dropped"])
    ratio("async_queue", "async_rollouts", "sample/rollout_queue_size")
    ratio("async_trainer_wait", "steps", "perf/rollout_wait_s")
    ratio("async_sampler_idle", "steps", "rollout/backpressure_s")
    for key, name in (("step_fwd_s", "perf/fwd_s"), ("step_fwd_bwd_s", "perf/fwd_bwd_s"), ("step_optimizer_s", "perf/optimizer_s"),
                      ("micro_batches", "batch/microbatches_per_step"), ("samples", "batch/samples_per_step"),
                      ("packed_tokens", "batch/forwarded_tokens_per_step"), ("tokens", "batch/trained_tokens_per_step"),
                      ("groups", "batch/groups_per_step")):
        ratio(key, "steps", name)
    ratio("step_gap_s", "step_gaps", "perf/step_s")
    ratio("packed_tokens", "step_fwd_bwd_s", "perf/forwarded_tok_s_fwd_bwd")
    ratio("gap_packed_tokens", "step_gap_s", "perf/forwarded_tok_s_wall_clock")  # the steps with a predecessor only, as TRL's
    ratio("gap_tokens", "step_gap_s", "perf/trained_tok_s_wall_clock")
    ratio("step_mfu_fwd_bwd", "steps", "perf/mfu_fwd_bwd")  # per-step gauges: TRL's window mean
    ratio("gap_mfu", "step_gaps", "perf/mfu_wall_clock")
    for part in ("", "_pause", "_barrier", "_transfer"):
        ratio(f"weight_sync{part}_s", "weight_syncs", f"perf/weight_sync{part}_s")
    return record
