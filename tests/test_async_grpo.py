"""Generation overlapped with training (max_staleness; rollout/async_producer.py), on a real vLLM server on loopback.

The session's one server serves the module (tests/conftest.py, shared with tests/test_vllm.py); the dead-server
test's server is a proxy in front of it that dies. The tiny model samples 8 tokens, so a rollout takes a fraction of a second: the lag tests make the
trainer the slow side (a callback sleeps after each step), so the producer always runs up to its admission bound
and every lag is the bound's, worked out by hand in each test.
"""

import json
import os
import signal
import threading
import time

import pytest
import torch
from transformers import AutoConfig, TrainerCallback

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.algo.sampling_correction import importance_sampling_ratio
from fastgrpo.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
from fastgrpo.generation.contract import EngineError
from fastgrpo.model.flops import flops_per_token
from fastgrpo.rollout.async_producer import RolloutPipeline
from fastgrpo.run.datasets import PromptOrder
from fastgrpo.run.interrupt import TrainingInterrupted
from test_vllm import metrics, reward_even_tokens

def config(tmp_path, server, name="out", cls=GRPOConfig, **overrides):
    values = dict(
        output_dir=str(tmp_path / name), use_vllm=True, vllm_mode="server", vllm_server_base_url=server, vllm_server_timeout=180,
        per_device_train_batch_size=8, num_generations=8, max_prompt_length=32, max_completion_length=8, max_steps=4,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0, bf16=False, report_to="none",
    )
    return cls(**{**values, **overrides})


