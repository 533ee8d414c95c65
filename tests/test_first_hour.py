"""What a TRL user meets in the first hour (issue 22, part A), one test per kind, several instances each.

Kinds: reserved column names; sampling settings that see only real tokens
(both backends, every processor); chat prompts rendered as transformers
renders them (a final assistant message is continued). The CLI's kinds
(typed values, empty inputs, a newcomer's flags) are in tests/test_cli_first_hour.py.
"""

import time
from dataclasses import replace

import pytest
import torch
from datasets import Dataset, IterableDataset
from transformers import LogitsProcessorList

from fastgrpo import GRPOConfig, GRPOTrainer
from types import SimpleNamespace

from fastgrpo.generation import sampler, transformers_generate
from fastgrpo.cli import main
from fastgrpo.rollout.prompts import PromptEncoder, conversation
from fastgrpo.run.datasets import load_dataset_spec
from fastgrpo.generation.contract import SamplingSettings
from fastgrpo.generation.build import build_backend
from fastgrpo.rollout.rewards import score

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

    def recording(settings, prompt_length=0):
        return LogitsProcessorList([*PROCESSORS(settings, prompt_length), lambda input_ids, scores: recorded.append(scores.clone()) or scores])

    monkeypatch.setattr(sampler, "logits_processors", recording)
    monkeypatch.setattr(transformers_generate, "logits_processors", recording)
    build_backend(SimpleNamespace(generation_backend=backend), model, sampling, bf16=False).sample(ids, mask, 1)
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


# --- kind 2: empty and malformed inputs, through every door, refused in one line before any model loads ------

BAD_FILES = {  # file name, content → what the one-line error must say
    "empty.jsonl": ("", "has no rows"),
    "empty.json": ("", "has no rows"),
    "array.json": ("[]", "has no rows"),
    "header.csv": ("prompt,answer\n", "has no rows"),
    "empty.csv": ("", "has no rows"),
    "blank.jsonl": ('{"prompt": "   "}\n{"prompt": ""}\n', "row 0 has a blank prompt"),
    "blank.csv": ('prompt\n"  "\n', "row 0 has a blank prompt"),
    "bad.jsonl": ('{"prompt": "a"}\n{"prompt": "b"\n', "line 2: not valid JSON"),
    "bad.json": ('[{"prompt": "a"},\n {"prompt": }]', "line 2: not valid JSON"),
    "bad.csv": ("prompt,answer\na,1\nb,2,3\n", "line 3: 3 fields where the header has 2"),
    "bad.parquet": ("not parquet", "is not a parquet file"),
    "nested.json": ('[{"prompt": ["a", "b"]}]', "is a list but not chat messages"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_dataset_file_is_one_line_before_the_model(tmp_path, capsys, monkeypatch, name):
    content, expected = BAD_FILES[name]
    (tmp_path / name).write_text(content)
    monkeypatch.chdir(tmp_path)
    # The model path does not exist either: the dataset's error must come first (nothing loaded yet).
    assert main(["train", "--dataset", name, "--model", "./no-such-model", "--reward", "length"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and name in err and expected in err, err


def test_empty_parquet_and_datasets_from_python_are_refused_before_the_model(tmp_path):
    import pandas as pd

    pd.DataFrame({"prompt": pd.Series([], dtype=str)}).to_parquet(tmp_path / "empty.parquet")
    with pytest.raises(ValueError, match="empty.parquet' has no rows"):
        load_dataset_spec(str(tmp_path / "empty.parquet"))
    pd.DataFrame({"prompt": ["  ", None]}).to_parquet(tmp_path / "blank.parquet")
    with pytest.raises(ValueError, match="row 0 has a blank prompt"):
        load_dataset_spec(str(tmp_path / "blank.parquet"))
    args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, num_generations=2, per_device_train_batch_size=2)
    for dataset, expected in (
        ([], "train_dataset is empty"),
        (Dataset.from_list([{"prompt": "\n"}]), "row 0 has a blank prompt"),
        (IterableDataset.from_generator(lambda: iter(())), r"IterableDataset\) yields no rows"),
        (IterableDataset.from_generator(lambda: iter([{"text": "a"}])), "rows without a prompt column"),
    ):
        with pytest.raises(ValueError, match=expected):
            GRPOTrainer("./no-such-model", "length", args=args, train_dataset=dataset)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("reasoning-gym:", "no task named"), ("reasoning-gym: , ", "no task named"),
     ("reasoning-gym:basic_arithmetic?min_terms=5&max_terms=2", "refuses the settings"),
     ("reasoning-gym:basic_arithmetic?size=3", "size is set by fastgrpo"),
     ("reasoning-gym:basic_arithmetic?few_shot=x", "few_shot='x'")],
)
def test_reasoning_gym_spec_that_yields_nothing_is_refused(spec, expected):
    with pytest.raises(ValueError, match=expected):
        load_dataset_spec(spec, size=4)


@pytest.mark.parametrize("spec", ["nosuch.jsonl", "./data", "data/train.csv", "~/no-such-dir/x", "../x.parquet"])
def test_missing_local_dataset_says_no_such_file_without_the_hub(spec, monkeypatch):
    monkeypatch.setattr("fastgrpo.run.datasets.load_dataset", lambda *a, **k: pytest.fail("the hub was asked"))
    start = time.perf_counter()
    with pytest.raises(ValueError, match="no such file"):
        load_dataset_spec(spec)
    assert time.perf_counter() - start < 5.0  # a hub request and its retries would take tens of seconds
