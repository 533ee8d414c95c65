"""Reward calling: the TRL protocol, None handling, and clear errors naming the function."""

import asyncio
import decimal
import functools
import json
import math
import threading
import traceback

import numpy as np
import pytest
import torch

from fastgrpo.algo.advantages import weighted_rewards
from fastgrpo.rollout.rewards import RewardFunctionError, check_columns, resolve_reward, reward_names, score
from fastgrpo.tasks.rewards import brevity_reward, exact_reward, format_reward, reasoning_gym_reward, reward_len


def call(*funcs, n=3):
    return score(list(funcs), prompts=["p"] * n, completions=["a" * 90, "b" * 100, "c" * 110][:n], completion_ids=[[1]] * n)


def test_values_none_and_weighted_sum():
    def only_first(completions, **kw):
        return [1.0, None, None]

    table = call(reward_len, only_first)
    assert table[:, 0].tolist() == [-10.0, 0.0, -10.0]
    assert math.isnan(table[1, 1])
    assert weighted_rewards(table, torch.tensor([1.0, 2.0])).tolist() == [-8.0, 0.0, -10.0]  # None skipped


def test_wrong_count_names_the_function():
    def two_values(completions, **kw):
        return [1.0, 2.0]

    with pytest.raises(ValueError, match="'two_values' returned 2 values for 3 completions"):
        call(two_values)


def test_non_number_names_the_function_and_value():
    def stringy(completions, **kw):
        return [1.0, "0.5", 1.0]

    with pytest.raises(TypeError, match=r"'stringy' returned '0.5' \(str\) for completion 1"):
        call(stringy)


def test_values_trls_tensor_conversion_reads_are_numbers():
    # TRL stores a function's values with torch.tensor(values, dtype=float32): bools (`[answer in c for c in completions]`),
    # 0-d tensors and arrays (`list(scores)`), numpy scalars and Decimals are numbers there; they were refused here.
    def mixed(completions, **kw):
        return [True, torch.tensor(2.5), np.float32(0.25)]

    def more(completions, **kw):
        return [np.bool_(False), np.array(-1.5), decimal.Decimal("0.125")]

    assert call(mixed)[:, 0].tolist() == [1.0, 2.5, 0.25]
    assert call(more)[:, 0].tolist() == [0.0, -1.5, 0.125]


def test_rows_no_reward_applies_to_are_nan_with_one_warning(caplog):
    def never_second(completions, **kw):
        return [1.0, None, 2.0]

    with caplog.at_level("WARNING", logger="fastgrpo.rewards"):  # TRL's words through a logger, as TRL emits them
        table = call(never_second)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "All reward functions returned None for the following kwargs:" in caplog.text
    assert "1 of 3 completions got None from every reward function (never_second)" in caplog.text
    assert math.isnan(table[1, 0]) and table[[0, 2], 0].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, np.float32("nan")])
def test_non_finite_reward_is_refused_naming_function_value_and_row(bad):
    def blows_up(completions, **kw):
        return [1.0, 2.0, bad]

    with pytest.raises(ValueError, match=rf"'blows_up' returned {float(bad)} for completion 2; rewards must be finite"):
        call(blows_up)


def test_numpy_arrays_and_tensors_are_accepted_and_checked():
    as_numpy = lambda completions, **kw: np.array([1.0, 2.0, 3.0])  # noqa: E731
    as_tensor = lambda completions, **kw: torch.tensor([4, 5, 6])  # noqa: E731
    assert call(as_numpy, as_tensor).tolist() == [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]
    with pytest.raises(ValueError, match="returned 2 values for 3"):
        call(lambda completions, **kw: np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="returned inf for completion 0"):
        call(lambda completions, **kw: torch.tensor([math.inf, 1.0, 1.0]))
    with pytest.raises(TypeError, match=r"shape \(3, 1\)"):
        call(lambda completions, **kw: np.ones((3, 1)))


