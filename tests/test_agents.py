"""Agent training (TRL 1.16's tools / environment_factory / rollout_func): the loop, masks, errors, TRL's examples.

A tiny random model never writes a tool call, so the loop's behaviour is
driven by `Scripted`, a generator that answers each turn from a script (a
tool call until the conversation holds `calls` tool replies, then an
answer); the log-prob passes and the update still run on the tiny model.
"""

import asyncio
import copy
import functools
import math
import re
import threading

import numpy as np
import pytest
from jinja2 import TemplateError
import torch
from datasets import Dataset

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.rollout.agents.chat_format import parse_assistant, prepare_tool_tokenizer, tool_suffix_ids
from fastgrpo.generation.reprefill import Reprefill
from fastgrpo.rollout.agents.tools import call_tools
from fastgrpo.algo.losses import StepCounts, grpo_loss, masked_sum
from fastgrpo.run.metrics import rollout_metrics
from fastgrpo.rollout.record import Rollout
from fastgrpo.generation.sampler import Samples


def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


class Scripted:
    """A `Sampler` stand-in: each turn is a tool call while the sequence holds fewer than `calls` tool replies, then `answer`."""

    owns_weights = False  # a backend on the trained weights (its log-probs are not a second policy)

    def __init__(self, tokenizer, call: str, answer: str = "Done.", calls: int = 1):
        self.tokenizer, self.call, self.answer, self.calls = tokenizer, call, answer, calls
        self.seen = []

    def sample(self, ids, mask, G, max_new_tokens=None):
        rows = []
        for seq, m in zip(ids, mask):
            text = self.tokenizer.decode(seq[m.bool()])
            self.seen.append(text)
            for _ in range(G):
                call = self.call() if callable(self.call) else self.call
                reply = call if text.count("<tool_response>") < self.calls else self.answer
                rows.append(self.tokenizer.encode(reply + "<|im_end|>")[:max_new_tokens])
        width = max(len(r) for r in rows)
        out = torch.tensor([r + [self.tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        return Samples(out, torch.full(out.shape, -0.5))


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=1, num_generations=2,
        max_prompt_length=None, max_completion_length=128, max_steps=1, learning_rate=1e-3, logging_steps=1,
        save_strategy="no", disable_tqdm=True, seed=0,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def scripted(trainer, tokenizer, **kwargs) -> Scripted:
    script = Scripted(tokenizer, **kwargs)
    trainer.assembly.producer.turns = lambda: Reprefill(script, tokenizer.pad_token_id, trainer.eos_token_ids)
    return script


CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>'


def test_trl_tools_script_runs_and_masks_the_tool_reply(tmp_path, tokenizer, make_model):
    """TRL's `tools=[multiply]` example, only the import changed; the reply "12" is context (mask 0), the answer is loss."""
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 3 multiplied by 4?"}], "answer": 12}] * 2)
    seen = {}

    def accuracy(completions, answer, **kwargs):
        seen["completions"] = completions
        return [float(str(a) in c[-1]["content"]) for c, a in zip(completions, answer)]

    trainer = GRPOTrainer(model=make_model(), reward_funcs=accuracy, args=config(tmp_path), train_dataset=dataset,
                          processing_class=tokenizer, tools=[multiply])
    scripted(trainer, tokenizer, call=CALL, answer="The answer is 12.")
    rollout = trainer._collect()
    messages = seen["completions"][0]
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
    assert messages[0]["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": 3, "b": 4}}
    assert messages[1] == {"role": "tool", "name": "multiply", "content": "12"}
    assert rollout.rewards[:, 0].tolist() == [1.0] * 4
    call = tokenizer.encode(CALL + "<|im_end|>")
    suffix = tool_suffix_ids(trainer.tokenizer, [messages[1]], {})
    answer = tokenizer.encode("The answer is 12.<|im_end|>")
    assert rollout.completion_ids[0].tolist() == call + suffix + answer
    assert rollout.tool_mask[0].tolist() == [1] * len(call) + [0] * len(suffix) + [1] * len(answer)
    assert not rollout.is_truncated.any()
    metrics = rollout_metrics(rollout, trainer.reward_names, trainer.reward_weights, 2)
    assert metrics["completion_length_sum"] == 4 * (len(call) + len(answer))  # model tokens only
    assert metrics["tool_calls"] == 4 and metrics["tool_failures"] == 0
    trainer.train()  # the update on multi-turn rows (tool tokens inside the completion)
    assert trainer.last_metrics["tools/call_frequency"] == 1.0 and trainer.last_metrics["tools/failure_frequency"] == 0.0


class IncrementEnv:
    """TRL's documented environment: a counter the model increments with a tool."""

    def reset(self, **kwargs):
        self.counter = 0

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


class ScoredEnv(IncrementEnv):
    def reset(self, **kwargs):
        self.counter = 0
        return " Start at 0."

    async def get_reward(self) -> float:
        return float(self.counter)


def test_trl_environment_example_rewards_see_environments(tmp_path, tokenizer, make_model):
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Increment the counter by 2."}]}] * 2)

    def reward_func(environments, **kwargs):
        return [env.counter for env in environments]

    trainer = GRPOTrainer(model=make_model(), reward_funcs=reward_func, args=config(tmp_path), train_dataset=dataset,
                          processing_class=tokenizer, environment_factory=IncrementEnv)
    script = scripted(trainer, tokenizer, call='<tool_call>\n{"name": "increment", "arguments": {"step": 2}}\n</tool_call>', calls=2)
    rollout = trainer._collect()
    assert rollout.rewards[:, 0].tolist() == [4.0] * 4  # two calls of +2, each row its own counter
    assert "<tool_response>\n2\n</tool_response>" in script.seen[-1] and "<tool_response>\n4\n</tool_response>" in script.seen[-1]
    assert len(trainer.assembly.producer.environments.pool[None]) == 4  # one instance per row, reused by later rollouts
    trainer._collect()
    assert len(trainer.assembly.producer.environments.pool[None]) == 4


@pytest.mark.parametrize("none", [[], None])  # reward_funcs=None: TRL's spelling when the environment supplies get_reward
def test_environment_get_reward_and_reset_observation_without_dataset(tmp_path, tokenizer, make_model, none):
    """No train_dataset (the environment owns the data, max_steps set); async get_reward is a reward named after the class."""
    trainer = GRPOTrainer(model=make_model(), reward_funcs=none, args=config(tmp_path, max_steps=1), processing_class=tokenizer,
                          environment_factory=ScoredEnv)
    assert trainer.reward_names == ["ScoredEnv"]
    script = scripted(trainer, tokenizer, call='<tool_call>\n{"name": "increment", "arguments": {"step": 3}}\n</tool_call>')
    rollout = trainer._collect()
    assert rollout.rewards[:, 0].tolist() == [3.0] * 4
    assert "<|im_start|>user\n Start at 0.<|im_end|>" in script.seen[0]  # reset's observation joins the user message


class PartsEnv(ScoredEnv):
    def reset(self, **kwargs):
        self.counter = 0
        return [{"type": "text", "text": " Start"}, {"type": "text", "text": " at 0."}]


def test_a_reset_returning_content_parts_trains_with_the_chatml_tool_template(tmp_path, tokenizer, make_model):
    """TRL joins a parts observation to the user message as parts; SmolLM2's template (and fastgrpo's ChatML tool template
    that replaces it for tools) took text content only, so every such run failed at its first rollout. The tool template
    now joins text parts, and names any other part (an image) as one a text-only model cannot take."""
    trainer = GRPOTrainer(model=make_model(), reward_funcs=None, args=config(tmp_path, max_steps=1), processing_class=tokenizer,
                          environment_factory=PartsEnv)
    script = scripted(trainer, tokenizer, call='<tool_call>\n{"name": "increment", "arguments": {"step": 3}}\n</tool_call>')
    assert trainer._collect().rewards[:, 0].tolist() == [3.0] * 4
    assert "<|im_start|>user\n Start at 0.<|im_end|>" in script.seen[0]  # "" + " Start" + " at 0.", as text
    with pytest.raises(TemplateError, match="a image content part: fastgrpo trains text-only models; give text parts"):
        trainer.processing_class.apply_chat_template([{"role": "user", "content": [{"type": "image"}]}], tokenize=False)


def test_environment_without_reset_is_refused(tmp_path, tokenizer, make_model, prompts):
    class NoReset:
        def act(self, x: int) -> int:
            """Act.

            Args:
                x: a number.
            """
            return x

    with pytest.raises(ValueError, match="no callable `reset`"):
        GRPOTrainer(model=make_model(), reward_funcs=lambda completions, **k: [0.0] * len(completions), args=config(tmp_path),
                    train_dataset=prompts, processing_class=tokenizer, environment_factory=NoReset)


def test_undocumented_tool_is_refused_before_loading(tmp_path, prompts):
    def bare(a):
        return a

    with pytest.raises(ValueError, match="tool 'bare' has no JSON schema"):
        GRPOTrainer(model="no-such-model", reward_funcs=lambda **k: [], args=config(tmp_path), train_dataset=prompts, tools=[bare])


def test_tool_errors_unknown_tools_and_async_tools(tokenizer):
    def divide(a: int, b: int) -> float:
        """Divide.

        Args:
            a: numerator.
            b: denominator.
        """
        return a / b

    async def slow_add(a: int, b: int) -> int:
        """Add later.

        Args:
            a: first.
            b: second.
        """
        await asyncio.sleep(0)
        return a + b

    async def broken(a: int) -> int:
        """Fail later.

        Args:
            a: anything.
        """
        raise RuntimeError("backend down")

    call = lambda name, **args: {"type": "function", "function": {"name": name, "arguments": args}}  # noqa: E731
    box = {f.__name__: f for f in (divide, slow_add, broken)}
    out = call_tools([[call("divide", a=1, b=0), call("slow_add", a=2, b=3)], [call("nope"), call("broken", a=1)]], [box, box])
    assert out.calls == 4 and out.failures == 3
    assert [m["content"] for m in out.messages[0]] == ["{'error': 'division by zero'}", "5"]
    assert [m["content"] for m in out.messages[1]] == ["{'error': 'Tool nope not found.'}", "{'error': 'backend down'}"]


def test_a_tool_result_with_no_text_is_a_failed_call():
    """power(10, 5000) returns an int of 5001 digits, past Python's 4300-digit limit on int → str: str(result) raised ValueError out
    of the rollout (TRL's too), stopping the run on a call a model exploring a calculator makes in ten tokens."""
    def power(a: int, b: int) -> int:
        """Raise to a power.

        Args:
            a: the base.
            b: the exponent.
        """
        return a**b

    import sys

    call = lambda b: {"type": "function", "function": {"name": "power", "arguments": {"a": 10, "b": b}}}  # noqa: E731
    given = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(4300)  # Python's default (PYTHONINTMAXSTRDIGITS may change it)
    try:
        out = call_tools([[call(3), call(5000)]], [{"power": power}])
    finally:
        sys.set_int_max_str_digits(given)
    assert out.calls == 2 and out.failures == 1
    assert out.messages[0][0]["content"] == "1000"
    assert out.messages[0][1]["content"].startswith("{'error': 'Exceeds the limit (4300 digits) for integer string conversion")


def test_async_tools_share_one_event_loop_across_rounds_as_trls():
    """TRL awaits every async tool on one loop for the trainer's life; fastgrpo ran each round in a new loop (asyncio.run), so
    a rate limiter made once (an asyncio.Semaphore, as an HTTP client's pool) failed from the second round on: "… is bound to a
    different event loop", counted as a tool failure while training went on. Two calls per round contend for it."""
    limit = asyncio.Semaphore(1)

    async def search(q: str) -> str:
        """Search.

        Args:
            q: the query.
        """
        async with limit:
            await asyncio.sleep(0.01)
            return q.upper()

    call = lambda q: {"type": "function", "function": {"name": "search", "arguments": {"q": q}}}  # noqa: E731

    async def from_a_running_loop():  # as in a notebook: a round called while an event loop runs
        return call_tools([[call("c"), call("d")]], [{"search": search}])

    rounds = [call_tools([[call("a"), call("b")]], [{"search": search}]) for _ in range(3)] + [asyncio.run(from_a_running_loop())]
    assert [r.failures for r in rounds] == [0, 0, 0, 0]
    assert [[m["content"] for m in r.messages[0]] for r in rounds] == [["A", "B"]] * 3 + [["C", "D"]]


def test_a_tool_call_nested_past_the_recursion_limit_is_plain_content(tokenizer):
    """A sampled run of `[` inside a call's arguments (≈ 600 tokens: "[[" is one token) made json's decoder raise RecursionError
    out of parse_response, which TRL's fallback (ValueError, TypeError) does not catch: the rollout and the run stopped."""
    import sys

    tok, _ = prepare_tool_tokenizer(tokenizer)
    prefix = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[multiply], add_generation_prompt=True, return_dict=False)
    depth = sys.getrecursionlimit() + 100
    text = '<tool_call>\n{"name": "multiply", "arguments": {"a": ' + "[" * depth + "]" * depth + ', "b": 4}}\n</tool_call>'
    ids = tok.encode(text + "<|im_end|>")
    assert parse_assistant(tok, ids, prefix, [multiply]) == {"role": "assistant", "content": text}
    shallow = tok.encode(text.replace("[" * depth + "]" * depth, "3") + "<|im_end|>")  # the same call, parsed
    assert parse_assistant(tok, shallow, prefix, [multiply])["tool_calls"] == [{"type": "function", "function": {"name": "multiply",
                                                                                                        "arguments": {"a": 3, "b": 4}}}]


def test_a_tool_reply_past_the_budget_ends_the_row(tmp_path, tokenizer, make_model):
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 3 multiplied by 4?"}]}] * 2)
    seen = {}

    def reward(completions, **kwargs):
        seen["completions"] = completions
        return [0.0] * len(completions)

    call = tokenizer.encode(CALL + "<|im_end|>")
    trainer = GRPOTrainer(model=make_model(), reward_funcs=reward, args=config(tmp_path, max_completion_length=len(call) + 5),
                          train_dataset=dataset, processing_class=tokenizer, tools=[multiply])
    scripted(trainer, tokenizer, call=CALL)
    rollout = trainer._collect()  # the reply (≥ 10 tokens) does not fit in the 5 left: the row ends after its call
    assert rollout.completion_ids.shape[1] == len(call) and rollout.tool_mask.all()
    assert [m["role"] for m in seen["completions"][0]] == ["assistant"]  # the dropped reply is not in the messages
    assert rollout.tool_calls == 4  # the calls ran (TRL counts them too)


def test_max_tool_calling_iterations_stops_the_loop(tmp_path, tokenizer, make_model):
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 3 multiplied by 4?"}]}] * 2)
    trainer = GRPOTrainer(model=make_model(), reward_funcs=lambda completions, **k: [0.0] * len(completions),
                          args=config(tmp_path, max_tool_calling_iterations=1, max_completion_length=200), train_dataset=dataset,
                          processing_class=tokenizer, tools=[multiply])
    scripted(trainer, tokenizer, call=CALL, calls=5)  # would call 5 times
    rollout = trainer._collect()
    assert rollout.tool_calls == 4  # one round per row: call, reply, one more turn (a call left unanswered)


def hand_rollout(tool_mask, logps_old):
    """Two rows of 8 completion tokens; row 0 has two tool replies (tokens 2-3 and 5), row 1 none and is 6 long."""
    completion_mask = torch.tensor([[1] * 8, [1] * 6 + [0] * 2])
    return Rollout(
        prompt_ids=torch.ones(2, 2, dtype=torch.long), prompt_mask=torch.ones(2, 2, dtype=torch.long),
        completion_ids=torch.ones(2, 8, dtype=torch.long), completion_mask=completion_mask,
        is_truncated=torch.tensor([False, False]), rewards=torch.zeros(2, 1), advantages=torch.tensor([1.0, -1.0]),
        prompts=["p", "p"], completions=["a", "b"], old_logps=logps_old, tool_mask=tool_mask,
    )


def test_masks_by_hand_two_tool_replies():
    """Loss, normaliser, KL, entropy and lengths count model tokens only.

    Row 0: 8 tokens, tool tokens at 2, 3, 5 → 5 model tokens; row 1: 6 model tokens; 11 in all.
    Ratio r = exp(logp − old) = exp(0.1) on model tokens (wild values on tool tokens must not matter);
    dapo loss = −Σ clip(r)·Â / tokens = −(5·min(e^0.1, 1.2)·1 + 6·max(e^0.1·(−1), −1.2·… )) / 11.
    """
    tool_mask = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 1], [1] * 8])
    old = torch.full((2, 8), -1.0)
    logps = torch.full((2, 8), -0.9)
    logps[0, [2, 3, 5]] = 50.0  # tool tokens: whatever the model says there is not its action
    rollout = hand_rollout(tool_mask, old)
    mask = rollout.model_mask().float()
    assert mask.sum() == 11
    counts = StepCounts(tokens=float(mask.sum()), sequences=2, micro_batches=1, max_completion_length=8)
    entropy = torch.full((2, 8), 2.0)
    entropy[0, [2, 3, 5]] = 1e6
    kl = torch.full((2, 8), 0.5)
    kl[0, [2, 3, 5]] = 1e6
    out = grpo_loss(logps, old, rollout.advantages, mask, counts, loss_type="dapo", epsilon_low=0.2, epsilon_high=0.2, beta=0.1,
                    per_token_kl=kl, use_bias_correction_kl=False)
    r = torch.exp(torch.tensor(0.1))
    # Â = +1: min(r·1, clip(r)·1) = r (r < 1.2); Â = −1: min(−r, −clip(r)) = −r; both then + β·KL.
    expected = (5 * (-r + 0.1 * 0.5) + 6 * (r + 0.1 * 0.5)) / 11
    assert torch.allclose(out.loss, expected, atol=1e-6)
    assert out.metrics["tokens"] == 11
    assert masked_sum(entropy, mask) == 22.0  # 11 tokens × 2 nats: the tool tokens' 1e6 never enters
    assert torch.allclose(out.metrics["kl"], torch.tensor(11 * 0.5))
    metrics = rollout_metrics(rollout, ["r"], torch.ones(1), 2)
    assert (metrics["completion_length_min"], metrics["completion_length_max"]) == (5.0, 6.0)


