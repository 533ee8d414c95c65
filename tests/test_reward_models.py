"""Reward models as reward functions (TRL's protocol), and what reward functions receive from the trainer.

Tiny random models on CPU; expected scores come from calling the model on each text alone (no padding).
"""

import copy
import json
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification, TrainerState

from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.rollout.reward_models import RewardModel
from fastgrpo.rollout.rewards import resolve_reward
from fastgrpo.tasks.rewards import reward_len


def tiny_reward_model(tokenizer, seed=1):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_labels=1, pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForSequenceClassification(config)


def alone(model, tokenizer, text):
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        return float(model(**ids).logits[0, 0])


def test_scores_prompt_plus_completion_at_the_last_real_token_with_pad_eq_eos(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.pad_token = None  # no pad token: TRL pads with EOS and tells the model
    model = tiny_reward_model(tokenizer)
    rm = RewardModel(model, tok)
    assert tok.pad_token_id == tok.eos_token_id == model.config.pad_token_id
    prompts, completions = ["2 + 2 =", "Name a colour:"], [" 4", " a long answer about blue and green"]
    got = rm(prompts=prompts, completions=completions)
    want = [alone(model, tok, p + c) for p, c in zip(prompts, completions)]  # right padding changes nothing
    assert got == pytest.approx(want, abs=1e-5)


def test_chat_prompts_go_through_the_reward_tokenizers_template(tokenizer):
    model = tiny_reward_model(tokenizer)
    rm = RewardModel(model, tokenizer)
    prompt = [{"role": "user", "content": "Hi"}]
    completion = [{"role": "assistant", "content": "Hello!"}]
    text = tokenizer.apply_chat_template(prompt + completion, tokenize=False)
    assert rm(prompts=[prompt], completions=[completion]) == pytest.approx([alone(model, tokenizer, text)], abs=1e-5)


def test_a_local_folder_is_a_reward_model_named_after_it(tmp_path, tokenizer):
    folder = tmp_path / "my-rm"
    tiny_reward_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    rm = resolve_reward(str(folder))
    assert isinstance(rm, RewardModel) and rm.__name__ == "my-rm"
    with pytest.raises(ValueError, match="reward 'nope' is unknown; use one of .*hub id"):  # nothing close: no suggestion
        resolve_reward("nope")
    with pytest.raises(ValueError, match=r"reward 'exactt' is unknown \(did you mean 'exact'\?\); use one of length"):
        resolve_reward("exactt")


def test_reward_model_mixed_with_a_function_and_what_functions_receive(tmp_path, tokenizer, make_model, prompts):
    seen = {}

    def spy(completions, trainer_state, log_metric, log_extra, n, **kwargs):
        seen["state"], seen["n"] = trainer_state, n
        log_metric("spy_metric", 2.0)
        log_extra("spy_column", [len(str(c)) for c in completions])
        return [0.0] * len(completions)

    async def async_reward(completions, **kwargs):
        return [1.0] * len(completions)

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_prompt_length=32,
        max_completion_length=4, max_steps=1, logging_steps=1, save_strategy="no", disable_tqdm=True, log_completions=True,
        num_completions_to_print=0,
    )
    trainer = GRPOTrainer(
        make_model(), [tiny_reward_model(tokenizer), spy, async_reward], args=args, train_dataset=prompts,
        processing_class=tokenizer, reward_processing_classes=[tokenizer, None, None],
    )
    trainer.train()
    assert isinstance(seen["state"], TrainerState) and len(seen["n"]) == 4  # the dataset column, repeated G times
    record = [json.loads(line) for line in open(os.path.join(args.output_dir, "metrics.jsonl"))][0]
    assert record["spy_metric"] == 2.0 and record["rewards/async_reward/mean"] == 1.0 and record["rewards/async_reward/std"] == 0.0
    # an instance built from a config has no path: it is logged under its class name
    assert {"rewards/LlamaForSequenceClassification/mean", "rewards/spy/std", "rewards/async_reward/mean"} <= set(record)
    rows = [json.loads(line) for line in open(os.path.join(args.output_dir, "completions.jsonl"))]
    assert all("spy_column" in r for r in rows)


