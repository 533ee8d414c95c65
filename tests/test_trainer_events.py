"""Every transformers Trainer event, in Trainer's order: the same callback on transformers' own `Trainer`
(a 4-parameter regression, the same epochs, accumulation and schedule) and on GRPOTrainer sees the same
events at the same global steps, from on_init_end to on_train_end."""

import warnings

import pytest
import torch
from datasets import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from fastgrpo import GRPOConfig, GRPOTrainer

EVENTS = [
    "on_init_end", "on_train_begin", "on_epoch_begin", "on_step_begin", "on_substep_end", "on_pre_optimizer_step",
    "on_optimizer_step", "on_step_end", "on_epoch_end", "on_log", "on_evaluate", "on_prediction_step", "on_save", "on_train_end",
]


class Recorder(TrainerCallback):
    """(event, state.global_step) for every event transformers defines that training reaches."""

    def __init__(self):
        self.seen = []
        for name in EVENTS:
            setattr(self, name, lambda args, state, control, _name=name, **kw: self.seen.append((_name, state.global_step)))


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, x, labels):
        return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}


def transformers_events(tmp_path, steps_per_epoch, accumulation, extra=(), eval_names=None, **schedule):
    """`eval_names`: a dict eval_dataset of one row per name; default: one eval set of one row."""
    rows = [{"x": [float(i), 1.0], "labels": float(i)} for i in range(steps_per_epoch * accumulation)]
    eval_rows = Dataset.from_list(rows[:1])
    rec = Recorder()
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=1, per_device_eval_batch_size=1, gradient_accumulation_steps=accumulation,
        use_cpu=True, report_to=[], disable_tqdm=True, save_only_model=True, **schedule,
    )
    eval_dataset = eval_rows if eval_names is None else {name: eval_rows for name in eval_names}
    trainer = Trainer(Regression(), args, train_dataset=Dataset.from_list(rows), eval_dataset=eval_dataset, callbacks=[rec, *extra])
    trainer.train()
    return rec.seen


def fastgrpo_events(tmp_path, tokenizer, model, prompts, steps_per_epoch, accumulation, extra=(), eval_names=None, **schedule):
    # One prompt's G = 2 completions per micro-batch, `accumulation` micro-batches per step, one step per rollout:
    # `steps_per_epoch` rollouts make a pass over steps_per_epoch · accumulation prompts.
    rec = Recorder()
    args = GRPOConfig(
        output_dir=str(tmp_path / "fg"), per_device_train_batch_size=2, per_device_eval_batch_size=2, num_generations=2,
        gradient_accumulation_steps=accumulation, max_prompt_length=32, max_completion_length=2, disable_tqdm=True, report_to="none", **schedule,
    )
    trainer = GRPOTrainer(
        model, lambda completion_ids, **kw: [float(len(c)) for c in completion_ids], args=args,
        train_dataset=prompts.select(range(steps_per_epoch * accumulation)),
        eval_dataset=prompts.select(range(1)) if eval_names is None else {name: prompts.select(range(1)) for name in eval_names},
        processing_class=tokenizer, callbacks=[rec, *extra],
    )
    trainer.train()
    return rec.seen