def test_smollm2_tool_template_renders_plain_chats_as_smollm2_does(tokenizer):
    """The shipped template: tools rendered, SmolLM2's own rendering kept for plain chats, the caller's tokenizer untouched."""
    own = tokenizer.chat_template
    tok, notice = prepare_tool_tokenizer(tokenizer)
    assert "Qwen2.5" in notice and tokenizer.chat_template == own and prepare_tool_tokenizer(tok) == (tok, None)
    for chat in ([{"role": "user", "content": "hi"}], [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                                                        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]):
        assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
            tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[multiply], tokenize=False, add_generation_prompt=True)
    assert '"name": "multiply"' in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_rollout_func_output_reaches_rewards_with_env_mask(tmp_path, tokenizer, make_model, prompts):
    """TRL's rollout_func: each prompt G times, one completion each; env_mask 0 tokens are no loss; extra keys reach rewards,
    but for "prompt" and "completion", which TRL's reward call drops (they reached fastgrpo's rewards)."""
    calls, seen = [], {}

    def rollout_func(prompts, trainer):
        calls.append(len(prompts))
        N = len(prompts)
        return {"prompt_ids": [[5, 6, 7]] * N, "completion_ids": [[8, 9, 10, tokenizer.eos_token_id]] * N,
                "logprobs": [[-1.0] * 4] * N, "env_mask": [[1, 0, 0, 1]] * N, "turns": [2] * N, "answer": extra_answer[0],
                "prompt": ["p"] * N, "completion": "c"}  # TRL drops these two, as the dataset columns of those names

    def reward(completions, turns, answer, **kwargs):
        seen["turns"], seen["answer"], seen["keys"] = turns, answer, set(kwargs)
        return [1.0] * len(completions)

    extra_answer = [7]  # not a list: every completion gets it (TRL's broadcast; it reached the rewards as a bare 7)
    trainer = GRPOTrainer(model=make_model(), reward_funcs=reward, args=config(tmp_path), train_dataset=prompts,
                          processing_class=tokenizer, rollout_func=rollout_func)
    rollout = trainer._collect()
    assert calls == [4] and seen["turns"] == [2] * 4 and seen["answer"] == [7] * 4  # B = 2 prompts, each G = 2 times
    assert "prompt" not in seen["keys"] and "completion" not in seen["keys"] and "prompts" in seen["keys"]
    assert rollout.model_mask()[0].tolist() == [1, 0, 0, 1] and not rollout.is_truncated.any()
    extra_answer[0] = [7]  # a list of 1 for 4 completions: TRL gave the first row 7 and the others nothing
    with pytest.raises(ValueError, match=r"rollout_func returned 1 values under 'answer' for 4 prompts; return one per prompt received"):
        trainer._collect()


