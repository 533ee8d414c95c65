"""What a TRL user meets in the first hour (issue 22, part A), one test per kind, several instances each.

Kinds: reserved column names; sampling settings that see only real tokens
(both backends, every processor); chat prompts rendered as transformers
renders them (a final assistant message is continued). The CLI's kinds
(typed values, empty inputs, a newcomer's flags) are in tests/test_cli_first_hour.py.
"""

from dataclasses import replace

import pytest
import torch
from datasets import Dataset
from transformers import LogitsProcessorList

from fastgrpo import GRPOConfig, GRPOTrainer, generation, sampler
from fastgrpo.data import PromptEncoder, conversation
from fastgrpo.generation import SamplingSettings, build_generator
from fastgrpo.rewards import score

# --- kind 3: a dataset column may be named like any parameter of the calls it passes through ---------------


def test_columns_named_like_parameters_reach_the_reward_functions():
    seen = {}

    def reward(completions, **columns):
        seen.update(columns)
        return [1.0] * len(completions)

    # funcs, columns and reward_kwargs are score()'s own parameters; fn, name and kwargs are _call's; self is a method's.
    columns = {name: ["v"] for name in ("funcs", "columns", "reward_kwargs", "fn", "name", "kwargs", "self", "n")}
    assert score([reward], ["p"], ["c"], [[1]], columns, reward_kwargs={"trainer_state": "S"}).tolist() == [[1.0]]
    assert {k: seen[k] for k in columns} == columns and seen["trainer_state"] == "S"


def test_column_named_funcs_trains_end_to_end(tokenizer, make_model, tmp_path):
    # The instance: a column `funcs` crashed after the first generation. `self` would meet
    # a reward model's bound __call__; `entry` is the reasoning_gym reward's own keyword.
    rows = [{"prompt": f"Count to {i}.", "funcs": i, "self": "x", "reward_kwargs": 0} for i in range(4)]
    seen = []

    def reward(completions, funcs, **kwargs):
        seen.extend(funcs)
        return [float(f) for f in funcs]

    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=3, report_to="none", disable_tqdm=True, bf16=False)
    trainer = GRPOTrainer(make_model(), reward, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.train()
    assert len(seen) == 4 and set(seen) <= {0, 1, 2, 3}


# --- kind 4: every logits processor, both backends: a prompt's distribution alone = batched with longer ones --


PROCESSORS = sampler.logits_processors  # the library's own, before any test wraps it


def first_step_scores(monkeypatch, backend, model, sampling, ids, mask):
    """The processed scores (rows, V) a backend samples its first token from (a recorder after its processors)."""
    recorded = []

    def recording(settings):
        return [*PROCESSORS(settings), lambda input_ids, scores: recorded.append(scores.clone()) or scores]

    monkeypatch.setattr(sampler, "logits_processors", lambda settings: LogitsProcessorList(recording(settings)))
    monkeypatch.setattr(generation, "logits_processors", lambda settings: LogitsProcessorList(recording(settings)))
    build_generator(backend, model, sampling)(ids, mask, 1)
    return recorded[0]


@pytest.mark.parametrize("backend", ["fastgrpo", "transformers"])
@pytest.mark.parametrize(
    "values",
    [{"repetition_penalty": 30.0}, {"repetition_penalty": 0.5}, {"temperature": 0.7}, {"top_k": 20},
     {"top_p": 0.5, "temperature": 0.05}, {"min_p": 0.2, "temperature": 0.05}, {"repetition_penalty": 30.0, "top_k": 50, "top_p": 0.9}],
)
def test_every_processor_sees_only_real_tokens(monkeypatch, tokenizer, make_model, backend, values):
    model = make_model().eval()
    with torch.no_grad():  # the tiny model's pad (= EOS) embedding starts at zero, so its logit would be 0: immune to the penalty
        model.get_input_embeddings().weight[tokenizer.eos_token_id].normal_(0, 1, generator=torch.Generator().manual_seed(0))
    sampling = replace(SamplingSettings(1, [tokenizer.eos_token_id], tokenizer.pad_token_id), **values)
    tokenizer.padding_side = "left"
    alone = tokenizer(["Hi"], return_tensors="pt")
    batched = tokenizer(["Count to ten, please, and then stop.", "Hi"], return_tensors="pt", padding=True)
    assert batched.input_ids[1, 0] == tokenizer.eos_token_id  # SmolLM2 pads with EOS, which "Hi" does not hold
    logp_alone = first_step_scores(monkeypatch, backend, model, sampling, alone.input_ids, alone.attention_mask).log_softmax(-1)[0]
    logp_batched = first_step_scores(monkeypatch, backend, model, sampling, batched.input_ids, batched.attention_mask).log_softmax(-1)[1]
    torch.testing.assert_close(logp_batched, logp_alone, atol=1e-4, rtol=0)  # log-probs: a rare token's change shows too


# --- kind 5: a conversation that ends with an assistant message is continued ---------------------------------


def test_final_assistant_message_is_continued_as_transformers_renders_it(tokenizer):
    encode = PromptEncoder(tokenizer, max_prompt_length=None)
    prefilled = [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": "The answer is"}]
    text = encode.render(prefilled)
    assert text == tokenizer.apply_chat_template(prefilled, tokenize=False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\nThe answer is")  # not closed by <|im_end|>, no second assistant turn
    assert text.count("<|im_start|>assistant") == 1
    # Other endings open a new assistant turn, as before (user, system, tool).
    for last in ({"role": "user", "content": "Go on."}, {"role": "system", "content": "Be brief."}):
        assert encode.render([*prefilled, last]).endswith("<|im_start|>assistant\n")
    # TRL 1.16's GRPOTrainer renders the same prompt closed, with a new turn after it (documented in the README).
    trl_text = tokenizer.apply_chat_template(prefilled, tokenize=False, add_generation_prompt=True)
    assert trl_text.endswith("The answer is<|im_end|>\n<|im_start|>assistant\n")
    # A reward model scores the continued message as one message: prompt text + completion text.
    joined = conversation(prefilled, [{"role": "assistant", "content": " 5."}])
    assert joined == [prefilled[0], {"role": "assistant", "content": "The answer is 5."}]
    assert conversation(prefilled[:1], [{"role": "assistant", "content": "5"}])[-1] == {"role": "assistant", "content": "5"}