@pytest.mark.parametrize(
    "steps_per_epoch, accumulation, schedule",
    [
        # 5 steps over epochs of 2: the last epoch is partial; evaluate every 2 steps and at the end; save at each epoch's end
        (2, 2, dict(max_steps=5, logging_steps=1, eval_strategy="steps", eval_steps=2, save_strategy="epoch")),
        # evaluation before training and at each epoch's end, save every 3 steps and at the end, no accumulation
        (3, 1, dict(max_steps=4, logging_steps=2, eval_on_start=True, eval_strategy="epoch", save_strategy="steps", save_steps=3)),
        # three micro-batches a step, whole epochs (num_train_epochs), log first step, never save
        (1, 3, dict(num_train_epochs=2, logging_steps=1, logging_first_step=True, save_strategy="no")),
        # a log at each epoch's end (the last, partial one too); evaluate every step from step 3 on
        (2, 1, dict(max_steps=5, logging_strategy="epoch", eval_strategy="steps", eval_steps=1, eval_delay=3, save_strategy="no")),
        # no logs but the first step's and the summary; evaluate and save at each epoch's end, evaluations from epoch 2 on
        (3, 1, dict(max_steps=7, logging_strategy="no", logging_first_step=True, eval_strategy="epoch", eval_delay=2, save_strategy="epoch")),
        # the best checkpoint loaded at the end (after the summary's on_log, before on_train_end): no event of its own
        (2, 1, dict(max_steps=4, logging_steps=1, eval_strategy="steps", eval_steps=1, save_steps=2, save_total_limit=1,
                    load_best_model_at_end=True)),
    ],
)
def test_events_match_transformers_trainer(tmp_path, tokenizer, make_model, prompts, steps_per_epoch, accumulation, schedule):
    want = transformers_events(tmp_path, steps_per_epoch, accumulation, **schedule)
    got = fastgrpo_events(tmp_path, tokenizer, make_model(), prompts, steps_per_epoch, accumulation, **schedule)
    assert {name for name, _ in want} >= {"on_epoch_begin", "on_epoch_end", "on_pre_optimizer_step", "on_optimizer_step"}
    assert got == want


def test_a_dict_eval_set_gives_trainers_events_set_by_set(tmp_path, tokenizer, make_model, prompts):
    """A dict eval_dataset was one evaluation here (one on_log, one on_evaluate for all sets); Trainer's evaluate
    recurses per set: each set's on_prediction_step, on_log and on_evaluate in turn, at eval_on_start and each evaluation."""
    schedule = dict(max_steps=2, logging_steps=1, eval_on_start=True, eval_strategy="steps", eval_steps=2, save_strategy="no")
    want = transformers_events(tmp_path, 2, 1, eval_names=["a", "b"], **schedule)
    got = fastgrpo_events(tmp_path, tokenizer, make_model(), prompts, 2, 1, eval_names=["a", "b"], **schedule)
    assert [name for name, _ in want].count("on_evaluate") == 4
    assert got == want


class EndsEpoch(TrainerCallback):
    """Sets control.should_epoch_stop at on_step_end of the given global steps (the epoch ends there, in Trainer)."""

    def __init__(self, steps):
        self.steps = steps

    def on_step_end(self, args, state, control, **kwargs):
        control.should_epoch_stop = control.should_epoch_stop or state.global_step in self.steps


@pytest.mark.parametrize(
    "steps_per_epoch, accumulation, cut_at, schedule",
    [
        # epochs of 3 steps, the first cut after 1: Trainer's loop of ⌈5 / 3⌉ = 2 epochs ends at step 4, not max_steps 5
        (3, 1, {1}, dict(max_steps=5, logging_steps=1, eval_strategy="epoch", save_strategy="no")),
        # num_train_epochs=2 of 2 steps of 2 micro-batches, the second epoch cut after its first step; a log and a save per epoch
        (2, 2, {3}, dict(num_train_epochs=2, logging_strategy="epoch", save_strategy="epoch")),
        # a cut at an epoch's last step is that epoch's end, no more; the next epoch cut too, evaluations every 2 steps
        (2, 1, {2, 3}, dict(max_steps=6, logging_steps=1, eval_strategy="steps", eval_steps=2, save_strategy="no")),
    ],
)
def test_a_callbacks_should_epoch_stop_ends_the_epoch_where_trainer_ends_it(tmp_path, tokenizer, make_model, prompts, steps_per_epoch,
                                                                             accumulation, cut_at, schedule):
    """control.should_epoch_stop (set by a callback) was ignored: the epoch ran on to its end. Trainer leaves the
    epoch after that step's log/evaluate/save, runs on_epoch_end and its schedule, starts the next epoch, and stops
    after its num_train_epochs epochs."""
    want = transformers_events(tmp_path, steps_per_epoch, accumulation, extra=[EndsEpoch(cut_at)], **schedule)
    got = fastgrpo_events(tmp_path, tokenizer, make_model(), prompts, steps_per_epoch, accumulation, extra=[EndsEpoch(cut_at)], **schedule)
    assert got == want