def test_rollout_func_gets_each_prompt_num_generations_times_as_trl_1_16_does(tmp_path, tokenizer, make_model):
    """The prompts TRL 1.16's GRPOTrainer passed the same rollout_func (tiny Llama, max_steps=1, unshuffled): B = 2 prompts, each
    G = 4 times, contiguously; in evaluation each num_generations_eval = 2 times. Each is its own copy: the function's edits
    reach neither the dataset nor the rewards' prompts."""
    received, edited, rewarded = [], [], []

    def rollout_func(prompts, trainer):
        received.append([p[-1]["content"] for p in prompts])
        for p in prompts:
            p[-1]["content"] += " edited"
        edited.append([p[-1]["content"] for p in prompts])
        return {"prompt_ids": [[5, 6, 7]] * len(prompts), "completion_ids": [[8, 9, tokenizer.eos_token_id]] * len(prompts),
                "logprobs": [[-1.0] * 3] * len(prompts)}

    def reward(prompts, completions, **kwargs):
        rewarded.append([p[-1]["content"] for p in prompts])
        return [float(i) for i in range(len(completions))]

    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Write a number {i}:"}]} for i in range(2)])
    args = config(tmp_path, per_device_train_batch_size=8, num_generations=4, shuffle_dataset=False, max_completion_length=8,
                  per_device_eval_batch_size=4, num_generations_eval=2)
    trainer = GRPOTrainer(model=make_model(), reward_funcs=reward, args=args, train_dataset=rows, eval_dataset=rows,
                          processing_class=tokenizer, rollout_func=rollout_func)
    trainer._collect()
    trainer.evaluate()
    a, b = "Write a number 0:", "Write a number 1:"
    assert received == rewarded == [[a] * 4 + [b] * 4, [a, a, b, b]]
    assert edited[1] == [a + " edited", a + " edited", b + " edited", b + " edited"]  # once each: no two share a copy
    assert [r["prompt"][-1]["content"] for r in rows] == [a, b]


@pytest.mark.parametrize("output, message", [
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[2]] * 4}, r"must return keys \['logprobs'\]"),
    # 4 prompts received (B = 2, each G = 2 times): one completion each
    ({"prompt_ids": [[1]] * 2, "completion_ids": [[2]] * 2, "logprobs": [[0.0]] * 2},
     r"returned 2 prompt_ids for 4 prompts; return one completion per prompt received: TRL 1.16 passes each prompt "
     r"num_generations=2 times, contiguously\."),
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[2]] * 1, "logprobs": [[0.0]] * 4}, "returned 1 completion_ids for 4 prompts; return one"),
    # a function written for fastgrpo's earlier contract (each prompt once, G completions each) returns G× too many
    ({"prompt_ids": [[1]] * 8, "completion_ids": [[2]] * 8, "logprobs": [[0.0]] * 8},
     r"returned 8 prompt_ids for 4 prompts, num_generations=2 per prompt received: 2× too many \(fastgrpo's earlier contract, "
     r"which passed each prompt once\); return one completion per prompt received"),
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[2, 3]] * 4, "logprobs": [[0.0]] * 4}, r"logprobs\[0\] has 1 values for 2"),
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[2]] * 4, "logprobs": [[0.0]] * 4, "env_mask": [[2]] * 4}, "other than 0 and 1"),
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[2]] * 4, "logprobs": [[0.0]] * 4, "completions": [0] * 4}, "'completions', which reward"),
    # each used to train silently on a collapsed correction (probabilities, +inf) or fail deep inside with no key named
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[2]] * 4, "logprobs": [[-0.5]] * 3 + [[0.3]]},
     r"logprobs\[3\] holds 0.3, which is not a log-probability \(a number ≤ 0\)"),
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[2]] * 4, "logprobs": [[float("inf")]] * 4}, r"logprobs\[0\] holds inf"),
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[2]] * 4, "logprobs": [["a"]] * 4}, r"logprobs\[0\] holds 'a'"),
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[2.0]] * 4, "logprobs": [[0.0]] * 4}, r"completion_ids\[0\] is \[2.0\]; give a list of token ids"),
    # an id past 2**32 overflowed inside the tokenizer while the message named its token ("number too large to fit in target type")
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[2 ** 40]] * 4, "logprobs": [[0.0]] * 4},
     r"^rollout_func's completion_ids\[0\] holds token id 1099511627776, but the model's input embedding has 49152 rows"),
    ({"prompt_ids": [[[1]]] * 4, "completion_ids": [[2]] * 4, "logprobs": [[0.0]] * 4}, r"prompt_ids\[0\] is \[\[1\]\]"),
    ({"prompt_ids": [1] * 4, "completion_ids": [[2]] * 4, "logprobs": [[0.0]] * 4}, r"prompt_ids\[0\] is 1; give a list"),
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[]] * 4, "logprobs": [[]] * 4}, "no completion token in any of its rows"),
    ({"prompt_ids": [[1]] * 4, "completion_ids": ([2] for _ in range(4)), "logprobs": [[0.0]] * 4},  # was "generator has no len()"
     r"returned completion_ids of type generator; return a list \(one entry per prompt received\), e.g. list\(...\) around a generator"),
    # a row that is not a list was "object of type 'NoneType' has no len()", naming no key (TRL fails alike)
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[2]] * 4, "logprobs": [[0.0]] * 3 + [None]},
     r"rollout_func's logprobs\[3\] is None \(NoneType\); give a list with one value per completion token \(None for a token the "
     r'sampler gave none; "logprobs": None for none in any row\)'),
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[2]] * 4, "logprobs": [[0.0]] * 4, "env_mask": [[1], None, [1], [1]]},
     r"rollout_func's env_mask\[1\] is None \(NoneType\); give a list with one value per completion token \(1 = model token"),
    # env_mask of zeros read as "nothing masked": every token the environment's, so the step's loss was 0, silently (TRL's too)
    ({"prompt_ids": [[1]] * 4, "completion_ids": [[2, 3]] * 4, "logprobs": [[0.0, 0.0]] * 4, "env_mask": [[0, 0]] * 4},
     r"rollout_func's env_mask is 0 for every token of every row: no token is the model's, so nothing would train\. env_mask marks "
     r"the model's tokens 1 and the environment's 0 \(TRL's tool_mask\); leave it out when every token is the model's\."),
])
def test_rollout_func_bad_output_is_a_clear_error(tmp_path, tokenizer, make_model, prompts, output, message):
    trainer = GRPOTrainer(model=make_model(), reward_funcs=lambda completions, **k: [0.0] * len(completions), args=config(tmp_path),
                          train_dataset=prompts, processing_class=tokenizer, rollout_func=lambda prompts, trainer: output)
    with pytest.raises(ValueError, match=message):
        trainer._collect()