def test_values_from_any_ordered_iterable_as_trls_list_comprehension_reads_them():
    # TRL 1.16 reads a function's values with `[r if r is not None else nan for r in values]`: a generator, `map` or
    # pandas Series trained there and was refused here (break sweep); a dict or set it would read as keys or in hash order.
    import pandas as pd

    def lengths(completions, **kw):
        return (len(c) for c in completions)  # 90, 100, 110

    async def async_lengths(completions, **kw):
        return map(len, completions)

    as_series = lambda completions, **kw: pd.Series([None, 2.0, 3.0], dtype=object)  # noqa: E731
    table = call(lengths, async_lengths, as_series)
    assert table[:, :2].tolist() == [[90.0, 90.0], [100.0, 100.0], [110.0, 110.0]]
    assert math.isnan(table[0, 2]) and table[1:, 2].tolist() == [2.0, 3.0]
    for unordered in ({0: 1.0, 1: 2.0, 2: 3.0}, {1.0, 2.0, 3.0}, "123"):
        with pytest.raises(TypeError, match=rf"returned {type(unordered).__name__}; return a list of 3 floats"):
            call(lambda completions, **kw: unordered)


@pytest.mark.parametrize("source,error", [
    ("def r(prompts, completions, /, **kw): return [0.0] * len(completions)",
     r"'r' takes 'prompts', 'completions' positional-only \(before `/`\), but reward functions are called with keywords only"),
    ("def r(completions): return [0.0] * len(completions)",
     r"'r' has no \*\*kwargs, but every call on train_dataset also passes 'completion_ids', 'log_extra', 'log_metric', 'n', "
     r"'prompts', 'trainer_state' \(TRL's protocol.*add \*\*kwargs"),
    ("def r(*args): return [0.0] * 8", r"'r' has no \*\*kwargs, but every call on train_dataset also passes 'completion_ids', 'completions'"),
])
def test_a_reward_function_that_cannot_take_the_protocols_keywords_is_refused_when_built(tmp_path, tokenizer, make_model, prompts,
                                                                                          source, error):
    # TRL calls fn(prompts=…, completions=…, completion_ids=…, trainer_state=…, log_extra=…, log_metric=…, **columns): each of
    # these failed at the first scoring, after generation, with Python's "missing 2 required positional arguments" or
    # "got an unexpected keyword argument 'n'" (TRL 1.16 fails there too).
    from fastgrpo import GRPOConfig, GRPOTrainer

    scope = {}
    exec(source, scope)
    with pytest.raises(ValueError, match=error):
        GRPOTrainer(make_model(), scope["r"], args=GRPOConfig(output_dir=str(tmp_path)), train_dataset=prompts, processing_class=tokenizer)
    keywords = lambda prompts, completions, completion_ids, trainer_state, log_extra, log_metric, n: [0.0] * len(n)  # noqa: E731
    GRPOTrainer(make_model(), keywords, args=GRPOConfig(output_dir=str(tmp_path)), train_dataset=prompts, processing_class=tokenizer)


def test_with_a_rollout_func_a_reward_without_kwargs_is_refused_and_an_unknown_parameter_is_not(tmp_path, tokenizer, make_model, prompts):
    # A rollout_func's extra fields reach the rewards under names known only once it runs, so a parameter no column fills may be
    # one of them; but a function without **kwargs still meets prompts, trainer_state, … (the check was skipped whole).
    from fastgrpo import GRPOConfig, GRPOTrainer

    def build(reward):
        return GRPOTrainer(make_model(), reward, args=GRPOConfig(output_dir=str(tmp_path)), train_dataset=prompts,
                           processing_class=tokenizer, rollout_func=lambda prompts, trainer: {})

    def bare(completions):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"'bare' has no \*\*kwargs, but every call on train_dataset also passes 'completion_ids'"):
        build(bare)
    build(lambda completions, judge_score, **kw: judge_score)  # judge_score: a rollout_func field


def test_reward_weights_all_zero_are_refused_when_built(tmp_path, tokenizer, make_model, prompts):
    # Every Â = 0: loss and grad_norm were 0 at every step and the run learnt nothing (TRL trains on); one zero is fine.
    from fastgrpo import GRPOConfig, GRPOTrainer

    def build(weights):
        return GRPOTrainer(make_model(), [reward_len, brevity_reward], args=GRPOConfig(output_dir=str(tmp_path), reward_weights=weights),
                           train_dataset=prompts, processing_class=tokenizer)

    with pytest.raises(ValueError, match=r"reward_weights=\[0.0, 0\] are all 0: every advantage would be 0"):
        build([0.0, 0])
    assert build([0.0, -1.0]).reward_weights.tolist() == [0.0, -1.0]