def test_a_pass_cut_short_skips_its_rest_and_the_next_rollout_starts_the_next_pass(tmp_path, tokenizer, make_model, prompts):
    """3 prompts in order, one a rollout of one step; a callback ends the epoch after step 1: steps 2–4 sample the
    next pass (0, 1, 2), and state.epoch reads as Trainer's, epoch + steps into it / 3: 1/3, then 1 + 1/3, 1 + 2/3, 2."""
    sampled = []

    def reward(completions, n, **kwargs):
        sampled.append(n[0])
        return [0.0] * len(completions)

    args = GRPOConfig(output_dir=str(tmp_path / "fg"), per_device_train_batch_size=2, num_generations=2, max_completion_length=2,
                      max_steps=5, logging_steps=1, save_strategy="no", shuffle_dataset=False, disable_tqdm=True, report_to="none")
    trainer = GRPOTrainer(make_model(), reward, args=args, train_dataset=prompts.select(range(3)), processing_class=tokenizer,
                          callbacks=[EndsEpoch({1})])
    assert trainer.train().global_step == 4  # Trainer's ⌈5 / 3⌉ = 2 epochs
    assert sampled == [0, 0, 1, 2]
    epochs = [r["epoch"] for r in trainer.state.log_history if "loss" in r]
    assert epochs == pytest.approx([1 / 3, 4 / 3, 5 / 3, 2.0])


def kinds(history):
    """(step, what) of each logged record: a training log, an evaluation, or train()'s summary."""
    return [(r["step"], "summary" if "train_runtime" in r else "eval" if "eval_loss" in r else "train") for r in history]