@pytest.mark.parametrize("rollout_func", [lambda prompts: {}, lambda prompts, trainer, extra: {}, lambda: {}])
def test_a_rollout_func_that_cannot_take_prompts_and_trainer_is_refused_before_the_model_loads(tmp_path, prompts, rollout_func):
    # TRL calls rollout_func(prompts, trainer); a one-parameter function was Python's TypeError at the first rollout.
    with pytest.raises(ValueError, match=r"^rollout_func\(.*\) cannot be called as rollout_func\(prompts, trainer\) \(.*\); TRL calls it"):
        GRPOTrainer(model="/no/such/model", reward_funcs=lambda completions, **k: [0.0] * len(completions), args=config(tmp_path),
                    train_dataset=prompts, rollout_func=rollout_func)


def test_an_async_rollout_func_is_refused_before_the_model_loads(tmp_path, prompts):
    """TRL calls rollout_func synchronously; an `async def` one returned a coroutine, refused ("returned type coroutine") only at the
    first rollout, after the model loaded, with Python's "coroutine was never awaited" warning."""
    async def rollout_func(prompts, trainer):
        return {}

    with pytest.raises(ValueError, match=r"^rollout_func is the async function 'rollout_func'; TRL calls rollout_func\(prompts, trainer\) synchronously "
                       r"and reads the dict it returns: make it a plain def"):
        GRPOTrainer(model="/no/such/model", reward_funcs=lambda completions, **k: [0.0] * len(completions), args=config(tmp_path),
                    train_dataset=prompts, rollout_func=rollout_func)


def test_cached_turns_equal_reprefill_and_the_training_pass(tokenizer, make_model):
    """Greedy: keeping the KV cache gives the tokens re-prefilling gives; its log-probs equal the fp32 training pass to 1e-5
    across turn boundaries (appended tool tokens of different lengths per row, rows continuing in a new order)."""
    from fastgrpo.generation.cached_turns import CachedTurns
    from fastgrpo.rollout.prompts import PromptEncoder
    from fastgrpo.generation.contract import SamplingSettings
    from fastgrpo.update.logprobs import LogProbs
    from fastgrpo.generation.sampler import Sampler
    from fastgrpo.generation.weight_copy import MergedCopy

    model = make_model().eval()
    eos = tokenizer.eos_token_id
    # an fp32 weight copy of its own (the policy's values): both engines return the sampler's log-probs
    sampler = Sampler(model, SamplingSettings(max_completion_length=40, eos_token_ids=[eos], pad_token_id=eos, top_k=1), weight_copy=MergedCopy(model, torch.float32))
    ids, mask, _ = PromptEncoder(tokenizer, None)([[{"role": "user", "content": "Count to 3."}], [{"role": "user", "content": "Hi"}]])
    cached, reprefill = CachedTurns(sampler), Reprefill(sampler, eos, [eos])
    script = [([3, 0, 2], [[10, 11, 12], [13], [14, 15, 16, 17, 18]], [5, 7, 4]), ([0, 3], [[19, 20], [21, 22, 23]], [6, 3])]
    turns_a, turns_b = [cached.first(ids, mask, 2, 6)], [reprefill.first(ids, mask, 2, 6)]
    for rows, appended, budgets in script:
        turns_a.append(cached.extend(rows, appended, budgets))
        turns_b.append(reprefill.extend(rows, appended, budgets))
    for a, b, budgets in zip(turns_a, turns_b, [[6] * 4] + [s[2] for s in script]):
        assert [t.tokens for t in a] == [t.tokens for t in b]
        assert all(len(t.tokens) == n or (len(t.tokens) < n and t.tokens[-1] == eos) for t, n in zip(a, budgets))
        for x, y in zip(a, b):
            assert torch.allclose(torch.tensor(x.logps), torch.tensor(y.logps), atol=1e-5)
    # The whole trajectories, tool tokens masked, through the packed fp32 training pass.
    completion = [turns_a[0][r].tokens for r in range(4)]
    model_logps = [list(turns_a[0][r].logps) for r in range(4)]
    tool = [[1] * len(c) for c in completion]
    for (rows, appended, _), turns in zip(script, turns_a[1:]):
        for r, extra, turn in zip(rows, appended, turns):
            completion[r] = completion[r] + extra + turn.tokens
            tool[r] = tool[r] + [0] * len(extra) + [1] * len(turn.tokens)
            model_logps[r] = model_logps[r] + [0.0] * len(extra) + turn.logps
    width = max(len(c) for c in completion)
    pad = lambda rows, v: torch.tensor([r + [v] * (width - len(r)) for r in rows])  # noqa: E731
    rollout = Rollout(
        prompt_ids=ids.repeat_interleave(2, 0), prompt_mask=mask.repeat_interleave(2, 0), completion_ids=pad(completion, eos),
        completion_mask=pad([[1] * len(c) for c in completion], 0), is_truncated=torch.zeros(4, dtype=torch.bool),
        rewards=torch.zeros(4, 1), advantages=torch.zeros(4), prompts=[0] * 4, completions=[0] * 4, tool_mask=pad(tool, 1),
    )
    with torch.no_grad():
        train = LogProbs(1.0)(model, rollout).logps
    model_mask = rollout.model_mask().bool()
    assert torch.allclose(train[model_mask], pad(model_logps, 0.0)[model_mask].float(), atol=1e-5)


def test_resume_inside_a_multi_turn_run_reproduces_it(tmp_path, tokenizer, make_model):
    """μ = 2 × 2 steps per pass = 4 steps per rollout, a checkpoint at step 3 (inside the reuse window: the multi-turn rollout, tool_mask
    included, is saved) and the next rollout regenerated from the saved RNG: losses and rewards as uninterrupted."""
    import json
    import os

    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Add {i}."}]} for i in range(8)])
    step = lambda: f'<tool_call>\n{{"name": "increment", "arguments": {{"step": {int(torch.randint(1, 5, ()))}}}}}\n</tool_call>'  # noqa: E731

    def run(resume=None):
        args = config(tmp_path, num_iterations=2, per_device_train_batch_size=2, steps_per_generation=2, max_steps=6, save_steps=3,
                      save_strategy="steps", num_generations=2)
        trainer = GRPOTrainer(model=make_model(), reward_funcs=lambda environments, **k: [e.counter for e in environments],
                              args=args, train_dataset=dataset, processing_class=tokenizer, environment_factory=IncrementEnv)
        scripted(trainer, tokenizer, call=step)
        trainer.train(resume_from_checkpoint=resume)
        path = os.path.join(args.output_dir, "metrics.jsonl")
        records = {r["step"]: r for r in map(json.loads, open(path))}
        os.rename(path, path + f".{len(records)}")
        return records

    full = run()
    resumed = run(os.path.join(tmp_path, "out", "checkpoint-3"))
    assert sorted(resumed) == [4, 5, 6] and full[1]["reward_std"] > 0
    for s in (4, 5, 6):
        assert resumed[s]["loss"] == pytest.approx(full[s]["loss"], rel=1e-5, abs=1e-7)
    assert resumed[5]["reward"] == pytest.approx(full[5]["reward"])  # the regenerated multi-turn rollout