class SlowTrainer(TrainerCallback):
    """Makes the trainer the slow side: after each optimizer step, the producer has `seconds` to run up to its bound."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


TIMING_KEYS = ("seconds/", "perf/", "rollout/", "sample/", "batch/", "generation_tokens_per_second", "train_tokens_per_second", "step_time")


ASYNC_KEYS = ("rewards/reward_even_tokens", "ratio", "kl")  # TRL AsyncGRPOTrainer's reward key: the overlap's only


def comparable(records):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_KEYS) and k not in ASYNC_KEYS} for r in records]


def test_max_staleness_0_is_the_synchronous_loop(tmp_path, tokenizer, prompts, server, model_dir):
    # max_staleness=0: rollout k is started only once the trainer asks for it, after its weights are pushed; the
    # requests carry the same seeds in the same order, so every logged number is the synchronous run's.
    runs = {}
    for staleness in (None, 0):
        args = config(tmp_path, server, name=f"s{staleness}", max_staleness=staleness, max_steps=3)
        GRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer).train()
        runs[staleness] = metrics(args.output_dir)
    assert len(runs[0]) == 3 and comparable(runs[0]) == comparable(runs[None])
    assert [r["sample/staleness_max"] for r in runs[0]] == [0, 0, 0] and "sample/staleness_max" not in runs[None][0]
    assert runs[None][1]["loss"] != runs[None][2]["loss"]  # the runs train (different numbers per step), they are not constant
    assert not any(k.startswith(("batch/", "perf/")) or k in ASYNC_KEYS for r in runs[None] for k in r)  # TRL AsyncGRPOTrainer's keys: the overlap's only
    assert not any(k.startswith("perf/mfu") for r in runs[0] for k in r)  # bf16=False: TRL's peak table has no float32 peak (nor a CPU's)


@pytest.mark.parametrize("max_staleness,lags", [(1, [0, 1, 1, 1, 1]), (2, [0, 1, 2, 2, 2])])
def test_staleness_is_bounded_with_the_lags_of_a_slow_trainer(tmp_path, tokenizer, prompts, server, model_dir, max_staleness, lags):
    # One push per rollout (weight_sync_steps=1, one step per rollout): version v = rollouts taken − 1. The producer may
    # start rollout k once k < asked + max_staleness; with the trainer slow it always does, at the version then:
    #   s=1: rollout 0 at v0 (lag 0); rollout k ≥ 1 once rollout k−1 is asked for, at v(k−1): lag 1.
    #   s=2: rollouts 0, 1 at v0 (lags 0, 1), also rollout 2 at v0 before the first push (lag 2), then rollout k once
    #        k−2 is asked for, at v(k−2): lag 2.
    args = config(tmp_path, server, max_staleness=max_staleness, max_steps=5)
    trainer = GRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer,
                          callbacks=[SlowTrainer(2.0)])
    trainer.update.peak_flops = 1e12  # a stand-in peak FLOP/s (a CPU has none in TRL's table): the per-step MFU is logged
    trainer.train()
    records = metrics(args.output_dir)
    assert [r["sample/staleness_mean"] for r in records] == lags and [r["sample/staleness_max"] for r in records] == lags
    assert all(r["sample/dropped_stale_total"] == 0 for r in records)  # the admission bound keeps every rollout within max_staleness
    assert all(r["perf/rollout_wait_s"] < 1.0 for r in records[1:])  # the slow trainer never waits on a rollout after the first
    # TRL AsyncGRPOTrainer's step budget (run/overlap_metrics.py), one step a line: 8 completions of one prompt in one micro-batch
    assert "perf/step_s" not in records[0] and all(r["perf/step_s"] >= 2.0 for r in records[1:])  # the callback's 2 s sleep between step ends
    for r in records:
        assert (r["batch/samples_per_step"], r["batch/microbatches_per_step"], r["batch/groups_per_step"]) == (8, 1, 1)
        assert r["rewards/reward_even_tokens"] == r["rewards/reward_even_tokens/mean"]  # TRL AsyncGRPOTrainer's key beside GRPOTrainer's
        assert r["ratio"] > 0 and r["kl"] >= 0  # TRL AsyncGRPOTrainer's π_θ against the sampler (beta = 0: no reference KL)
        assert r["batch/trained_tokens_per_step"] == pytest.approx(8 * r["completions/mean_length"])  # every completion token has a loss
        assert r["batch/trained_tokens_per_step"] < r["batch/forwarded_tokens_per_step"] <= r["batch/trained_tokens_per_step"] + 32  # + one shared prompt (≤ max_prompt_length)
        assert 0 < r["perf/fwd_s"] < r["perf/fwd_bwd_s"] and r["perf/optimizer_s"] > 0
        assert r["perf/forwarded_tok_s_fwd_bwd"] == pytest.approx(r["batch/forwarded_tokens_per_step"] / r["perf/fwd_bwd_s"])
    for r in records[1:]:
        assert r["perf/trained_tok_s_wall_clock"] == pytest.approx(r["batch/trained_tokens_per_step"] / r["perf/step_s"])
        assert r["perf/forwarded_tok_s_wall_clock"] == pytest.approx(r["batch/forwarded_tokens_per_step"] / r["perf/step_s"])
        assert r["perf/fwd_bwd_s"] + r["perf/optimizer_s"] < r["perf/step_s"]  # the step's own compute, within its span
    # TRL's MFU: 100 · FLOPs per token at the step's forwarded tokens per completion × forwarded tokens / seconds / peak
    text_config = AutoConfig.from_pretrained(model_dir).get_text_config()
    for r in records:
        tokens = r["batch/forwarded_tokens_per_step"]
        flops = flops_per_token(text_config, int(tokens / r["batch/samples_per_step"])) * tokens
        assert r["perf/mfu_fwd_bwd"] == pytest.approx(100 * flops / r["perf/fwd_bwd_s"] / 1e12)
        if r is not records[0]:  # the first step has no span to the last: TRL's neither
            assert r["perf/mfu_wall_clock"] == pytest.approx(100 * flops / r["perf/step_s"] / 1e12)
            assert r["perf/mfu_wall_clock"] < r["perf/mfu_fwd_bwd"]  # the same FLOPs over the longer span
    assert "perf/mfu_wall_clock" not in records[0]
    every_step = ("perf/fwd_s", "perf/fwd_bwd_s", "perf/optimizer_s", "perf/rollout_wait_s", "perf/forwarded_tok_s_fwd_bwd", "perf/mfu_fwd_bwd")
    after_first = ("perf/step_s", "perf/forwarded_tok_s_wall_clock", "perf/trained_tok_s_wall_clock", "perf/mfu_wall_clock")
    assert all(r[key] >= 0 for i, r in enumerate(records) for key in every_step + (after_first if i else ()))  # TRL's keys, each step
    # TRL's perf/weight_sync_*: one push per rollout sampled after a copy. Rollout 0 pushes the weights copied at start-up;
    # rollouts 1 … max_staleness start before the first optimizer step's copy (the lags above), so they push none.
    assert [("perf/weight_sync_s" in r) for r in records] == [True] + [False] * max_staleness + [True] * (4 - max_staleness)
    for r in (r for r in records if "perf/weight_sync_s" in r):
        pause, barrier, transfer = (r[f"perf/weight_sync_{part}_s"] for part in ("pause", "barrier", "transfer"))
        assert pause > 0 and barrier == 0.0 and transfer > 0  # the cache reset, one process's barrier (none), the copy and reload
        assert r["perf/weight_sync_s"] >= pause + barrier + transfer - 1e-9  # the parts and the copier's wait for a running push


def test_evaluation_during_the_overlap_pauses_the_producer_and_counts_the_epoch_of_the_rollouts_trained(tmp_path, tokenizer, prompts, server, model_dir):
    # evaluate() samples and scores through the producer's assembly, backend and reward hooks: it called the pipeline's
    # missing score_rows (AttributeError at the first evaluation, after step 2's compute). It now runs with the producer
    # paused. The epoch is the rollouts handed to the trainer (1 prompt of 32 each), not the producer's draws ahead.
    seen = []  # (scored in the trainer's thread: an evaluation, a rollout being produced meanwhile)

    def reward(completion_ids, **kwargs):
        seen.append((threading.current_thread() is threading.main_thread(), trainer.rollouts.producing))
        return reward_even_tokens(completion_ids)

    args = config(tmp_path, server, max_staleness=2, max_steps=4, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=8)
    trainer = GRPOTrainer(model_dir, reward, args=args, train_dataset=prompts, eval_dataset=prompts.select(range(2)),
                          processing_class=tokenizer, callbacks=[SlowTrainer(1.0)])
    trainer.train()
    evals = [r for r in metrics(args.output_dir) if "eval_reward" in r]
    assert [(r["step"], r["epoch"]) for r in evals] == [(2, 2 / 32), (4, 4 / 32)]
    assert all(0 <= r["eval_reward"] <= 1 and r["eval_completions/mean_length"] > 0 for r in evals)
    evaluations = [producing for in_trainer, producing in seen if in_trainer]
    assert len(evaluations) == 2 * 2 and not any(evaluations)  # 2 evaluations × 2 batches of 8 (2 prompts × G = 8): none beside a rollout
    assert all(producing for in_trainer, producing in seen if not in_trainer)  # the producer's own scoring
    assert [r["epoch"] for r in trainer.state.log_history if "loss" in r][:4] == [s / 32 for s in (1, 2, 3, 4)]


def test_a_rollout_past_the_bound_is_dropped_counted_and_replaced(tmp_path, tokenizer, prompts, server, model_dir):
    # A scripted version schedule through the pipeline's own API: the trainer's version jumps from 0 to 2 while
    # rollout 1 (started at v0) waits, so it lags 2 > max_staleness=1 and is dropped; rollout 2 starts after the jump.
    trainer = GRPOTrainer(model_dir, reward_even_tokens, args=config(tmp_path, server), train_dataset=prompts, processing_class=tokenizer)
    version = [0]
    pipeline = RolloutPipeline(trainer.assembly, trainer.order, lambda: version[0], max_staleness=1, inflight=3, heartbeat_stale_after_s=60)
    try:
        first, _, sums = pipeline()
        assert (sums["async_staleness"], sums["async_dropped"]) == (0, 0) and len(first) == 8
        deadline = time.monotonic() + 60
        while pipeline.ready.qsize() < 1 and time.monotonic() < deadline:  # rollout 1, made at v0
            time.sleep(0.05)
        version[0] = 2
        second, _, sums = pipeline()
        assert (sums["async_staleness"], sums["async_dropped"]) == (0, 8)  # rollout 1's 8 completions dropped; rollout 2 made at v2
        # The checkpoint's order is the one after rollout 2's draw (1 prompt per rollout: 3 drawn), whatever is in flight.
        assert pipeline.state_dict()["order"] == {"epoch": 0, "position": 3}
        expected = [prompts[i]["prompt"][0]["content"] for i in PromptOrder(32, 0, True).take(3)]
        assert [first.prompts[0][-1]["content"], second.prompts[0][-1]["content"]] == [expected[0], expected[2]]
    finally:
        pipeline.close()
    assert not pipeline.thread.is_alive()


def test_the_correction_weights_are_trls_formula_on_the_stale_rollouts(tmp_path, tokenizer, prompts, server, model_dir):
    # π_old of a stale rollout is the trainer's weights at its first use (free: μ = 1); its loss weight is TRL's
    # vllm_importance_sampling ratio of π_old to the sampler's log-probs (sequence_mask, C_max = 3 by default).
    args = config(tmp_path, server, max_staleness=1, max_steps=3, vllm_importance_sampling_mode="token_truncate",
                  vllm_importance_sampling_clip_max=1.5)
    trainer = GRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer,
                          callbacks=[SlowTrainer(1.0)])
    calls, correction = [], trainer.update.correction

    def recording(advantages, logps, old_logps, sampling_logps, mask):
        out = correction(advantages, logps, old_logps, sampling_logps, mask)
        calls.append((old_logps.clone(), sampling_logps.clone(), mask.clone(), out[0]))
        return out

    trainer.update.correction = recording
    trainer.train()
    assert len(calls) == 3 and [r["sample/staleness_max"] for r in metrics(args.output_dir)] == [0, 1, 1]
    for old, sampled, mask, weight in calls:
        trl = torch.clamp(torch.exp(torch.nan_to_num((old - sampled) * mask, nan=0.0)), max=1.5)  # TRL's token_truncate, written out
        assert torch.equal(weight, trl) and torch.equal(weight, importance_sampling_ratio(old, sampled, mask, "token_truncate", None, 1.5))
    lag = (calls[2][0] - calls[2][1]).abs()[calls[2][2].bool()]
    assert lag.max() > 1e-3  # a stale rollout: one update of lr 1e-3 moved π_old off the sampler's weights (fp32 noise is ≤ 1e-4)


class StopAt(TrainerCallback):
    """At optimizer step `step`: a callback's stop, or Ctrl-C (SIGINT to this process: the step finishes, saves, stops)."""

    def __init__(self, step: int, how: str):
        self.step, self.how = step, how

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(1.0)  # rollouts 3 and 4 are in flight or queued when step 2 saves
        if state.global_step == self.step and self.how == "callback":
            control.should_training_stop = True
        elif state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def trained_prompts(output_dir):
    with open(os.path.join(output_dir, "completions.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    by_step = {}
    for row in rows:
        by_step.setdefault(row["step"], set()).add(row["prompt"][-1]["content"])
    return [sorted(by_step[s]) for s in sorted(by_step)]


@pytest.mark.parametrize("how", ["callback", "ctrl_c"])
def test_resume_retrains_nothing_and_resamples_what_was_in_flight(tmp_path, tokenizer, prompts, server, model_dir, how):
    # Stopped at step 2 with rollouts made ahead (max_staleness=2): the checkpoint keeps the data order after rollout 2,
    # so the resumed run draws prompts 3 and 4 again and the four steps train the data order's first four prompts.
    # A TRL async script's config: AsyncGRPOConfig's defaults (gradient_checkpointing=True, constant schedule) but the sizes.
    args = config(tmp_path, server, cls=AsyncGRPOConfig, max_staleness=2, save_strategy="steps", save_steps=2, log_completions=True)
    make = lambda callbacks: AsyncGRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts,  # noqa: E731
                                              processing_class=tokenizer, callbacks=callbacks)
    first = make([StopAt(2, how)])
    if how == "ctrl_c":
        with pytest.raises(TrainingInterrupted, match="interrupted at step 2/4; saved"):
            first.train()
    else:
        first.train()
    assert not first.rollouts.thread.is_alive() and os.path.isdir(os.path.join(args.output_dir, "checkpoint-2"))
    assert trained_prompts(args.output_dir) == [[p] for p in ["Count to {}.".format(i) for i in PromptOrder(32, 0, True).take(2)]]
    trainer = make([])
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 4 and trainer.weight_version == 3  # pushes before rollouts 1, 2, 3 (restored from the checkpoint)
    assert trained_prompts(args.output_dir) == [[f"Count to {i}."] for i in PromptOrder(32, 0, True).take(4)]
    assert [r["step"] for r in metrics(args.output_dir)] == [1, 2, 3, 4]


def test_overlap_logs_each_reward_function_under_trls_async_key():
    # TRL AsyncGRPOTrainer logs rewards/<name> (its rollout worker's per-completion key, nan-aware means), not GRPOTrainer's
    # rewards/<name>/mean: a script reading log_history["rewards/<name>"] got a KeyError. None where the function scored none.
    from fastgrpo.run.metrics import window_record

    sums = {"steps": 1, "completions": 4, "rewards/f_sum": 3.0, "rewards/f_sqsum": 5.0, "rewards/f_count": 2.0, "rewards/g_count": 0.0}
    record = window_record(1, sums, {}, {}, ["f", "g"], overlap=True)
    assert record["rewards/f"] == 1.5 == record["rewards/f/mean"] and record["rewards/g"] is None
    assert not {"rewards/f", "rewards/g"} & set(window_record(1, sums, {}, {}, ["f", "g"]))  # GRPOTrainer's keys only without the overlap


def test_overlap_logs_trls_async_ratio_and_kl_of_the_policy_against_the_sampler():
    # TRL AsyncGRPOTrainer's loss ratio is π_θ / μ_s (the sampler's log-probs are its π_old) and it logs its token mean as
    # `ratio` and the k3 KL (ratio − 1) − log ratio as `kl`; fastgrpo logged neither. Tokens with no sampler log-prob are out.
    from fastgrpo.algo.sampling_correction import behaviour_metrics
    from fastgrpo.run.metrics import window_record

    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -4.0]])
    sampled = torch.tensor([[-1.2, -1.5, float("nan")], [-0.3, -0.9, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    sums = {k: float(v) for k, v in behaviour_metrics(logps, sampled, mask).items()}
    kept = torch.tensor([-1.0 + 1.2, -2.0 + 1.5, 0.0, -0.7 + 0.9])  # TRL's log_ratio on the loss tokens with a sampler log-prob
    record = window_record(1, {"steps": 1, **sums}, {}, {}, [], overlap=True)
    assert record["ratio"] == pytest.approx(float(kept.exp().mean()))
    assert record["kl"] == pytest.approx(float(((kept.exp() - 1) - kept).mean()))
    assert not {"ratio", "kl"} & set(window_record(1, {"steps": 1, **sums}, {}, {}, []))  # the overlap's keys only
    assert window_record(1, {"steps": 1, "kl": 2.0, "tokens": 4.0, **sums}, {}, {}, [], overlap=True)["kl"] == 0.5  # beta > 0: the reference KL


def test_async_grpo_configs_defaults_are_trls():
    """Every field of TRL 1.16's AsyncGRPOConfig is one here, with its default (TRL's is a TrainingArguments, not a
    GRPOConfig: disable_tqdm None, ignore_data_skip and remove_unused_columns True), but the output folder's."""
    import dataclasses

    from trl.experimental.async_grpo import AsyncGRPOConfig as TRLAsyncGRPOConfig

    ours = {f.name: f.default for f in dataclasses.fields(AsyncGRPOConfig)}
    theirs = {f.name: f.default for f in dataclasses.fields(TRLAsyncGRPOConfig) if not callable(f.default)}  # defaults, not factories
    assert set(theirs) <= set(ours)
    assert {k: (v, ours[k]) for k, v in theirs.items() if ours[k] != v} == {"output_dir": (None, "grpo-output")}


def test_async_grpo_takes_trls_fields_and_refuses_what_it_cannot_honour(tmp_path, server):
    args = AsyncGRPOConfig(output_dir=str(tmp_path / "a"), vllm_server_base_url=server, per_device_train_batch_size=8,
                           run_name="trl-script", fork_threshold_tokens=512, request_timeout=60)
    assert (args.max_staleness, args.weight_sync_steps, args.max_inflight_tasks, args.queue_maxsize, args.heartbeat_stale_after_s) == (4, 1, -1, 1024, 300.0)
    assert (args.generation_backend, args.vllm_mode, args.lr_scheduler_type, args.logging_steps) == ("vllm", "server", "constant", 1)
    for fields, message in (({"dtype": "bf16"}, "use one of auto, bfloat16, float16, float32"), ({"token_budget": 4096}, "per_device_train_batch_size"),
                            ({"max_staleness": None}, "synchronous loop"), ({"max_staleness": -1}, "use 0 or more")):
        with pytest.raises(ValueError, match=message):
            AsyncGRPOConfig(output_dir=str(tmp_path / "a"), **fields)
    with pytest.raises(ValueError, match="max_staleness=2 overlaps generation with training on a vLLM server"):
        GRPOConfig(max_staleness=2)
    with pytest.raises(ValueError, match="max_inflight_tasks=4 holds less than one rollout"):
        AsyncGRPOConfig(output_dir=str(tmp_path / "b"), per_device_train_batch_size=8, max_inflight_tasks=4)
    with pytest.raises(ValueError, match="rollout_worker"):
        AsyncGRPOTrainer("tiny", reward_even_tokens, args=args, rollout_worker=object())


@pytest.mark.parametrize("fields", [dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=5, save_steps=10),
                                    dict(save_strategy="best", metric_for_best_model="reward", eval_strategy="epoch"), dict(eval_on_start=True)])
def test_async_grpo_trainer_refuses_evaluation_naming_the_trainer_that_evaluates(tmp_path, fields):
    # TRL's AsyncGRPOTrainer takes no eval_dataset; the refusal said "pass an eval_dataset", which its constructor does not
    # take. GRPOTrainer with max_staleness is the same overlap and takes one. Refused before any model loads or server is asked.
    args = AsyncGRPOConfig(output_dir=str(tmp_path), **fields)
    with pytest.raises(ValueError, match=r"AsyncGRPOTrainer takes no eval_dataset \(as TRL's\).*fastgrpo.GRPOTrainer\(model, reward_funcs, args=args, "
                                         r"train_dataset=…, eval_dataset=…\)"):
        AsyncGRPOTrainer("no-such-model", reward_even_tokens, args=args, train_dataset=[{"prompt": "hi"}] * 8)


def test_async_grpo_config_warns_that_its_base_url_wins_over_a_port_given(tmp_path):
    # A GRPOConfig user's vllm_server_port=8001 (TRL's AsyncGRPOConfig has no such field) was dropped silently: the base
    # URL, TRL's default "http://localhost:8000", wins, so the run asked another port than the one given.
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AsyncGRPOConfig(output_dir=str(tmp_path / "a"), vllm_server_port=8001)
    assert [str(w.message) for w in caught if "no effect" in str(w.message)] == [
        "vllm_server_port=8001 has no effect while vllm_server_base_url='http://localhost:8000' is set (it wins, as in TRL; "
        "AsyncGRPOConfig sets TRL's default); give the server's host and port in vllm_server_base_url, or drop it."]


def test_async_grpo_config_takes_a_torch_dtype_as_trls_loader_does(tmp_path):
    # TRL's AsyncGRPOConfig keeps dtype=torch.bfloat16 and its loader (create_model_from_path) takes a torch.dtype, so a
    # TRL script passing one trains in bf16; fastgrpo refused it ("use one of auto, bfloat16, …").
    args = AsyncGRPOConfig(output_dir=str(tmp_path / "a"), dtype=torch.bfloat16)
    assert args.dtype == "bfloat16" and json.loads(args.to_json_string())["dtype"] == "bfloat16"
    with pytest.raises(ValueError, match="dtype='float64': use one of auto, bfloat16, float16, float32"):
        AsyncGRPOConfig(output_dir=str(tmp_path / "a"), dtype=torch.float64)


def test_async_grpo_trainer_forces_ignore_data_skip_as_trl(tmp_path, tokenizer, prompts, server, model_dir):
    # TRL's AsyncGRPOTrainer sets args.ignore_data_skip=True whatever was passed, warning (TRL's test_resume_from_checkpoint
    # asserts trainer.args.ignore_data_skip is True); fastgrpo kept the False a script passed.
    args = config(tmp_path, server, cls=AsyncGRPOConfig, max_staleness=1, ignore_data_skip=False)
    with pytest.warns(UserWarning, match="ignore_data_skip` is forced to `True` for AsyncGRPO"):
        trainer = AsyncGRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    assert trainer.args.ignore_data_skip is True and args.ignore_data_skip is True


def test_async_grpo_trainer_loads_in_args_dtype_and_writes_back_its_auto_inflight_bound_as_trl(tmp_path, tokenizer, prompts, server, model_dir):
    # TRL's AsyncGRPOTrainer loads a model named by path in args.dtype (model_init_kwargs' own dtype wins) and writes
    # max_inflight_tasks=-1 back as max(max_staleness, 1) × the completions per step; fastgrpo refused dtype="bfloat16".
    args = config(tmp_path, server, cls=AsyncGRPOConfig, max_staleness=2, max_steps=1, dtype="bfloat16")
    trainer = AsyncGRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    assert args.model_init_kwargs == {"dtype": "bfloat16"} and args.max_inflight_tasks == 2 * 8
    out = trainer.train()  # bf16 parameters train: a finite loss and grad norm
    assert trainer.state.global_step == 1 and torch.isfinite(torch.tensor([out.training_loss, trainer.state.log_history[0]["grad_norm"]])).all()
    args = config(tmp_path, server, "b", cls=AsyncGRPOConfig, max_staleness=0, dtype="bfloat16", model_init_kwargs={"dtype": "float32"})
    trainer = AsyncGRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32} and args.max_inflight_tasks == 1 * 8


def test_a_producer_silent_past_the_heartbeat_ends_the_run(tmp_path, tokenizer, prompts, server, model_dir):
    # A reward function that hangs on its third rollout: the producer shows no life, and the trainer stops waiting
    # after heartbeat_stale_after_s with one EngineError, the steps before it trained and checkpointed.
    calls = []

    def hangs_on_the_third_rollout(completion_ids, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            time.sleep(8)
        return reward_even_tokens(completion_ids)

    args = config(tmp_path, server, max_staleness=1, max_steps=4, save_strategy="steps", save_steps=1, heartbeat_stale_after_s=2)
    trainer = GRPOTrainer(model_dir, hangs_on_the_third_rollout, args=args, train_dataset=prompts, processing_class=tokenizer)
    with pytest.raises(EngineError, match=r"made no progress for [2-7] s \(heartbeat_stale_after_s=2\)"):
        trainer.train()
    assert [r["step"] for r in metrics(args.output_dir)] == [1, 2] and os.path.isdir(os.path.join(args.output_dir, "checkpoint-2"))


def test_a_dead_server_ends_the_run_with_one_error_and_keeps_the_checkpoint(tmp_path, tokenizer, prompts, model_dir, dying_server):
    # The run's server (a proxy in front of the shared one, conftest.DyingServer) dies once step 2 is saved, with the
    # producer working ahead.
    class KillServerAfterStep2(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 2:
                dying_server.die()

    args = config(tmp_path, dying_server.url, max_staleness=2, max_steps=6, save_strategy="steps", save_steps=1, heartbeat_stale_after_s=30)
    trainer = GRPOTrainer(model_dir, reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer,
                          callbacks=[KillServerAfterStep2()])
    start = time.monotonic()
    with pytest.raises(EngineError, match=r"stopped answering .*; restart the server\. The last checkpoint, \S+checkpoint-(\d+), is kept: resume") as caught:
        trainer.train()
    assert time.monotonic() - start < 30 + 60  # within heartbeat_stale_after_s of the kill (and the start-up before it)
    # Rollouts already made when the server died still train (their samples are whole); the run stops at the first
    # hand-over after the producer's failure, with every step it logged checkpointed (save_steps=1) and none beyond.
    last = [r["step"] for r in metrics(args.output_dir)][-1]
    assert f"checkpoint-{last}, is kept" in str(caught.value)  # the error names the checkpoint the resume will pick
    assert 2 <= last < 6 and os.path.isdir(os.path.join(args.output_dir, f"checkpoint-{last}"))
    assert not os.path.isdir(os.path.join(args.output_dir, f"checkpoint-{last + 1}")) and not trainer.rollouts.thread.is_alive()