def test_logs_and_evaluations_at_trl_grpo_trainers_steps(tmp_path, tokenizer, make_model, prompts):
    # TRL 1.16's own GRPOTrainer on the same tiny model and schedule: a log at each epoch's end (2 prompts, one a step:
    # epochs of 2 steps) and an evaluation every 2 steps from step 3 on, the end's summary; TRL's records hold other keys.
    trl = pytest.importorskip("trl")
    schedule = dict(max_steps=6, logging_strategy="epoch", eval_strategy="steps", eval_steps=2, eval_delay=3, save_strategy="no")
    common = dict(per_device_train_batch_size=4, per_device_eval_batch_size=4, num_generations=4, max_completion_length=2,
                  report_to="none", disable_tqdm=True, bf16=False, **schedule)
    reward = lambda completion_ids, **kw: [sum(t % 2 == 0 for t in ids) / len(ids) for ids in completion_ids]  # noqa: E731
    data = dict(train_dataset=prompts.select(range(2)), eval_dataset=prompts.select(range(1)), processing_class=tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's own warnings about this tiny setup
        theirs = trl.GRPOTrainer(model=make_model(), reward_funcs=reward, args=trl.GRPOConfig(str(tmp_path / "trl"), use_cpu=True, **common), **data)
        theirs.train()
    ours = GRPOTrainer(make_model(), reward, args=GRPOConfig(str(tmp_path / "fg"), **common), **data)
    ours.train()
    want = [(2, "train"), (4, "eval"), (4, "train"), (6, "eval"), (6, "train"), (6, "summary")]
    assert kinds(theirs.state.log_history) == want
    assert kinds(ours.state.log_history) == want


class Draws:
    """A rollout assembly that draws one prompt per rollout from `order`: each rollout is its list of prompt indices."""

    def __init__(self, order):
        self.order = order

    def __call__(self):
        return self.order.take(1), {}, {}

    def state_dict(self):
        return None

    def load_state_dict(self, state):
        pass


@pytest.mark.parametrize("max_staleness", [None, 0, 2])
def test_a_pass_cut_under_the_overlap_skips_the_rollouts_made_ahead_as_the_synchronous_loop(max_staleness):
    """should_epoch_stop under max_staleness (the producer thread makes rollouts ahead): a pass of 2 prompts in order, one a
    rollout, cut after step 1. The producer had made prompt 1 and the next pass's prompt 0 ahead, and its order stood at
    (1, 1): the cut trained both made-ahead rollouts, then moved the order to pass 2 (pass 1 skipped whole), and a
    checkpoint at the cut kept the order before it (a resume drew the skipped prompt 1). As the synchronous loop: the
    rollouts made ahead are dropped, the next ones are pass 1's 0 and 1; a checkpoint at the cut resumes at (1, 0);
    state.epoch 1.5 and 2.0 at steps 2 and 3."""
    import time  # noqa: PLC0415

    from fastgrpo.rollout.async_producer import InOrder, RolloutPipeline  # noqa: PLC0415
    from fastgrpo.run.datasets import PromptOrder  # noqa: PLC0415
    from fastgrpo.run.epochs import EpochClock  # noqa: PLC0415

    order = PromptOrder(2, 0, shuffle=False)
    if max_staleness is None:
        rollouts = InOrder(Draws(order), order)
    else:
        rollouts = RolloutPipeline(Draws(order), order, lambda: 0, max_staleness=max_staleness, inflight=3, heartbeat_stale_after_s=60)
    clock = EpochClock(2, 1, 100)
    try:
        first, _, _ = rollouts()
        clock.drew(rollouts.handed_order)
        deadline = time.monotonic() + 30
        while max_staleness and rollouts.ready.qsize() < max_staleness and time.monotonic() < deadline:
            time.sleep(0.01)
        assert clock.cut_pass(rollouts.next_pass(), 1)
        assert rollouts.handed_order == {"epoch": 1, "position": 0}  # what a checkpoint at the cut keeps
        drawn, epochs = [first], []
        for step in (2, 3):
            drawn.append(rollouts()[0])
            clock.drew(rollouts.handed_order)
            epochs.append(clock(step, 1))
    finally:
        if max_staleness is not None:
            rollouts.close()
    assert drawn == [[0], [0], [1]]
    assert epochs == [1.5, 2.0]


class StopsTraining(TrainerCallback):
    """Sets control.should_training_stop at every call of `event` (from the first on it stays set)."""

    def __init__(self, event):
        setattr(self, event, self.stop)

    def stop(self, args, state, control, **kwargs):
        control.should_training_stop = True


@pytest.mark.parametrize(
    "event, accumulation, schedule",
    [
        # a stop before any step: Trainer checks it after each micro-batch, so it trains one step (no accumulation) ...
        ("on_train_begin", 1, {}),
        ("on_epoch_begin", 1, {}),
        ("on_evaluate", 1, dict(eval_on_start=True)),
        # ... or one micro-batch and no step (two a step): on_substep_end, then the epoch's end, no on_step_end
        ("on_train_begin", 2, {}),
        # a stop in on_substep_end leaves the step after that micro-batch: no optimizer step, no on_step_end
        ("on_substep_end", 3, {}),
    ],
)
def test_a_stop_before_the_first_step_or_in_on_substep_end_stops_where_trainer_stops(tmp_path, tokenizer, make_model, prompts, event,
                                                                                       accumulation, schedule):
    """A stop set before any step trained no step here (and skipped on_epoch_end); Trainer trains until its check after
    the first micro-batch. A stop in on_substep_end finished the step here; Trainer leaves it unfinished."""
    schedule = dict(max_steps=4, logging_steps=1, save_strategy="no", **schedule)
    want = transformers_events(tmp_path, 2, accumulation, extra=[StopsTraining(event)], **schedule)
    got = fastgrpo_events(tmp_path, tokenizer, make_model(), prompts, 2, accumulation, extra=[StopsTraining(event)], **schedule)
    assert got == want


def test_a_stop_in_on_substep_end_takes_no_optimizer_step(tmp_path, tokenizer, make_model, prompts):
    """Two micro-batches a step, a stop at the first's on_substep_end: no optimizer step (Trainer leaves its loop before
    one), so global_step stays 0, the weights stay as they were and no gradient is left; the summary is the only log."""
    model = make_model()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    args = GRPOConfig(output_dir=str(tmp_path / "fg"), per_device_train_batch_size=2, num_generations=2, gradient_accumulation_steps=2,
                      max_completion_length=2, max_steps=3, logging_steps=1, save_strategy="no", disable_tqdm=True, report_to="none")
    trainer = GRPOTrainer(model, lambda completion_ids, **kw: [float(len(c)) for c in completion_ids], args=args,
                          train_dataset=prompts.select(range(4)), processing_class=tokenizer, callbacks=[StopsTraining("on_substep_end")])
    out = trainer.train()
    assert (out.global_step, out.training_loss, trainer.state.global_step) == (0, 0.0, 0)
    changed = [name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name]) or p.grad is not None]
    assert changed == []
    assert [("train_runtime" in r, r["step"]) for r in trainer.state.log_history] == [(True, 0)]