def test_rollout_func_missing_logprobs_are_neutral(tmp_path, tokenizer, prompts, server, model_dir):
    """TRL 1.16 (trl#6166, #6266): a None or NaN in rollout_func's logprobs is NaN in sampling_logps, ratio 1 there, and left out
    of sampling/sampling_logp_difference. The given log-probs are π_old's own, shifted by +0.5 on one token (ratio e^-0.5): the
    logged difference is the mean over the 10 given tokens only (0.5 / 10), the ratios' mean over all 16 (15 + e^-0.5) / 16.
    With use_vllm (the suite's server, which the rollout_func here never asks): TRL corrects rollout_func's log-probs only then."""
    hole = None
    exact = []

    def rollout_func(prompts, trainer):
        N = len(prompts)
        row = exact or [hole] * 4
        given = [list(row) for _ in range(N)]
        for r, t in ((0, 0), (1, 1), (3, 0), (3, 1), (3, 2), (3, 3)):
            given[r][t] = None if (r + t) % 2 == 0 else float("nan")
        if exact:
            given[2][3] += 0.5
        return {"prompt_ids": [[5, 6, 7]] * N, "completion_ids": [[8, 9, 10, tokenizer.eos_token_id]] * N, "logprobs": given}

    def trainer_for(out):
        args = config(tmp_path, output_dir=str(tmp_path / out), vllm_importance_sampling_mode="token_truncate", use_vllm=True,
                      vllm_mode="server", vllm_server_base_url=server)
        return GRPOTrainer(model=model_dir, reward_funcs=lambda completions, **k: [float(i) for i in range(len(completions))],
                           args=args, train_dataset=prompts, processing_class=tokenizer, rollout_func=rollout_func)

    first = trainer_for("a")
    rollout = first._collect()
    assert torch.isnan(rollout.sampling_logps).sum() == 16  # every token missing: the rollout builds (no TypeError)
    with torch.no_grad():
        exact.extend(first.passes.log_probs(first.model, rollout).logps[0].tolist())  # π_old of the one completion (every row is it)
    trainer = trainer_for("b")
    assert torch.isnan(trainer._collect().sampling_logps).sum() == 6
    trainer.train()
    record = trainer.state.log_history[0]
    assert record["sampling/sampling_logp_difference/mean"] == pytest.approx(0.5 / 10, abs=1e-6)
    assert record["sampling/sampling_logp_difference/max"] == pytest.approx(0.5, abs=1e-6)
    assert record["sampling/importance_sampling_ratio/mean"] == pytest.approx((15 + math.exp(-0.5)) / 16, abs=1e-6)
    assert record["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-0.5), abs=1e-6)
    assert math.isfinite(record["loss"])


def test_rollout_func_logprobs_are_not_corrected_for_without_vllm_as_trls(tmp_path, tokenizer, make_model, prompts):
    # TRL applies vllm_importance_sampling_correction only under use_vllm; fastgrpo weighted the loss by rollout_func's
    # log-probs anyway, so TRL's docs' placeholder log-probs of 0 gave every token a ratio ≈ e^-44 and nothing trained
    # (grad_norm ≈ 4e-19). Now the run is the one without the correction, and logs no sampling/* keys, as TRL's.
    def rollout_func(prompts, trainer):
        return {"prompt_ids": [[5, 6, 7]] * len(prompts), "completion_ids": [[8 + i, 9, 10, tokenizer.eos_token_id] for i in range(len(prompts))],
                "logprobs": [[0.0] * 4] * len(prompts)}

    def run(out, **fields):
        trainer = GRPOTrainer(model=make_model(), reward_funcs=lambda completions, **k: [float(i) for i in range(len(completions))],
                              args=config(tmp_path, output_dir=str(tmp_path / out), max_steps=1, **fields), train_dataset=prompts,
                              processing_class=tokenizer, rollout_func=rollout_func)
        trainer.train()
        return trainer.state.log_history[0]

    default, off = run("default"), run("off", vllm_importance_sampling_correction=False)
    assert default["grad_norm"] == pytest.approx(off["grad_norm"], rel=1e-6) and default["grad_norm"] > 0.1
    assert not any(k.startswith("sampling/") for k in default)



def test_rollout_func_logprobs_none_trains_as_trls(tmp_path, tokenizer, make_model, prompts):
    """TRL 1.16 takes `"logprobs": None` (no sampler log-probs: `sampling_per_token_logps` is None); fastgrpo refused it
    ("returned logprobs of type NoneType; return a list") at the first rollout. Every token's ratio is 1: the run is the
    one with placeholder log-probs, which without vLLM correct nothing either."""
    def rollout_func(logprobs):
        return lambda prompts, trainer: {"prompt_ids": [[5, 6, 7]] * len(prompts), "logprobs": logprobs(len(prompts)),
                                         "completion_ids": [[8 + i, 9, 10, tokenizer.eos_token_id] for i in range(len(prompts))]}

    def run(out, logprobs):
        trainer = GRPOTrainer(model=make_model(), reward_funcs=lambda completions, **k: [float(i) for i in range(len(completions))],
                              args=config(tmp_path, output_dir=str(tmp_path / out), max_steps=1), train_dataset=prompts,
                              processing_class=tokenizer, rollout_func=rollout_func(logprobs))
        trainer.train()
        return trainer.state.log_history[0]

    none, given = run("none", lambda n: None), run("given", lambda n: [[-1.0] * 4] * n)
    assert none["grad_norm"] == pytest.approx(given["grad_norm"], rel=1e-6) and none["grad_norm"] > 0.1

def test_cached_turns_repetition_penalty_sees_each_rows_own_tokens(tokenizer, make_model):
    """Issue 30, kind 2: in a later turn rows hold different lengths; every decode step's penalised scores equal transformers'
    RepetitionPenaltyLogitsProcessor(1.5) over that row's own tokens (real prompt tokens, turn 1, the tool reply, turn 2 so
    far) exactly, so the pad id is penalised only where the row holds it."""
    from transformers import RepetitionPenaltyLogitsProcessor

    from fastgrpo.generation.cached_turns import CachedTurns
    from fastgrpo.data import PromptEncoder
    from fastgrpo.generation.contract import SamplingSettings
    from fastgrpo.generation.sampler import Sampler

    model = make_model().eval()
    eos = tokenizer.eos_token_id
    pad = 7  # a pad id no row holds (SmolLM2 pads with EOS, which a row holds once its first turn ended)
    sampler = Sampler(model, SamplingSettings(max_completion_length=40, eos_token_ids=[eos], pad_token_id=pad, repetition_penalty=1.5))
    ids, mask, _ = PromptEncoder(tokenizer, None)([[{"role": "user", "content": "Count to 3, slowly please."}], [{"role": "user", "content": "Hi"}]])
    cached = CachedTurns(sampler)
    calls, processors = [], sampler.processors

    def recorded(history, logits):
        scores = processors(history, logits)
        calls.append((logits.clone(), scores.clone(), cached.cache.row[: len(history)].clone()))
        return scores

    sampler.processors = recorded
    torch.manual_seed(0)
    first = cached.first(ids, mask, 2, 6)
    calls.clear()
    rows, appended = [3, 0, 2], [[10, 11, 12], [13], [14, 15, 16, 17, 18, 19, 20]]  # different lengths: ragged columns
    second = cached.extend(rows, appended, [5, 7, 4])
    prompt = [ids[r // 2][mask[r // 2].bool()].tolist() for r in range(4)]
    checked, pad_penalised = 0, False
    for t, (logits, scores, slot_rows) in enumerate(calls):
        for i, r in enumerate(slot_rows.tolist()):
            turn = rows.index(r)
            own = prompt[r] + first[r].tokens + appended[turn] + second[turn].tokens[:t]
            expected = RepetitionPenaltyLogitsProcessor(1.5)(torch.tensor([own]), logits[i : i + 1].clone())[0]
            assert torch.equal(scores[i], expected), (t, r)
            pad_penalised |= pad in own
            checked += 1
    assert checked >= 10 and not pad_penalised  # no row held the pad id: the old tail would have penalised it


def test_reprefill_turns_never_show_the_processors_a_pad(tokenizer, make_model, monkeypatch):
    """The Reprefill engine (whole sequences again, left-padded to the longest): the processors read no pad id in any
    turn (pad 7 is in no row's tokens), so the repetition penalty sees each row's own tokens there too."""
    from fastgrpo.data import PromptEncoder
    from fastgrpo.generation import sampler as sampler_module
    from fastgrpo.generation.contract import SamplingSettings
    from fastgrpo.generation.sampler import Sampler

    eos, pad = tokenizer.eos_token_id, 7
    sampler = Sampler(make_model().eval(), SamplingSettings(max_completion_length=40, eos_token_ids=[eos], pad_token_id=pad, repetition_penalty=1.5))
    ids, mask, _ = PromptEncoder(tokenizer, None)([[{"role": "user", "content": "Count to 3, slowly please."}], [{"role": "user", "content": "Hi"}]])
    seen, draw = [], sampler_module.draw  # each step's history: what the processors read (draw passes it to them as is)
    monkeypatch.setattr(sampler_module, "draw", lambda logits, history, *rest: seen.append(history.clone()) or draw(logits, history, *rest))
    turns = Reprefill(sampler, pad, [eos])
    torch.manual_seed(0)
    turns.first(ids, mask, 2, 6)
    turns.extend([3, 0, 2], [[10, 11, 12], [13], [14, 15, 16, 17, 18, 19, 20]], [5, 7, 4])
    assert len(seen) > 6 and all(not (h == pad).any() for h in seen)


def whisper(word: str) -> str:
    """
    Whispers a word back as a secret.

    Args:
        word: The word to whisper.

    Returns:
        The secret.
    """
    return "<secret>"


def test_a_tool_reply_token_the_embedding_lacks_is_refused(tmp_path, tokenizer, make_model):
    grown = copy.deepcopy(tokenizer)
    grown.add_tokens(["<secret>"])  # id 49152; the tiny model's embedding keeps 49152 rows
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Whisper something."}]}] * 2)
    with pytest.warns(UserWarning, match="the tokenizer has 49153 tokens but the model's input embedding has 49152 rows"):
        trainer = GRPOTrainer(model=make_model(), reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=config(tmp_path),
                              train_dataset=dataset, processing_class=grown, tools=[whisper])
    scripted(trainer, grown, call='<tool_call>\n{"name": "whisper", "arguments": {"word": "x"}}\n</tool_call>')
    with pytest.raises(ValueError, match="the tool reply '<secret>' holds token '<secret>' id 49152, but the model's input embedding has 49152 rows"):
        trainer._collect()


def test_rollout_func_numpy_and_tensor_rows_are_token_ids_and_log_probs(tmp_path, tokenizer, make_model, prompts):
    def rollout_func(prompts, trainer):  # what a vLLM-based rollout_func often returns: arrays and float32 log-probs
        N = len(prompts)
        return {"prompt_ids": [np.array([5, 6, 7])] * N, "completion_ids": [torch.tensor([8, tokenizer.eos_token_id])] * N,
                "logprobs": [np.array([-0.5, 1e-7], dtype=np.float32)] * N}  # 1e-7: a certain token's 0 after float rounding

    trainer = GRPOTrainer(model=make_model(), reward_funcs=lambda completions, **kw: [1.0] * len(completions), args=config(tmp_path),
                          train_dataset=prompts, processing_class=tokenizer, rollout_func=rollout_func)
    rollout = trainer._collect()
    assert rollout.completion_ids[0].tolist() == [8, tokenizer.eos_token_id] and rollout.prompt_ids[0].tolist()[-3:] == [5, 6, 7]


def test_rollout_func_whole_arrays_are_read_row_by_row_as_trls(tmp_path, tokenizer, make_model, prompts):
    """Equal-length rows stacked into one N × T array or tensor (TRL iterates them row by row) raised "The truth value of an
    array with more than one element is ambiguous" where fastgrpo tested `logprobs or []`."""
    eos = tokenizer.eos_token_id

    def rollout_func(prompts, trainer):
        N = len(prompts)
        return {"prompt_ids": torch.tensor([[5, 6, 7]] * N), "completion_ids": np.array([[8, eos]] * N),
                "logprobs": np.array([[-0.5, -0.25]] * N), "env_mask": torch.tensor([[1, 0]] * N)}

    trainer = GRPOTrainer(model=make_model(), reward_funcs=lambda completions, **kw: [1.0] * len(completions), args=config(tmp_path),
                          train_dataset=prompts, processing_class=tokenizer, rollout_func=rollout_func)
    rollout = trainer._collect()
    assert rollout.completion_ids.tolist() == [[8, eos]] * 4 and rollout.prompt_ids.tolist() == [[5, 6, 7]] * 4
    assert rollout.sampling_logps.tolist() == [[-0.5, -0.25]] * 4 and rollout.model_mask().tolist() == [[1, 0]] * 4


# ------------------------------------------------------------------ bad agent inputs, refused before the model loads
NOT_LOADED = "./this-model-must-not-be-loaded"  # loading it would raise "does not exist": the check must come first
CHAT = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 3 multiplied by 4?"}], "answer": 12}] * 2)


def zero(completions, **kwargs):
    return [0.0] * len(completions)


def refused(tmp_path, error, match, **kwargs):
    given = {"model": NOT_LOADED, "reward_funcs": zero, "args": config(tmp_path), "train_dataset": CHAT, **kwargs}
    with pytest.raises(error, match=match):
        GRPOTrainer(**given)


def named(name: str):
    def tool(a: int) -> int:
        """Echo.

        Args:
            a: a number.
        """
        return a

    tool.__name__ = name
    return tool


class Multiplier(IncrementEnv):
    def multiply(self, a: int, b: int) -> int:
        """Multiply.

        Args:
            a: first.
            b: second.
        """
        return a * b


def countdown(n: int) -> str:
    """
    Counts down (a generator: TRL calls it and hands the model the generator object's repr).

    Args:
        n: where to start.
    """
    yield from map(str, range(n, 0, -1))


class Streaming(IncrementEnv):
    async def stream(self, n: int):
        """
        Streams numbers.

        Args:
            n: how many.
        """
        yield n


class Rendering(IncrementEnv):
    def render(self):
        return str(self.counter)


def test_an_environment_helper_method_without_a_schema_names_its_class_and_the_underscore(tmp_path):
    """A TRL environment's public helper (`render(self)`, no docstring) was refused as "tool 'render' has no JSON schema …; give it
    type hints and a docstring", naming neither its class nor that every public method is offered as a tool."""
    refused(tmp_path, ValueError, r"^environment Rendering's public method 'render' is offered to the model as a tool \(every public method "
            r"but reset and get_reward is, TRL's rule\): tool 'render' has no JSON schema .* A helper that is no tool: name it _render\.$",
            environment_factory=Rendering)


def test_generator_tools_are_refused_before_loading(tmp_path):
    """A tool (or an environment method) that yields ran none of its body: the model read '<generator object countdown at 0x…>'."""
    refused(tmp_path, ValueError, r"^tool 'countdown' is a generator function \(it yields\): a call returns a generator object, so its body "
            r"never runs and the model reads '<generator object …>'; return the result instead", tools=[countdown])
    refused(tmp_path, ValueError, r"^environment Streaming's public method 'stream' is offered to the model as a tool .*: tool 'stream' is a "
            r"generator function .* A helper that is no tool: name it _stream\.$", environment_factory=Streaming)


def test_two_tools_under_one_name_are_refused_naming_both(tmp_path):
    """A second tool named `dup` silently replaced the first while both schemas were rendered; an environment method named like a
    standalone tool silently shadowed it."""
    refused(tmp_path, ValueError, r"tools hold two tools named 'dup': tools\[0\] \(named.<locals>.tool, test_agents.py:\d+\) and "
            r"tools\[1\] \(named.<locals>.tool, test_agents.py:\d+\); the model calls tools by name", tools=[named("dup"), named("dup")])
    refused(tmp_path, ValueError, r"tools and environment Multiplier's methods hold two tools named 'multiply': tools\[0\] \(multiply, "
            r"test_agents.py:\d+\) and its method \(Multiplier.multiply, test_agents.py:\d+\)", tools=[multiply], environment_factory=Multiplier)


class PropertyReward(IncrementEnv):
    @property
    def get_reward(self) -> float:
        return 1.0


class PropertyReset:
    reset = property(lambda self: None)


class AsyncReset:
    async def reset(self, **kwargs):
        return None


class RewardWithArgument(IncrementEnv):
    def get_reward(self, answer) -> float:
        return 1.0


class NeedsSize(IncrementEnv):
    def __init__(self, size):
        self.size = size


class ResetWithoutKwargs:
    def reset(self, answer):
        return None


@pytest.mark.parametrize("factory, error, match", [
    (PropertyReward, TypeError, "environment PropertyReward's get_reward is a property, not a method: it would never be called, and the "
     r"environment would give no reward; define `def get_reward\(self\) -> float`"),
    (PropertyReset, TypeError, r"environment PropertyReset's reset is a property, not a method: reset would never run; define `def reset\(self, \*\*kwargs\)"),
    (AsyncReset, TypeError, "environment AsyncReset's reset is async; TRL calls reset"),
    (RewardWithArgument, TypeError, r"environment RewardWithArgument's get_reward needs arguments \(missing a required argument: 'answer'\)"),
    (NeedsSize, TypeError, r"environment_factory NeedsSize cannot be called without arguments \(missing a required argument: 'size'\); .* "
     r"functools.partial\(NeedsSize, …\) or lambda: NeedsSize\(…\)"),
    (ResetWithoutKwargs, TypeError, r"environment ResetWithoutKwargs's reset\(answer\) cannot take the columns of train_dataset \['prompt', "
     r"'answer'\] as keywords \(got an unexpected keyword argument 'prompt'\); TRL calls reset\(\*\*row\) with every column: define "
     r"reset\(self, \*\*kwargs\)"),
    (3, TypeError, r"environment_factory is 3 \(int\); give an environment class"),
    ({"math": 3}, TypeError, r"environment_factory\['math'\] is 3 \(int\)"),
    ({"math": IncrementEnv}, ValueError, r"environment_factory is a dict of \['math'\], which routes each row by its `environment` column, but "
     "train_dataset has none"),
    # its methods ran unbound: "environment type's reset(self, **kwargs) cannot take the columns …", naming neither the class nor the fix
    (lambda: IncrementEnv, TypeError, r"^environment_factory returned the class IncrementEnv, not an instance; the class itself is a factory: "
     r"environment_factory=IncrementEnv\.$"),
])
def test_environments_that_cannot_run_are_refused_before_loading(tmp_path, factory, error, match):
    refused(tmp_path, error, match, environment_factory=factory)


def test_a_column_named_as_resets_own_first_parameter_is_refused_before_loading(tmp_path):
    """A `self` column passed reset(**row) a second value for `self` ("got multiple values for argument 'self'", TRL's TypeError
    too) at the first rollout, after the model loaded; no signature can take it, so the fix is the column's name."""
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "Go."}], "self": "me"}])
    refused(tmp_path, TypeError, r"^the columns of train_dataset include 'self', which environment IncrementEnv's reset\(self, \*\*kwargs\) cannot take "
            r"as a keyword: its 'self' parameter is the environment itself .*; rename the column\.$", train_dataset=rows,
            environment_factory=IncrementEnv)


