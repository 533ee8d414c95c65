"""The loop end to end on a tiny random model: π_old rules, μ-reuse counts, resume, logging.

Every run is a few optimizer steps of a 3 M-parameter model on CPU.
"""

import json
import os

import pytest
import torch

import fastgrpo.update.step as step_module
from fastgrpo import GRPOConfig, GRPOTrainer


def reward_even_tokens(completion_ids, **kwargs):
    """Fraction of completion tokens with an even id: mean 0.5 for a random model, learnable."""
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=2,
        num_generations=4, max_prompt_length=32, max_completion_length=8, max_steps=4, num_iterations=1,
        learning_rate=1e-3, logging_steps=1, save_steps=1000, disable_tqdm=True, seed=0,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def read_metrics(output_dir):
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def record_losses(monkeypatch):
    """Wrap the trainer's optimizer step and grpo_loss: per optimizer step, (logps, old_logps, loss) of each of its
    forward/backward passes (one per micro-batch, or fewer where the step's micro-batches merge: update_token_budget)."""
    steps = []
    real_step, real_loss = step_module.OptimizerStep.__call__, step_module.grpo_loss

    def step(self, *args, **kwargs):
        steps.append([])
        return real_step(self, *args, **kwargs)

    def spy(logps, old_logps, *args, **kwargs):
        out = real_loss(logps, old_logps, *args, **kwargs)
        steps[-1].append((logps.detach().clone(), old_logps.detach().clone(), out.loss.detach().clone()))
        return out

    monkeypatch.setattr(step_module.OptimizerStep, "__call__", step)
    monkeypatch.setattr(step_module, "grpo_loss", spy)
    return steps


@pytest.mark.parametrize("num_iterations,steps_per_generation", [(1, 4), (4, 2)])
def test_first_update_of_each_rollout_has_ratio_exactly_one(tmp_path, monkeypatch, tokenizer, make_model, prompts, num_iterations, steps_per_generation):
    # GA = 2 micro-batches per step, so a rollout of `steps_per_generation` micro-batches feeds
    # μ × steps_per_generation / 2 optimizer steps; the first of them sees the generating policy.
    calls = record_losses(monkeypatch)
    args = config(tmp_path, num_iterations=num_iterations, steps_per_generation=steps_per_generation, max_steps=2 * args_steps(num_iterations, steps_per_generation))
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    trainer.train()
    per_rollout = args.steps_per_rollout
    metrics = read_metrics(args.output_dir)
    for record in metrics:
        first_of_rollout = (record["step"] - 1) % per_rollout == 0
        if first_of_rollout:
            assert record["kl_old"] == 0.0 and record["clip_ratio/region_mean"] == 0.0 and record["clip_ratio/low_mean"] == 0.0
    # The passes of each rollout's first step: log π_θ == log π_old bit for bit (ρ = 1).
    assert len(calls) == 2 * per_rollout
    for r in range(2):
        assert calls[r * per_rollout] and all(torch.equal(logps, old) for logps, old, _ in calls[r * per_rollout])
    # Later steps of a reused rollout see a moved policy: some ratio differs from 1.
    if num_iterations > 1:
        assert any(not torch.equal(lp, old) for step in calls[1:per_rollout] for lp, old, _ in step)
        assert any(record["kl_old"] > 0 for record in metrics)


def args_steps(num_iterations, steps_per_generation, GA=2):
    return num_iterations * steps_per_generation // GA


def test_first_step_loss_is_identical_for_mu_1_and_mu_4(tmp_path, monkeypatch, tokenizer, make_model, prompts):
    losses = {}
    for mu in (1, 4):
        # A context of its own per run: monkeypatch.undo() would also undo conftest's fp32 pin, and the
        # second run would train in bf16 on a CPU with bf16 units.
        with monkeypatch.context() as patch:
            calls = record_losses(patch)
            args = config(tmp_path / f"mu{mu}", num_iterations=mu, max_steps=1)
            GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer).train()
            losses[mu] = torch.stack([loss for _, _, loss in calls[0]])
    assert torch.equal(losses[1], losses[4])