def test_async_rewards_are_awaited_concurrently():
    # Each of the two async rewards waits for the other to have started: awaited one after the other, the first would wait
    # for the second forever (here: time out after 10 s). No wall-clock bound, so a busy machine cannot fail it.
    started: dict[str, asyncio.Event] = {}

    def waits_for(other: str, name: str, value: float):
        async def reward(completions, **kw):
            started.setdefault(name, asyncio.Event()).set()
            await asyncio.wait_for(started.setdefault(other, asyncio.Event()).wait(), timeout=10)
            return [value] * len(completions)
        return reward

    slow_one, slow_two = waits_for("two", "one", 1.0), waits_for("one", "two", 2.0)
    table = call(slow_one, reward_len, slow_two)
    assert table.tolist() == [[1.0, -10.0, 2.0], [1.0, 0.0, 2.0], [1.0, -10.0, 2.0]]

    async def from_a_running_loop():  # as in a notebook: score() is called while an event loop runs
        started.clear()  # events of this loop, not the scoring loop's above
        return call(slow_one, slow_two)

    assert asyncio.run(from_a_running_loop()).tolist() == [[1.0, 2.0]] * 3


def test_async_rewards_share_one_event_loop_across_rollouts_as_trls():
    """TRL awaits async reward functions on one loop for the trainer's life; a new loop per scoring (asyncio.run) made a judge's
    rate limiter made once (an asyncio.Semaphore) raise "… is bound to a different event loop" at the second rollout."""
    limit = asyncio.Semaphore(1)

    async def judged(completions, **kw):
        async with limit:
            await asyncio.sleep(0.01)
            return [1.0] * len(completions)

    async def also_judged(completions, **kw):
        return await judged(completions)

    assert [call(judged, also_judged).tolist() for _ in range(2)] == [[[1.0, 1.0]] * 3] * 2  # two contend for it each time


def test_an_async_reward_raising_systemexit_exits_as_a_sync_one_and_does_not_hang():
    """Raised out of a task on the shared loop, SystemExit stopped the loop's thread and scoring waited forever (TRL's too)."""
    async def leaves(completions, **kw):
        raise SystemExit(4)

    codes = []

    def score():
        try:
            call(leaves)
        except SystemExit as err:
            codes.append(err.code)

    worker = threading.Thread(target=score, daemon=True)
    worker.start()
    worker.join(60)
    assert codes == [4]
    assert call(reward_len).shape == (3, 1)  # the loop still runs


def test_errors_inside_a_reward_function_keep_their_traceback():
    def buggy(completions, **kw):
        return [1 / 0 for _ in completions]

    with pytest.raises(RewardFunctionError, match="'buggy' raised ZeroDivisionError") as info:
        call(buggy)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert "return [1 / 0" in "".join(traceback.format_exception(info.value))  # the user's own line is in the traceback
    with pytest.raises(ValueError, match="needs the dataset column 'entry'"):  # a built-in's own error stays one line
        call(reasoning_gym_reward)


def test_partial_rewards_get_distinct_names():
    def scaled(completions, factor, **kw):
        return [factor] * len(completions)

    funcs = [functools.partial(scaled, factor=1.0), functools.partial(scaled, factor=2.0), reward_len, reward_len]
    assert reward_names(funcs) == ["scaled", "scaled_2", "reward_len", "reward_len_2"]


def test_reserved_columns_are_refused_and_trainer_state_is_passed():
    with pytest.raises(ValueError, match="column named 'completions'"):
        check_columns([{"prompt": "p", "completions": "x"}])
    seen = []
    score([lambda completions, trainer_state, **kw: seen.append(trainer_state) or [0.0]], ["p"], ["c"], [[1]],
          reward_kwargs={"trainer_state": "STATE"})
    assert seen == ["STATE"]