def test_a_row_routed_to_no_environment_is_refused_before_loading(tmp_path):
    """A dict environment_factory routes rows by their `environment` column; a row naming no factory (a typo) was refused only at
    the rollout that drew it (TRL's ValueError too), after the model loaded and the steps before it trained."""
    routed = lambda *names: [{"prompt": [{"role": "user", "content": "Go."}], "environment": n} for n in names]  # noqa: E731
    refused(tmp_path, ValueError, r"^train_dataset row 2 has environment='maths', which is not among environment_factory's keys "
            r"\['math', 'words'\]; give each row the key of its environment's factory\.$", train_dataset=Dataset.from_list(routed("math", "words", "maths")),
            environment_factory={"math": IncrementEnv, "words": IncrementEnv})
    refused(tmp_path, ValueError, r"^eval dataset row 1 has environment=None, which is not among", train_dataset=routed("math"),
            eval_dataset=routed("math", None), environment_factory={"math": IncrementEnv})


def test_text_prompts_with_tools_or_an_environment_are_refused_before_loading(tmp_path):
    """Text prompts were accepted and refused only at the first rollout, after the model loaded. The column's type is read, an
    IterableDataset only to its first row."""
    from datasets import IterableDataset

    text = Dataset.from_list([{"prompt": "What is 3 times 4?"}] * 2)
    refused(tmp_path, ValueError, r"train_dataset row 0: prompt 'What is 3 times 4\?' is text, but tools need chat prompts", train_dataset=text,
            tools=[multiply])
    refused(tmp_path, ValueError, "train_dataset row 1: prompt 'Hi' is text, but environment_factory needs chat prompts",
            train_dataset=[*CHAT.to_list()[:1], {"prompt": "Hi", "answer": 1}], environment_factory=IncrementEnv)
    read = []

    def rows():
        for i in range(1000):
            read.append(i)
            yield {"prompt": "Hi"}

    refused(tmp_path, ValueError, "train_dataset row 0: prompt 'Hi' is text, but tools and environment_factory need chat prompts",
            train_dataset=IterableDataset.from_generator(rows), args=config(tmp_path, max_steps=1), tools=[multiply],
            environment_factory=IncrementEnv)
    assert len(read) < 10  # the first row (and what the checks before read), not the stream
    refused(tmp_path, ValueError, "eval dataset row 0: prompt 'What is 3 times 4\\?' is text", eval_dataset=text, tools=[multiply])