def test_each_rollout_is_used_mu_times_steps_per_pass(tmp_path, tokenizer, make_model, prompts):
    # μ = 3 passes; a rollout of 4 micro-batches with GA = 2 gives 2 steps per pass: 6 steps per rollout.
    args = config(tmp_path, num_iterations=3, steps_per_generation=4, max_steps=12)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    generate_calls, steps_per_rollout = [], {}
    real_generate, real_step = trainer.backend.sample, trainer._optimizer_step

    def counting_generate(*a, **k):
        generate_calls.append(1)
        return real_generate(*a, **k)

    def counting_step(rollout, *a, **k):  # a rollout's tensors stay the same objects while π_old is recorded on it
        key = id(rollout.completion_ids)
        steps_per_rollout[key] = steps_per_rollout.get(key, 0) + 1
        return real_step(rollout, *a, **k)

    trainer.backend.sample, trainer._optimizer_step = counting_generate, counting_step
    trainer.train()
    assert len(generate_calls) == 2  # 12 steps / 6 per rollout
    assert sorted(steps_per_rollout.values()) == [6, 6]


@pytest.mark.parametrize("num_iterations,steps_per_generation,expected_passes_per_rollout", [
    (1, 2, 2),  # μ=1, one step per rollout: the 2 training micro-batches only, π_old = π_θ detached
    (1, 4, 4 + 2),  # two steps per rollout: micro-batches 3–4 need π_old before step 1 updates the policy
    (2, 2, 2 * 2),  # μ=2, one step per pass: step 1 captures π_old for free, no extra pass
])
@pytest.mark.parametrize("budget,micro_batches_per_pass", [(0, 1), (None, 2)])  # the default budget merges a step's 2 micro-batches
def test_old_logps_passes_only_where_needed(tmp_path, tokenizer, make_model, prompts, num_iterations, steps_per_generation,
                                            expected_passes_per_rollout, budget, micro_batches_per_pass):
    args = config(tmp_path, num_iterations=num_iterations, steps_per_generation=steps_per_generation, update_token_budget=budget)
    args.max_steps = args.steps_per_rollout  # one rollout
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    passes = []
    real = trainer.log_probs
    trainer.passes.log_probs = trainer.update.log_probs = lambda model, mb, *ref: passes.append(1) or real(model, mb, *ref)
    trainer.train()
    assert len(passes) == expected_passes_per_rollout // micro_batches_per_pass  # π_old's passes are the update's


def test_resume_reproduces_the_uninterrupted_run(tmp_path, tokenizer, make_model, prompts):
    # μ = 2 and 2 steps per pass: 4 steps per rollout. A checkpoint at step 3 sits inside the
    # first rollout's reuse window (it carries the rollout); step 5 generates the second rollout.
    common = dict(num_iterations=2, steps_per_generation=4, max_steps=6, save_steps=3)
    full = config(tmp_path / "full", **common)
    GRPOTrainer(make_model(), reward_even_tokens, args=full, train_dataset=prompts, processing_class=tokenizer).train()
    reference = {r["step"]: r for r in read_metrics(full.output_dir)}

    resumed = config(tmp_path / "full", **common)  # same output_dir: resume_from_checkpoint path below
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=resumed, train_dataset=prompts, processing_class=tokenizer)
    os.rename(os.path.join(full.output_dir, "metrics.jsonl"), os.path.join(full.output_dir, "metrics-full.jsonl"))
    output = trainer.train(resume_from_checkpoint=os.path.join(full.output_dir, "checkpoint-3"))
    assert output.global_step == 6
    after = {r["step"]: r for r in read_metrics(full.output_dir)}
    assert sorted(after) == [4, 5, 6]
    for step in (4, 5, 6):
        assert after[step]["loss"] == pytest.approx(reference[step]["loss"], rel=1e-5, abs=1e-7)
    assert after[5]["reward"] == pytest.approx(reference[5]["reward"])  # same regenerated rollout


def test_checkpoints_are_complete_and_pruned(tmp_path, tokenizer, make_model, prompts):
    args = config(tmp_path, max_steps=4, save_steps=1, save_total_limit=2)
    GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer).train()
    names = sorted(n for n in os.listdir(args.output_dir) if n.startswith("checkpoint-") or n.startswith(".tmp"))
    assert names == ["checkpoint-3", "checkpoint-4"]
    for f in ("model.safetensors", "config.json", "tokenizer.json", "trainer_state.pt", "rng_state_0.pt"):
        assert os.path.exists(os.path.join(args.output_dir, "checkpoint-4", f))