def test_builtin_rewards():
    assert reward_len(["x" * 100, [{"role": "assistant", "content": "x" * 97}]]) == [0, -3]
    assert format_reward(["<answer>4</answer>", "so <answer>4</answer> ok", "4"]) == [1.0, 0.5, 0.0]
    assert brevity_reward([" 42 ", "x" * 150, "7"]) == [0.98, 0.0, 0.99]  # 1 − characters/100, stripped, floored
    assert brevity_reward(["", "  \n"]) == [0.0, 0.0]  # no answer is not a brief answer
    entry = json.dumps({"question": "Calculate 2 + 2.", "answer": "4", "metadata": {"source_dataset": "basic_arithmetic"}})
    # exact answer 1.0; tags win; "the answer is 4" holds "4" in 15 characters: 1/15 (reasoning-gym's partial credit)
    got = reasoning_gym_reward(["4", "<answer>4</answer>", "the answer is 4", "5"], entry=[entry] * 4)
    assert got == pytest.approx([1.0, 1.0, 1 / 15, 0.0])
    assert exact_reward(["4", "<answer>4</answer>", "the answer is 4", "5"], entry=[entry] * 4) == [1.0, 1.0, 0.0, 0.0]  # no partial credit
    with pytest.raises(ValueError, match="needs the dataset column 'entry'"):
        reasoning_gym_reward(["4"])


def test_resolve_reward():
    assert resolve_reward("length") is reward_len
    assert resolve_reward("fastgrpo.rewards:format_reward") is format_reward
    with pytest.raises(ValueError, match=r"unknown \(did you mean 'length'\?\); use one of length, format, brevity, reasoning_gym"):
        resolve_reward("lenght")
    with pytest.raises(ValueError, match="cannot import"):
        resolve_reward("fastgrpo.rewards:nope")
    with pytest.raises(ValueError, match=r"cannot import 'format_rewrd' from 'fastgrpo.rewards' .*; did you mean fastgrpo.rewards:format_reward\?"):
        resolve_reward("fastgrpo.rewards:format_rewrd")  # a typo of a function the module holds is named


def test_a_reward_class_given_for_its_instance_is_refused_naming_the_fix():
    # Break sweep: `reward_funcs=[Judge]` (no parentheses) passed the checks when its __init__ took **kwargs, then each call
    # built a Judge and the first scoring failed with "returned Judge".
    class Judge:
        def __init__(self, **options):
            self.options = options

        def __call__(self, completions, **kwargs):
            return [1.0] * len(completions)

    with pytest.raises(TypeError, match=r"reward_funcs entry Judge is a class; give an instance, Judge\(…\), whose __call__ scores"):
        resolve_reward(Judge)
    assert call(resolve_reward(Judge()))[:, 0].tolist() == [1.0, 1.0, 1.0]


def test_log_metric_takes_one_number_under_a_name_the_trainer_does_not_log():
    # Break sweep: log_metric("loss", 99.0) replaced the trainer's loss in metrics.jsonl, log_metric("reward", …) its reward
    # (TRL merges them too); log_metric("m", None) failed in float() naming neither the call nor the value.
    from fastgrpo.run.metrics import Window, window_record
    from fastgrpo.run.reward_hooks import RewardHooks

    window = Window()
    hooks = RewardHooks(lambda: window, lambda: None)
    hooks.log_metric("accuracy", 1.0)
    hooks.log_metric("accuracy", torch.tensor(0.5))  # a 0-d tensor is one number
    for name, value, error in ((3, 1.0, r"log_metric\(name=3, …\): give the metric's name as a string"),
                               ("m", None, r"log_metric\('m', None\): the value has type NoneType; give one number"),
                               ("m", [1.0, 2.0], r"the value has type list"), ("m", "0.5", r"the value has type str")):
        with pytest.raises(TypeError, match=error):
            hooks.log_metric(name, value)
    hooks.log_metric("accuracy", math.nan)  # left out of the mean, as TRL's log() drops NaN (it was a bare NaN in metrics.jsonl)
    hooks.log_metric("judge_failures", np.float64("nan"))
    sums = {**window.sums, "loss": 2.0, "steps": 1.0}
    record = window_record(1, sums, {}, {}, [])
    assert record["accuracy"] == 0.75 and record["judge_failures"] is None  # (1.0 + 0.5) / 2 calls; NaNs only: None, as TRL
    for taken in ("loss", "learning_rate"):  # one the record writes, one the trainer adds to it
        with pytest.raises(ValueError, match=rf"log_metric\('{taken}', …\), but '{taken}' is a metric fastgrpo logs itself .*'custom/{taken}'"):
            window_record(1, {**sums, f"{taken}/user_sum": 99.0, f"{taken}/user_count": 1.0}, {}, {}, [])