class EvaluatesAtStep(TrainerCallback):
    """Sets control.should_evaluate at on_step_end (the trainer has no eval set)."""

    def on_step_end(self, args, state, control, **kwargs):
        control.should_evaluate = True


def test_a_callbacks_should_evaluate_without_an_eval_set_raises_where_trainer_raises(tmp_path, tokenizer, make_model, prompts):
    """A callback's control.should_evaluate with no eval_dataset was skipped silently here; Trainer raises ValueError
    ("evaluation requires an eval_dataset") at step 1's evaluation, after that step's log. Now the same point, naming the fix."""
    rows = [{"x": [float(i), 1.0], "labels": float(i)} for i in range(4)]
    hf_args = TrainingArguments(output_dir=str(tmp_path / "hf"), per_device_train_batch_size=1, max_steps=3, logging_steps=1, use_cpu=True,
                                report_to=[], disable_tqdm=True, save_strategy="no")
    hf = Trainer(Regression(), hf_args, train_dataset=Dataset.from_list(rows), callbacks=[EvaluatesAtStep()])
    with pytest.raises(ValueError, match="evaluation requires an eval_dataset"):
        hf.train()
    args = GRPOConfig(output_dir=str(tmp_path / "fg"), per_device_train_batch_size=2, num_generations=2, max_completion_length=2, max_steps=3,
                      logging_steps=1, save_strategy="no", disable_tqdm=True, report_to="none")
    trainer = GRPOTrainer(make_model(), lambda completion_ids, **kw: [float(len(c)) for c in completion_ids], args=args,
                          train_dataset=prompts.select(range(4)), processing_class=tokenizer, callbacks=[EvaluatesAtStep()])
    with pytest.raises(ValueError, match=r"evaluation requires an eval_dataset \(a callback's control.should_evaluate in train\(\) too.*"
                                         r"set trainer.eval_dataset = rows"):
        trainer.train()
    assert [r["step"] for r in hf.state.log_history] == [r["step"] for r in trainer.state.log_history] == [1]  # step 1's log, then the error
    assert trainer.state.global_step == hf.state.global_step == 1