def test_a_template_a_tool_reply_cannot_be_appended_to_is_refused_before_loading(tmp_path, tokenizer):
    """A tool template whose user turns render differently once a tool message follows (here: with the message count) failed at
    the first tool call, after the model loaded and the first turns were sampled; TRL refuses it when its trainer is built."""
    from fastgrpo.rollout.agents.chat_format import CHATML_RESPONSE_TEMPLATE, CHATML_TOOLS_TEMPLATE

    counting = copy.deepcopy(tokenizer)
    user_turn = "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    assert user_turn in CHATML_TOOLS_TEMPLATE
    counting.chat_template = CHATML_TOOLS_TEMPLATE.replace(user_turn, user_turn[:-3] + " + (messages|length|string) + ' ' }}")
    counting.response_template = CHATML_RESPONSE_TEMPLATE
    refused(tmp_path, ValueError, r"^the chat template is not prefix-preserving: a tool message changes how the turns before it render, "
            r"so a tool reply cannot be appended as tokens .* `tokenizer.chat_template = trl.chat_template_utils."
            r"get_training_chat_template\(tokenizer\)`\.$", processing_class=counting, tools=[multiply])


@pytest.mark.parametrize("kwargs, match", [
    ({"tools": multiply}, r"tools is the function 'multiply', not a list; give a list of tools: tools=\[multiply\]"),
    ({"tools": "multiply"}, r"tools is 'multiply' \(str\), not a list; give a list of functions"),
])
def test_tools_that_are_not_a_list_name_what_was_given(tmp_path, kwargs, match):
    refused(tmp_path, TypeError, match, **kwargs)


def test_max_tool_calling_iterations_without_tools_warns(tmp_path):
    """Accepted silently before (TRL too); like config/unread_fields.py's warnings, at the user's line, before the model loads."""
    with pytest.warns(UserWarning, match=r"max_tool_calling_iterations=3 has no effect without tools or environment_factory \(no tool can "
                      r"be called\); pass tools=\[…\] or environment_factory=… \(--tools, --environment\), or drop it\.") as record:
        refused(tmp_path, ValueError, "does not exist", args=config(tmp_path, max_tool_calling_iterations=3))
    assert [w.filename for w in record if "max_tool_calling" in str(w.message)] == [__file__]


class Broken(IncrementEnv):
    def reset(self, **kwargs):
        self.counter = 0
        return kwargs["answer"] + " left"  # a bug in the user's reset: int + str


class Returns(IncrementEnv):
    def reset(self, **kwargs):
        return self.value

    value = 42


def test_errors_in_an_environments_own_code_name_it_and_keep_their_traceback():
    """reset raising (a TypeError of the user's) is an EnvironmentFunctionError naming the class and method, the user's line in the
    traceback; reset returning 42 or a list that is not content parts is refused naming the value; columns a reset cannot take
    (known only per row) are named."""
    import traceback

    from fastgrpo.rollout.agents.environments import EnvironmentFunctionError, Environments

    prompt = [{"role": "user", "content": "Go."}]
    envs = Environments(Broken, [])
    with pytest.raises(EnvironmentFunctionError, match=r"environment Broken's reset raised TypeError: unsupported operand") as info:
        envs.reset(envs.draw([{}]), [{"prompt": prompt, "answer": 12}], [prompt])
    assert isinstance(info.value.__cause__, TypeError)
    assert 'return kwargs["answer"] + " left"' in "".join(traceback.format_exception(info.value))
    envs = Environments(Returns, [])
    for value in (42, ["x"], [{"text": "no type"}]):
        Returns.value = value
        with pytest.raises(TypeError, match=rf"environment Returns's reset returned {re.escape(repr(value))} \({type(value).__name__}\); return a str"):
            envs.reset(envs.draw([{}]), [{"prompt": prompt}], [prompt])
    envs = Environments(ResetWithoutKwargs, [])
    with pytest.raises(TypeError, match=r"reset\(answer\) cannot take the row's columns \['prompt', 'extra'\]"):
        envs.reset(envs.draw([{}]), [{"prompt": prompt, "extra": 1}], [prompt])


def test_reset_content_parts_join_the_last_user_message_as_trl_joins_them():
    """TRL 1.16 appends a list observation (content parts, its multimodal form) to the last user message, turning a text
    content into one text part first, and a text observation to a parts content as one more part; fastgrpo refused lists."""
    from fastgrpo.rollout.agents.environments import Environments

    parts = [{"type": "text", "text": " Board: X.O"}]
    text, listed = [{"role": "user", "content": "Go."}], [{"role": "user", "content": [{"type": "text", "text": "Go."}]}]
    envs = Environments(Returns, [])
    cases = [(parts, text, [{"type": "text", "text": "Go."}, *parts]), (parts, listed, [{"type": "text", "text": "Go."}, *parts]),
             (" Board", listed, [{"type": "text", "text": "Go."}, {"type": "text", "text": " Board"}]), (" Board", text, "Go. Board")]
    for value, prompt, content in cases:
        Returns.value = value
        out = envs.reset(envs.draw([{}]), [{"prompt": prompt}], [prompt])
        assert out == [[{"role": "user", "content": content}]]
        assert prompt[0]["content"] in ("Go.", [{"type": "text", "text": "Go."}])  # the row's own messages are not changed