def test_log_metric_under_a_name_the_trainer_logs_is_refused_at_the_call(tmp_path, tokenizer, make_model, prompts):
    # Break sweep: log_metric("reward", …) was refused only when the window was logged, after the step's update had run
    # (up to logging_steps steps later); "reward" is in every training record, so the call itself is refused now.
    from fastgrpo import GRPOConfig, GRPOTrainer
    from fastgrpo.run.metrics import Window
    from fastgrpo.run.reward_hooks import RewardHooks

    def judge(completions, log_metric, **kwargs):
        log_metric("reward", 1.0)
        return [0.0] * len(completions)

    args = GRPOConfig(str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_completion_length=4, max_steps=1,
                      logging_steps=1, save_strategy="no", disable_tqdm=True, report_to="none")
    trainer = GRPOTrainer(make_model(), judge, args=args, train_dataset=prompts, processing_class=tokenizer)
    with pytest.raises(RewardFunctionError, match=r"'judge' raised ValueError: .*log_metric\('reward', …\), but 'reward' is a metric "
                                                  r"fastgrpo logs itself .*'custom/reward'") as caught:
        trainer.train()  # raised inside the reward function's call
    assert trainer.state.global_step == 0 and isinstance(caught.value.__cause__, ValueError)  # before any update
    # a name only the config's records hold (clip_ratio/*, kl with β > 0) is known at the call once a record had it
    window, last = Window(), {"step": 1, "clip_ratio/region_mean": 0.0}
    hooks = RewardHooks(lambda: window, lambda: None, lambda: {"loss", "rewards/judge/mean", *last})
    hooks.log_metric("accuracy", 1.0)
    last["accuracy"] = 1.0  # the next record holds it as its value: still the reward function's own name
    hooks.log_metric("accuracy", 0.5)
    for taken in ("loss", "rewards/judge/mean", "clip_ratio/region_mean"):
        with pytest.raises(ValueError, match=rf"log_metric\('{taken}', …\)"):
            hooks.log_metric(taken, 1.0)
    assert window.sums == {"accuracy/user_sum": 1.5, "accuracy/user_count": 2}  # nothing of the refused ones


def test_log_metric_during_an_evaluation_is_logged_as_its_eval_key(tmp_path, tokenizer, make_model, prompts):
    # TRL's eval mode logs a reward function's log_metric values in the evaluation's record, as eval_<name>; they went to
    # the training window instead (the next training record's mean mixed them in) and the evaluation had no such key.
    from fastgrpo import GRPOConfig, GRPOTrainer

    def counted(completions, log_metric, **kwargs):
        log_metric("custom/scored", float(len(completions)))  # 8 per training rollout, 4 per eval batch
        return [0.0] * len(completions)

    args = GRPOConfig(str(tmp_path / "out"), per_device_train_batch_size=8, per_device_eval_batch_size=4, num_generations=4,
                      max_completion_length=4, max_steps=2, logging_steps=1, eval_strategy="steps", eval_steps=1, save_strategy="no",
                      disable_tqdm=True, report_to="none")
    trainer = GRPOTrainer(make_model(), counted, args=args, train_dataset=prompts, eval_dataset=prompts.select(range(2)), processing_class=tokenizer)
    trainer.train()
    history = trainer.state.log_history
    assert [r["custom/scored"] for r in history if "reward" in r] == [8.0, 8.0]  # training rollouts only
    assert [r["eval_custom/scored"] for r in history if "eval_reward" in r] == [4.0, 4.0]  # 2 eval prompts × G = 4, one batch each