def test_steps_after_a_transformers_trainer_left_between_micro_batches_update_the_weights(tmp_path, tokenizer, make_model, prompts):
    """accelerate's GradientState is one per process, and its optimizer wrapper steps and zeroes only while
    sync_gradients is True. A transformers Trainer that left its loop between micro-batches (a stop in on_substep_end,
    an error) leaves it False: a GRPOTrainer built after it in the same process (a notebook) took no optimizer step and
    kept every gradient, silently. Each optimizer step now sets it."""
    rows = [{"x": [float(i), 1.0], "labels": float(i)} for i in range(4)]
    hf_args = TrainingArguments(output_dir=str(tmp_path / "hf"), per_device_train_batch_size=1, gradient_accumulation_steps=2, max_steps=2,
                                use_cpu=True, report_to=[], disable_tqdm=True, save_strategy="no")
    Trainer(Regression(), hf_args, train_dataset=Dataset.from_list(rows), callbacks=[StopsTraining("on_substep_end")]).train()
    model = make_model()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    args = GRPOConfig(output_dir=str(tmp_path / "fg"), per_device_train_batch_size=2, num_generations=2, max_completion_length=2, max_steps=1,
                      learning_rate=1e-2, save_strategy="no", disable_tqdm=True, report_to="none")
    reward = lambda completion_ids, **kw: [float(i) for i in range(len(completion_ids))]  # noqa: E731  (Â ≠ 0 in every group)
    trainer = GRPOTrainer(model, reward, args=args, train_dataset=prompts.select(range(4)), processing_class=tokenizer)
    assert trainer.train().global_step == 1
    assert [name for name, p in trainer.model.named_parameters() if torch.equal(p, before[name])] == []  # every weight moved
    assert all(p.grad is None for p in trainer.model.parameters())


def test_a_stop_before_the_first_step_of_a_resume_at_an_epochs_last_step_trains_one_step_as_trainer(tmp_path, tokenizer, make_model, prompts):
    """Epochs of 2 steps, checkpoint-2 at the first epoch's last step, resumed with a stop set in on_train_begin. Trainer
    trains step 3 (its check comes after a micro-batch); fastgrpo ended the pending epoch (its documented first event
    on such a resume), took the stop as the end of training there and trained nothing. Now it trains step 3 too."""
    rows = [{"x": [float(i), 1.0], "labels": float(i)} for i in range(2)]
    hf_args = TrainingArguments(output_dir=str(tmp_path / "hf"), per_device_train_batch_size=1, max_steps=4, logging_steps=1, use_cpu=True,
                                report_to=[], disable_tqdm=True, save_steps=2)
    Trainer(Regression(), hf_args, train_dataset=Dataset.from_list(rows)).train()
    hf_rec = Recorder()
    Trainer(Regression(), hf_args, train_dataset=Dataset.from_list(rows), callbacks=[hf_rec, StopsTraining("on_train_begin")]).train(
        resume_from_checkpoint=str(tmp_path / "hf" / "checkpoint-2"))
    args = GRPOConfig(output_dir=str(tmp_path / "fg"), per_device_train_batch_size=2, num_generations=2, max_completion_length=2, max_steps=4,
                      logging_steps=1, save_steps=2, disable_tqdm=True, report_to="none")
    reward = lambda completion_ids, **kw: [float(len(c)) for c in completion_ids]  # noqa: E731
    GRPOTrainer(make_model(), reward, args=args, train_dataset=prompts.select(range(2)), processing_class=tokenizer).train()
    rec = Recorder()
    trainer = GRPOTrainer(make_model(), reward, args=args, train_dataset=prompts.select(range(2)), processing_class=tokenizer,
                          callbacks=[rec, StopsTraining("on_train_begin")])
    assert trainer.train(resume_from_checkpoint=str(tmp_path / "fg" / "checkpoint-2")).global_step == 3
    assert rec.seen.pop(2) == ("on_epoch_end", 2)  # the resumed epoch's end, fastgrpo's first event here (docs/reliability.md)
    assert rec.seen == hf_rec.seen == [
        ("on_init_end", 0), ("on_train_begin", 2), ("on_epoch_begin", 2), ("on_step_begin", 2), ("on_pre_optimizer_step", 2),
        ("on_optimizer_step", 2), ("on_step_end", 3), ("on_log", 3), ("on_epoch_end", 3), ("on_log", 3), ("on_train_end", 3),
    ]