def test_cli_keeps_the_traceback_of_an_environments_own_error(tmp_path, monkeypatch):
    """The CLI printed "fastgrpo: error: …" (exit 2, no traceback) for a TypeError raised inside the user's environment."""
    import sys

    from fastgrpo.cli import main
    from fastgrpo.rollout.agents.environments import EnvironmentFunctionError

    (tmp_path / "myenv.py").write_text("class Env:\n    def __init__(self):\n        self.total = 1 + 'x'\n\n    def reset(self, **row):\n        pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    with pytest.raises(EnvironmentFunctionError, match=r"environment Env's __init__ raised TypeError") as info:
        main(["train", "--model", NOT_LOADED, "--dataset", "calculator", "--dataset_size", "4", "--environment", "myenv:Env",
              "--reward", "fastgrpo.tasks.calculator:answer_correct", "--output_dir", "out", "--max_steps", "1"])
    assert isinstance(info.value.__cause__, TypeError)


def test_a_rollout_func_row_past_the_models_context_is_refused_naming_it(tmp_path, tokenizer, make_model, prompts):
    """The tiny model's context is 512 positions: a row of 500 prompt + 13 completion tokens reached the update, where a model with
    learned positions (GPT-2's) failed with "index out of range in self", naming nothing; 500 + 12 fits exactly."""
    length = [12]

    def rollout_func(prompts, trainer):
        N = len(prompts)
        return {"prompt_ids": [[5] * 500] * N, "completion_ids": [[8] * (length[0] - 1) + [tokenizer.eos_token_id]] * N,
                "logprobs": [[-1.0] * length[0]] * N}

    trainer = GRPOTrainer(model=make_model(), reward_funcs=lambda completions, **kw: [1.0] * len(completions),
                          args=config(tmp_path, max_completion_length=16), train_dataset=prompts, processing_class=tokenizer,
                          rollout_func=rollout_func)
    assert trainer._collect().completion_ids.shape == (4, 12)
    length[0] = 13
    with pytest.raises(ValueError, match=r"^rollout_func's row 0 holds 500 prompt_ids \+ 13 completion_ids = 513 tokens, more than the "
                       r"model's context of 512 \(config.max_position_embeddings\): the update would read positions the model has none "
                       r"for\. Keep each row within it in rollout_func"):
        trainer._collect()


def test_a_rollout_func_completion_past_max_completion_length_trains_whole_with_one_warning(tmp_path, tokenizer, make_model, prompts):
    def rollout_func(prompts, trainer):  # 12 tokens against max_completion_length=8, in every rollout
        N = len(prompts)
        return {"prompt_ids": [[5, 6, 7]] * N, "completion_ids": [[8] * 11 + [tokenizer.eos_token_id]] * N, "logprobs": [[-1.0] * 12] * N}

    trainer = GRPOTrainer(model=make_model(), reward_funcs=lambda completions, **kw: [1.0] * len(completions),
                          args=config(tmp_path, max_completion_length=8, max_steps=2), train_dataset=prompts, processing_class=tokenizer,
                          rollout_func=rollout_func)
    with pytest.warns(UserWarning, match="rollout_func returned a completion of 12 tokens, above max_completion_length=8; it trains whole") as caught:
        trainer.train()
    assert len([w for w in caught if "above max_completion_length" in str(w.message)]) == 1  # once, though two rollouts were long
    assert trainer.state.global_step == 2


def test_an_environment_factory_returning_one_instance_twice_is_refused_before_loading(tmp_path):
    """`lambda: env` (or a factory caching its instance) gave every row of a rollout the same environment: their episodes'
    states interleaved silently (TRL's too). Two instances are made per factory when the trainer is built (every prompt's
    G ≥ 2 rows take one each), so the shared one is refused then, as is a factory that starts repeating itself later."""
    env = IncrementEnv()
    refused(tmp_path, ValueError, r"^environment_factory returned the same IncrementEnv instance twice: the rows of a rollout would share "
            r"one environment, .* pass the class \(environment_factory=IncrementEnv\) or a callable that makes one "
            r"\(lambda: IncrementEnv\(…\)\), not `lambda: env` or a cached instance\.$", environment_factory=lambda: env)
    one, two = IncrementEnv(), IncrementEnv()
    refused(tmp_path, ValueError, r"^environment_factory\['b'\] returned the IncrementEnv instance environment_factory\['a'\] returned "
            "already: the rows", environment_factory={"a": iter([one, two]).__next__, "b": iter([two, IncrementEnv()]).__next__},
            train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": "Go."}], "environment": "a"}]))
    from fastgrpo.rollout.agents.environments import Environments

    made = [IncrementEnv(), IncrementEnv()]
    environments = Environments(lambda: made.pop(0) if made else env, [])  # two fresh ones, then the same one again and again
    rows = [{"prompt": [{"role": "user", "content": "Go."}]}] * 4
    with pytest.raises(ValueError, match="^environment_factory returned the same IncrementEnv instance twice"):
        environments.draw(rows)  # the third row's instance is the fourth's


def test_a_tool_reply_far_past_the_budget_ends_the_row_untokenised(tmp_path, tokenizer, make_model):
    """A tool returning a million characters was tokenised whole (~2 s a row, and its ids held in memory) before the length
    check dropped it (TRL's `_get_tool_suffix_ids` tokenises it whole too). Its length in bytes now proves it too long for
    the budget left; the rollout is the one a short-enough-to-tokenise overlong reply gives (the row ends after its call)."""
    def big(n: int) -> str:
        """A long text.

        Args:
            n: how many characters.
        """
        return "x" * n

    seen = {}

    def reward(completions, **kwargs):
        seen["completions"] = completions
        return [0.0] * len(completions)

    trainer = GRPOTrainer(model=make_model(), reward_funcs=reward, args=config(tmp_path), train_dataset=CHAT, processing_class=tokenizer,
                          tools=[big])
    call = '<tool_call>\n{"name": "big", "arguments": {"n": 1000000}}\n</tool_call>'
    scripted(trainer, tokenizer, call=call)
    tokenizer_used = trainer.assembly.producer.tokenizer
    rendered, render = [], tokenizer_used.apply_chat_template

    def spy(conversation, *args, **kwargs):  # the characters each tokenising render held
        if kwargs.get("tokenize", True):
            rendered.append(sum(len(str(m.get("content"))) for m in conversation))
        return render(conversation, *args, **kwargs)

    tokenizer_used.apply_chat_template = spy
    rollout = trainer._collect()
    assert rollout.completion_ids.shape[1] == len(tokenizer.encode(call + "<|im_end|>")) and rollout.tool_mask.all()
    assert [m["role"] for m in seen["completions"][0]] == ["assistant"] and rollout.tool_calls == 4
    assert max(rendered) < 1000  # the prompts and the empty-content rendering; never the million characters


@pytest.mark.parametrize("content", ["x" * 5000, " " * 5000, "é" * 3000, "数学" * 2000, "🙂" * 2000, "a\u0301" * 2000, "𝐀" * 2000,
                                     "ab <|im_end|> " * 300, "", "12"],
                         ids=["ascii", "spaces", "accents", "cjk", "emoji", "combining", "math-letters", "special-tokens", "empty", "short"])
def test_the_tool_suffix_floor_never_passes_the_suffixs_length(tokenizer, content):
    """`tool_suffix_floor` ≤ len(tool_suffix_ids) for texts whose tokens are long (runs of spaces), multi-byte (accents, CJK, emoji),
    composed by normalisation (a + combining acute), mathematical letters, special tokens inside, and empty ones."""
    from fastgrpo.rollout.agents.chat_format import longest_token_bytes, prepare_tool_tokenizer, tool_suffix_floor

    tool_tokenizer = prepare_tool_tokenizer(tokenizer)[0]
    replies = [{"role": "tool", "name": "big", "content": content}] * 2
    suffix = tool_suffix_ids(tool_tokenizer, replies, {})
    assert tool_suffix_floor(tool_tokenizer, replies, {}, longest_token_bytes(tool_tokenizer)) <= len(suffix)


def echo(text: str) -> str:
    """
    Echoes the text.

    Args:
        text: what to echo.
    """
    return f"You said: {text}"


class Adder:
    def __call__(self, a: int) -> int:
        """Adds one.

        Args:
            a: a number.
        """
        return a + 1


def total(*numbers: int) -> int:
    """Sums numbers.

    Args:
        numbers: the numbers.
    """
    return sum(numbers)


def options(**settings: str) -> str:
    """Lists settings.

    Args:
        settings: the settings.
    """
    return str(settings)


@pytest.mark.parametrize("tool, match", [
    # get_json_schema's "… is not a module, class, method, or function", with the fix "give it type hints and a docstring"
    (functools.partial(multiply, b=2), r"^tools holds functools.partial\(<function multiply .* \(partial\), which is not a function: the "
     r"model calls a tool by its __name__ .* Wrap it in a documented def"),
    (Adder(), r"^tools holds <test_agents.Adder object .* \(Adder\), which is not a function"),
    # accepted: the schema offered a parameter named "numbers", and numbers=[1, 2] raised "unexpected keyword argument" at every call
    (total, r"^tool 'total' takes \*numbers: the model's arguments are passed as keywords \(TRL's tool\(\*\*arguments\)\) and its schema "
     r"offers one parameter named 'numbers', so every call fails; name each parameter the model may pass"),
    # accepted: the schema offered one parameter "settings", so the tool got settings={"settings": …}
    (options, r"^tool 'options' takes \*\*settings: .* so \*\*settings receives \{'settings': <value>\}"),
])
def test_tools_the_model_cannot_call_by_name_and_keywords_are_refused_before_loading(tmp_path, tool, match):
    refused(tmp_path, ValueError, match, tools=[tool])


def test_a_tool_reply_with_lone_surrogates_or_an_empty_error_reaches_the_model_readable(tmp_path, tokenizer, make_model):
    """A model writes "\\ud800" in its JSON arguments and the tool echoes it: the lone surrogate stopped the run inside the tokenizer
    ("TextEncodeInput must be Union[…]", TRL's too). It is U+FFFD now. An exception with no message (asyncio.TimeoutError())
    gave the model {'error': ''}; it reads the exception's type."""
    seen = {}

    def reward(completions, **kwargs):
        seen["completions"] = completions
        return [0.0] * len(completions)

    trainer = GRPOTrainer(model=make_model(), reward_funcs=reward, args=config(tmp_path), train_dataset=CHAT, processing_class=tokenizer,
                          tools=[echo])
    scripted(trainer, tokenizer, call='<tool_call>\n{"name": "echo", "arguments": {"text": "a\\ud800b"}}\n</tool_call>')
    trainer._collect()
    assert seen["completions"][0][1] == {"role": "tool", "name": "echo", "content": "You said: a\ufffdb"}

    async def slow(a: int) -> int:
        """Times out.

        Args:
            a: anything.
        """
        raise asyncio.TimeoutError()

    out = call_tools([[{"type": "function", "function": {"name": "slow", "arguments": {"a": 1}}}]], [{"slow": slow}])
    assert out.messages[0][0]["content"] == "{'error': 'TimeoutError'}" and out.failures == 1


def test_a_tool_raising_systemexit_or_cancelled_is_a_failed_call_not_an_exit_or_a_hang():
    """A tool running code that calls exit() (SystemExit) ended the training process with no message (TRL's too); an async tool
    raising SystemExit or KeyboardInterrupt stopped the shared event loop's thread, and the rollout waited forever; one raising
    asyncio.CancelledError handed the model an empty reply, counted a success. Each is a failed call the model reads."""
    def quits(a: int) -> int:
        raise SystemExit(3)

    async def cancelled(a: int) -> int:
        raise asyncio.CancelledError()

    async def exits(a: int) -> int:
        raise SystemExit(2)

    call = lambda name: {"type": "function", "function": {"name": name, "arguments": {"a": 1}}}  # noqa: E731
    box = {f.__name__: f for f in (quits, cancelled, exits, multiply)}
    done = []
    worker = threading.Thread(target=lambda: done.append(call_tools([[call("quits"), call("cancelled"), call("exits")]], [box])), daemon=True)
    worker.start()
    worker.join(60)
    assert done, "call_tools did not return"
    assert [m["content"] for m in done[0].messages[0]] == [
        "{'error': 'SystemExit: 3'}", "{'error': 'CancelledError'}", "{'error': 'SystemExit: 2'}"]
    assert done[0].failures == 3