def test_metrics_and_completions_are_logged(tmp_path, tokenizer, make_model, prompts):
    args = config(tmp_path, max_steps=2, log_completions=True, num_completions_to_print=2)
    GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer).train()
    records = read_metrics(args.output_dir)
    assert [r["step"] for r in records] == [1, 2]
    for key in ("loss", "reward", "reward_std", "rewards/reward_even_tokens/mean", "rewards/reward_even_tokens/std", "completions/mean_length",
                "completions/min_length", "completions/max_length", "completions/clipped_ratio", "completions/mean_terminated_length",
                "completions/min_terminated_length", "completions/max_terminated_length", "kl_old", "clip_ratio/low_mean",
                "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max", "entropy",
                "grad_norm", "learning_rate", "seconds/generate", "seconds/update", "generation_tokens_per_second"):
        assert key in records[0], key
    with open(os.path.join(args.output_dir, "completions.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 2 * args.generation_batch_size  # every completion of both rollouts
    assert set(rows[0]) == {"step", "prompt", "completion", "rewards", "advantage"}


def test_a_window_whose_every_token_is_masked_logs_trls_loss_keys(tmp_path, tokenizer, make_model, prompts):
    # TRL's DAPO snippet (paper_index.md: mask_truncated_completions=True) with completions that all hit
    # max_completion_length: no token carries the loss. TRL still logs its global_masked_mean keys, 0 (the count is
    # clamped at 1), and None for clip_ratio/low_min and /high_max (nanmin / nanmax of no sequence); fastgrpo left
    # entropy and the clip means out and logged 0 for the extremes. Evaluation logs them the same way.
    args = config(tmp_path, max_steps=1, loss_type="dapo", epsilon_high=0.28, mask_truncated_completions=True,
                  gradient_accumulation_steps=1, per_device_eval_batch_size=4)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer)
    trainer.train()
    record = read_metrics(args.output_dir)[0]
    assert record["completions/clipped_ratio"] == 1.0  # a random model never sampled EOS in 8 tokens
    assert {k: record[k] for k in ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")} == dict.fromkeys(
        ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"), 0.0)
    assert record["clip_ratio/low_min"] is None and record["clip_ratio/high_max"] is None
    metrics = trainer.evaluate(prompts.select(range(1)))
    assert metrics["eval_completions/clipped_ratio"] == 1.0 and metrics["eval_entropy"] == 0.0
    assert metrics["eval_clip_ratio/low_min"] is None and metrics["eval_clip_ratio/high_max"] is None


def test_tiny_model_raises_a_learnable_reward(tmp_path, tokenizer, make_model, prompts):
    # The even-token reward starts at ≈ 0.5 with real spread inside each group; GRPO with μ = 2
    # reuse must push it up clearly within 24 steps of a 3 M-parameter model. Sampling from the
    # top 20 tokens keeps a random model's choices few enough for 24 steps to reshape (from the
    # full 49 152-token distribution each token is seen too rarely to learn which ids pay).
    args = config(tmp_path, num_iterations=2, per_device_train_batch_size=8, gradient_accumulation_steps=1,
                  num_generations=8, steps_per_generation=2, max_steps=24, learning_rate=3e-3, logging_steps=4, top_k=20)
    GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer).train()
    rewards = [r["reward"] for r in read_metrics(args.output_dir) if "reward" in r]  # one rollout per record
    first, last = rewards[0], sum(rewards[-2:]) / 2  # the untrained model's rollout vs the last two
    assert first < 0.65 and last > first + 0.2, rewards


@pytest.mark.parametrize("extra", [
    {}, {"scale_rewards": "batch"}, {"scale_rewards": "none"}, {"multi_objective_aggregation": "normalize_then_sum"},
    {"num_iterations": 2, "steps_per_generation": 4, "target_kl": 0.01}, {"loss_type": "vespo"}, {"loss_type": "cispo"},
    {"top_entropy_quantile": 0.5}, {"off_policy_mask_threshold": 0.5}, {"mask_truncated_completions": True},
    {"importance_sampling_level": "sequence", "loss_type": "grpo"},
])
def test_constant_reward_gives_zero_loss_and_no_update(tmp_path, tokenizer, make_model, prompts, extra):
    # Equal rewards in every group (a solved task: issue 30, kind 6): Â = 0 exactly, so the loss and the gradient are
    # exactly 0 with every advantage scaling, loss and mask, and nothing divides by the zero std.
    args = config(tmp_path, max_steps=2, **extra)
    model = make_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = GRPOTrainer(model, lambda completions, **k: [0.35] * len(completions), args=args, train_dataset=prompts, processing_class=tokenizer)
    trainer.train()
    assert all(r["loss"] == 0.0 for r in read_metrics(args.output_dir))
    after = trainer.accelerator.unwrap_model(trainer.model).state_dict()
    assert all(torch.equal(before[k], after[k].cpu()) for k in before)


def test_bad_inputs_are_refused_before_any_compute(tmp_path, tokenizer, make_model, prompts):
    args = config(tmp_path)
    with pytest.raises(ValueError, match="'prompt' column"):
        GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts.rename_column("prompt", "question"), processing_class=tokenizer)
    with pytest.raises(ValueError, match="reward_weights has 2 values for 1"):
        GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, reward_weights=[1.0, 2.0]), train_dataset=prompts, processing_class=tokenizer)
    with pytest.raises(ValueError, match="unknown"):
        GRPOTrainer(make_model(), "no_such_reward", args=args, train_dataset=prompts, processing_class=tokenizer)
    with pytest.raises(ValueError, match="resume_from_checkpoint=True"):
        GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer).train(resume_from_checkpoint=True)