def test_reward_func_names_are_trls_attribute(tmp_path, tokenizer, make_model, prompts):
    """TRL's `trainer.reward_func_names` (user callbacks read it to find rewards/<name>/mean): a function's __name__, a
    reward model folder's name, in reward_funcs' order. fastgrpo had no such attribute (AttributeError)."""
    folder = tmp_path / "my-rm"
    tiny_reward_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    trainer = GRPOTrainer(make_model(), [reward_len, str(folder)], args=GRPOConfig(output_dir=str(tmp_path / "out")),
                          train_dataset=prompts, processing_class=tokenizer)
    assert trainer.reward_func_names == ["reward_len", "my-rm"]


def test_reward_processing_classes_must_match(tmp_path, tokenizer, make_model, prompts):
    with pytest.raises(ValueError, match="reward_processing_classes has 2 entries for 1 reward_funcs"):
        GRPOTrainer(make_model(), [lambda completions, **k: [0.0] * len(completions)], args=GRPOConfig(output_dir=str(tmp_path)),
                    train_dataset=prompts, processing_class=tokenizer, reward_processing_classes=[None, None])


def test_single_processing_class_stands_for_one_entry_as_in_trl(tmp_path, tokenizer, make_model, prompts):
    # TRL: a single reward_processing_classes object is a list of one, so with two reward_funcs it cannot match.
    with pytest.raises(ValueError, match="has 1 entries for 2 reward_funcs; the numbers must match"):
        GRPOTrainer(make_model(), [reward_len, reward_len], args=GRPOConfig(output_dir=str(tmp_path / 'out')), train_dataset=prompts,
                    processing_class=tokenizer, reward_processing_classes=tokenizer)
    trainer = GRPOTrainer(make_model(), reward_len, args=GRPOConfig(output_dir=str(tmp_path / 'out')), train_dataset=prompts,
                          processing_class=tokenizer, reward_processing_classes=[None])
    assert trainer.reward_processing_classes == [None]  # TRL's attribute: None for a function