@pytest.mark.parametrize("loss_type,extra", [
    ("grpo", {}), ("bnpo", {}), ("dr_grpo", {"scale_rewards": "none"}), ("cispo", {}), ("sapo", {}),
    ("dapo", {"importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4}),
    ("dapo", {"beta": 0.04}), ("dapo", {"beta": 0.04, "kl_estimator": "full", "sync_ref_model": True, "ref_model_sync_steps": 1}),
    ("dapo", {"scale_rewards": "batch", "mask_truncated_completions": True, "top_entropy_quantile": 0.2, "delta": 1.5}),
    ("dapo", {"multi_objective_aggregation": "normalize_then_sum", "target_kl": 1e-9, "num_iterations": 4}),
])
def test_every_variant_trains(tmp_path, tokenizer, make_model, prompts, loss_type, extra):
    args = config(tmp_path, loss_type=loss_type, max_steps=2, num_iterations=extra.pop("num_iterations", 2), **extra)
    output = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer).train()
    assert output.global_step == 2
    records = read_metrics(args.output_dir)
    assert all(r["loss"] == r["loss"] for r in records)  # finite, not NaN
    if args.beta > 0:
        assert records[0]["kl"] == 0.0  # π_θ = π_ref before the first update
    if args.target_kl is not None:
        assert records[-1]["target_kl_stops"] >= 1  # KL > 1e-9 after one update: the rollout is dropped


def test_eval_and_tensorboard(tmp_path, tokenizer, make_model, prompts, capsys):
    args = config(tmp_path, max_steps=2, eval_strategy="steps", eval_steps=2, report_to="tensorboard")
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, eval_dataset=prompts.select(range(3)), processing_class=tokenizer)
    trainer.train()
    evals = [r for r in read_metrics(args.output_dir) if "eval_reward" in r]
    assert len(evals) == 1 and 0.0 <= evals[0]["eval_reward"] <= 1.0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step     2") and "eval_reward" in line]
    assert printed == [f"step     2  eval_loss {evals[0]['eval_loss']:.4g}  eval_reward {evals[0]['eval_reward']:.4g}"]  # it printed "step 2" alone
    assert evals[0]["eval_rewards/reward_even_tokens/mean"] == evals[0]["eval_reward"]  # one reward, weight 1
    events = [f for _, _, files in os.walk(args.output_dir) for f in files if f.startswith("events.out.tfevents")]
    assert events, "report_to='tensorboard' wrote no event file"


def test_trl_settings_fastgrpo_accepts_as_trl_does(tmp_path, tokenizer, make_model, prompts):
    """Issue 30, kind 10: use_liger_kernel=True (fastgrpo's head is always chunked), generation_kwargs do_sample=True,
    a sequence-level ratio with cispo/sapo/vespo (TRL's warnings, not errors), trainer.entropy_coef as TRL exposes it."""
    import warnings as w

    assert config(tmp_path, use_liger_kernel=True).use_liger_kernel is True
    assert config(tmp_path, generation_kwargs={"do_sample": True, "top_k": 5}).top_k == 5
    with pytest.raises(ValueError, match="do_sample'\\]=False"):
        config(tmp_path, generation_kwargs={"do_sample": False})
    for loss_type, warns in (("cispo", "sums per-token"), ("vespo", "VESPO computes sequence-level"), ("sapo", None)):
        with w.catch_warnings(record=True) as caught:
            w.simplefilter("always")
            config(tmp_path, loss_type=loss_type, importance_sampling_level="sequence")
        assert any(warns in str(c.message) for c in caught) if warns else not caught, loss_type
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, entropy_coef=0.05, max_steps=1),
                          train_dataset=prompts, processing_class=tokenizer)
    assert trainer.entropy_coef == 0.05
    plain = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, max_steps=1), train_dataset=prompts, processing_class=tokenizer)
    assert plain.entropy_coef == 0.0


def test_resume_after_the_run_folder_moved_keeps_its_logs(tmp_path, tokenizer, make_model, prompts):
    # A checkpoint records each log's size by file name, so a moved folder resumes with its first steps' records
    # kept (issue 30: absolute paths cut metrics.jsonl to empty) and the later ones logged once more.
    args = config(tmp_path / "a", max_steps=4, save_steps=2)
    GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer).train()
    reference = {r["step"]: r for r in read_metrics(args.output_dir)}
    os.rename(tmp_path / "a", tmp_path / "b")
    moved = config(tmp_path / "b", max_steps=4, save_steps=2)
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=moved, train_dataset=prompts, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=os.path.join(moved.output_dir, "checkpoint-2"))
    after = read_metrics(moved.output_dir)
    assert [r["step"] for r in after] == [1, 2, 3, 4]
    assert after[0] == reference[1] and after[1] == reference[2]  # kept as written
    assert after[3]["loss"] == pytest.approx(reference[4]["loss"], rel=1e-5, abs=1e-7)


def test_log_sizes_of_older_checkpoints_are_read_by_file_name(tmp_path):
    # Checkpoints before issue 30 keyed the sizes by absolute path: a folder moved since still cuts each log right.
    from rich.console import Console

    from fastgrpo.run.metrics import MetricsLog

    log = MetricsLog(str(tmp_path), Console())
    with open(log.metrics_path, "w") as f:
        f.write('{"step": 1}\n{"step": 2}\n')
    with open(log.completions_path, "w") as f:
        f.write("x" * 10)
    log.cut_back(1, {"/elsewhere/run/metrics.jsonl": len('{"step": 1}\n'), "/elsewhere/run/completions.jsonl": 4})
    assert open(log.metrics_path).read() == '{"step": 1}\n' and os.path.getsize(log.completions_path) == 4
    assert log.sizes() == {"metrics.jsonl": 12, "completions.jsonl": 4}


def test_each_log_prints_one_table_of_num_completions_to_print_and_writes_every_completion(tmp_path, tokenizer, make_model, prompts, capsys):
    # Two rollouts per log step (one optimizer step each, logging_steps=2): each used to print its own table.
    args = config(tmp_path, max_steps=2, gradient_accumulation_steps=1, logging_steps=2, log_completions=True, num_completions_to_print=2)
    GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer).train()
    out = capsys.readouterr().out
    assert out.count(" Step 2 ") == 2  # TRL's panel at each log() call: the step's, and train()'s summary's (the same rows)
    with open(os.path.join(args.output_dir, "completions.jsonl")) as f:
        assert len(f.readlines()) == 2 * args.generation_batch_size  # both rollouts' completions, every one


def test_train_returns_trainers_summary_metrics_as_trl(tmp_path, tokenizer, make_model, prompts):
    out = GRPOTrainer(make_model(), reward_even_tokens, args=config(tmp_path, max_steps=2, logging_steps=2), train_dataset=prompts,
                      processing_class=tokenizer).train()
    m = out.metrics  # a TRL script's `trainer.train().metrics["train_runtime"]` works; with every step logged, only Trainer's keys (TRL's)
    assert m["train_loss"] == out.training_loss and m["train_runtime"] > 0 and m["epoch"] > 0
    assert m["train_steps_per_second"] == pytest.approx(2 / m["train_runtime"], rel=1e-3, abs=2e-3) and "reward" not in m  # both rounded
    assert m["train_samples_per_second"] == pytest.approx(2 * 4 * 2 / m["train_runtime"], rel=1e-3, abs=2e-3)  # steps × 4 × GA 2



def test_grad_norm_is_the_logged_steps_as_trainer_logs_it(tmp_path, tokenizer, make_model, prompts, monkeypatch):
    # transformers' Trainer logs the gradient norm of the step it logs at (TRL's `grad_norm`); fastgrpo logged the mean
    # over the window's steps, so with logging_steps=2 a dashboard saw a 2-step average, spikes halved.
    norms, real = [], step_module.OptimizerStep.__call__

    def spy(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        norms.append(float(out.grad_norm))
        return out

    monkeypatch.setattr(step_module.OptimizerStep, "__call__", spy)
    args = config(tmp_path, max_steps=4, logging_steps=2)
    GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=prompts, processing_class=tokenizer).train()
    assert len(norms) == 4 and norms[0] != pytest.approx(norms[1]) and norms[2] != pytest.approx(norms[3])
    assert [(r["step"], r["grad_norm"]) for r in read_metrics(args.output_dir)] == [(2, pytest.approx(norms[1])), (4, pytest.approx(norms[3]))]