def test_get_high_entropy_mask_is_trls_quantile_rule(tmp_path, tokenizer, make_model, prompts):
    # Active entropies 0, 1, 2, 3 (the 5th token is padding): the 0.5 quantile is 1.5, so tokens 2 and 3 are kept.
    trainer = GRPOTrainer(make_model(), reward_len, args=GRPOConfig(output_dir=str(tmp_path / 'out')), train_dataset=prompts, processing_class=tokenizer)
    entropies = torch.tensor([[0.0, 1.0, 2.0, 3.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    assert trainer.get_high_entropy_mask(entropies, mask, threshold=0.5).tolist() == [[False, False, True, True, False]]


def test_special_tokens_as_the_reward_tokenizer_adds_them(tokenizer):
    # A reward tokenizer that adds BOS (as Llama's does): a text prompt is scored on BOS + prompt + completion, as
    # `tok(text)` gives it for training; a chat on the template's tokens alone (no second BOS), as apply_chat_template gives them.
    tok = copy.deepcopy(tokenizer)
    tok.add_bos_token = True
    assert tok("x")["input_ids"][0] == tok.bos_token_id
    model = tiny_reward_model(tokenizer)
    rm = RewardModel(model, tok)

    def logit(ids):
        with torch.no_grad():
            return float(model(input_ids=torch.tensor([ids])).logits[0, 0])

    prompts, completions = ["2 + 2 =", "Name a colour:"], [" 4", " a long answer about blue and green"]
    got = rm(prompts=prompts, completions=completions)
    with_bos = [logit(tok(p + c)["input_ids"]) for p, c in zip(prompts, completions)]
    without = [logit(tok(p + c, add_special_tokens=False)["input_ids"]) for p, c in zip(prompts, completions)]
    assert got == pytest.approx(with_bos, abs=1e-5)
    assert all(abs(g - w) > 1e-4 for g, w in zip(got, without))  # the BOS changes the score: the test can fail
    chat = [[{"role": "user", "content": "Hi"}], [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Colour?"}]]
    replies = [[{"role": "assistant", "content": "Hello!"}], [{"role": "assistant", "content": "Blue."}]]
    ids = [tok.apply_chat_template(p + c, tokenize=True, return_dict=True)["input_ids"] for p, c in zip(chat, replies)]
    assert [i[:2].count(tok.bos_token_id) for i in ids] == [1, 1]  # the template's own BOS, once
    assert rm(prompts=chat, completions=replies) == pytest.approx([logit(i) for i in ids], abs=1e-5)
    tok.add_bos_token = False  # a tokenizer that adds nothing: text scored on its tokens alone
    assert rm(prompts=prompts, completions=completions) == pytest.approx(without, abs=1e-5)


def test_a_model_that_is_no_reward_model_is_refused(tmp_path, tokenizer, make_model):
    # Each used to score: transformers gives a causal LM's checkpoint a fresh random `score` head, so training optimised noise.
    causal = tmp_path / "policy"
    make_model().save_pretrained(causal)
    tokenizer.save_pretrained(causal)
    with pytest.raises(ValueError, match=r"reward model '.*policy' is a LlamaForCausalLM, not a sequence classifier; give a reward model"):
        resolve_reward(str(causal))
    no_architecture = tmp_path / "bare"  # a config that names no class: caught when the head is missing from the weights
    make_model().save_pretrained(no_architecture)
    with open(no_architecture / "config.json") as f:
        config = json.load(f)
    with open(no_architecture / "config.json", "w") as f:
        json.dump({k: v for k, v in config.items() if k != "architectures"}, f)
    tokenizer.save_pretrained(no_architecture)
    with pytest.raises(ValueError, match=r"has no trained score.weight in its checkpoint: transformers would start that head from random weights"):
        resolve_reward(str(no_architecture))
    with pytest.raises(ValueError, match=r"reward model 'LlamaForCausalLM' is a LlamaForCausalLM, not a sequence classifier"):
        RewardModel(make_model(), tokenizer)
    three = tmp_path / "three-labels"  # a classifier of another size: its own message, not transformers' size-mismatch error
    model = tiny_reward_model(tokenizer)
    model.config.num_labels = 3
    LlamaForSequenceClassification(model.config).save_pretrained(three)
    tokenizer.save_pretrained(three)
    with pytest.raises(ValueError, match=r"reward model '.*three-labels' has 3 labels; a reward model has one"):
        resolve_reward(str(three))


def test_a_reward_model_that_cannot_score_or_find_its_tokenizer_is_refused_when_built(tmp_path, tokenizer):
    # Break sweep: a model on the meta device failed at the first rollout ("Cannot copy out of meta tensor"); an instance built
    # from a config without reward_processing_classes spent a minute looking up 'LlamaForSequenceClassification' on the hub,
    # then an OSError; a folder without a tokenizer gave transformers' "Couldn't instantiate the backend tokenizer"; a
    # torch.compile'd reward model or another torch module was called as a function and failed inside its forward.
    with torch.device("meta"):
        meta = tiny_reward_model(tokenizer)
    with pytest.raises(ValueError, match="reward model 'LlamaForSequenceClassification' has its weights on the meta device"):
        RewardModel(meta, tokenizer)
    with pytest.raises(ValueError, match="'LlamaForSequenceClassification' was built from a config, so it has no saved tokenizer to "
                                         "load; give its tokenizer in reward_processing_classes"):
        RewardModel(tiny_reward_model(tokenizer))
    folder = tmp_path / "no-tokenizer"
    tiny_reward_model(tokenizer).save_pretrained(folder)
    with pytest.raises(ValueError, match=r"reward model '.*no-tokenizer': its tokenizer cannot be loaded from there .*save the tokenizer "
                                         r"beside the model \(tokenizer.save_pretrained\), or give it in reward_processing_classes"):
        resolve_reward(str(folder))
    for module in (torch.compile(tiny_reward_model(tokenizer)), torch.nn.Linear(2, 1)):
        with pytest.raises(TypeError, match=rf"reward_funcs entry {type(module).__name__} is a torch module but not a transformers "
                                            "PreTrainedModel"):
            resolve_reward(module, tokenizer)


def test_a_reward_model_that_cannot_read_its_input_names_the_sizes(tokenizer):
    tok = copy.deepcopy(tokenizer)
    short = tiny_reward_model(tokenizer)
    short.config.max_position_embeddings = 8
    with pytest.raises(ValueError, match=r"reward model 'LlamaForSequenceClassification' reads at most 8 tokens, but a prompt \+ completion holds 9;"):
        RewardModel(short, tok)(prompts=["Name a colour:"], completions=[" a long answer about blue"])
    tok.add_tokens(["<secret>"])  # one past the model's embedding rows
    with pytest.raises(ValueError, match=r"reward model 'LlamaForSequenceClassification''s input holds token '<secret>' id 49152, "
                       r"but the model's input embedding has 49152 rows"):
        RewardModel(tiny_reward_model(tokenizer), tok)(prompts=["Say"], completions=[" <secret>"])
    tok.pad_token, tok.eos_token = None, None
    with pytest.raises(ValueError, match="tokenizer has neither a pad nor an EOS token"):
        RewardModel(tiny_reward_model(tokenizer), tok)


def extra_config(tmp_path):
    return GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_completion_length=4, max_steps=1,
                      save_strategy="no", disable_tqdm=True, log_completions=True, num_completions_to_print=0)


def test_log_extra_columns_that_would_misalign_rows_are_refused(tmp_path, tokenizer, make_model, prompts):
    def logs(completions, log_extra, **kwargs):
        log_extra("x", [1])
        return [0.0] * len(completions)

    trainer = GRPOTrainer(make_model(), logs, args=extra_config(tmp_path), train_dataset=prompts, processing_class=tokenizer)
    with pytest.raises(ValueError, match=r"log_extra\('x', …\) logged 1 values for the 4 completions scored; log one value per completion"):
        trainer.train()


def test_log_extra_keeps_trls_table_for_a_column_two_rewards_log_or_a_built_in_name(tmp_path, tokenizer, make_model, prompts):
    # TRL's accuracy_reward and reasoning_accuracy_reward both log "solution": fastgrpo refused the run ("8 values for the 4
    # completions"); TRL's table (a deque of one generation batch) keeps the last function's. A column named like a built-in
    # one ("prompt", "advantage") was refused too; TRL's table takes it where its dict puts it (step, prompt, completion:
    # replaced; advantage: TRL's). completions.jsonl keeps its own fields (a resume cuts it back by their step).
    import pandas as pd

    def first(completions, log_extra, **kwargs):
        log_extra("solution", ["first"] * len(completions))
        log_extra("prompt", ["HIJACK"] * len(completions))
        log_extra("advantage", [999.0] * len(completions))
        return [0.0] * len(completions)

    def second(completions, log_extra, **kwargs):
        log_extra("solution", ["second"] * len(completions))
        return [1.0] * len(completions)

    args = extra_config(tmp_path)
    GRPOTrainer(make_model(), [first, second], args=args, train_dataset=prompts, processing_class=tokenizer).train()
    with open(os.path.join(args.output_dir, "completions.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["solution"] for r in rows] == ["second"] * 4 and all(r["prompt"] != "HIJACK" and r["advantage"] != 999.0 for r in rows)
    table = pd.read_parquet(os.path.join(args.output_dir, "completions", "completions_00001.parquet"))
    assert list(table["solution"]) == ["second"] * 4 and list(table["prompt"]) == ["HIJACK"] * 4 and 999.0 not in list(table["advantage"])


def test_a_reward_tokenizer_that_cannot_render_the_chat_prompts_is_refused_before_loading(tmp_path, tokenizer, prompts):
    """A reward model renders prompt + completion with its own tokenizer's chat template (TRL's protocol): one without a
    template failed after the first rollout's sampling, in transformers' words. Now each chat prompt shape is rendered with a
    one-word reply when the trainer is built, before the policy loads, naming the reward model, the dataset, the row and the fix."""
    bare = copy.copy(tokenizer)
    bare.chat_template = None
    with pytest.raises(ValueError, match=r"^reward model 'LlamaForSequenceClassification', train_dataset row 0: chat messages \[\{'role': 'user', "
                       r"'content': 'Count to 0\.'\}, \{'role': 'assistant', 'content': 'reply'\}\] need a chat template to render; the tokenizer "
                       r"has no chat template: .*reward_processing_classes for a reward model"):
        GRPOTrainer("./this-model-must-not-be-loaded", reward_funcs=tiny_reward_model(tokenizer), reward_processing_classes=bare,
                    args=GRPOConfig(output_dir=str(tmp_path), report_to=[]), train_dataset=prompts)


def test_a_continued_assistant_message_given_as_parts_takes_the_completion_as_one_more_part():
    """`conversation` appended the completion's text to the last message's content: list + str raised a bare TypeError
    in the reward model's check (and at scoring)."""
    from fastgrpo.rollout.prompts import conversation

    prompt = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [{"type": "text", "text": "Hel"}]}]
    assert conversation(prompt, [{"role": "assistant", "content": "lo"}])[-1]["content"] == [
        {"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    assert conversation(prompt[:1] + [{"role": "assistant", "content": "Hel"}], [{"role": "assistant", "content": "lo"}])[-1]["content"] == "Hello"
