"""fastgrpo's sampler against transformers' `generate` and the training forward, on the tiny random Llama.

Greedy tokens equal `generate`'s; compaction changes no row; sampled tokens'
log-probs equal the training passes' (`logprobs.LogProbs`); next-token frequencies match the
configured distribution; a model's generation_config.json changes nothing;
unsupported models fall back; peft adapters are sampled from.
"""

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from fastgrpo import GRPOConfig
from fastgrpo.generation.contract import Samples, SamplingSettings
from fastgrpo.generation.transformers_generate import TransformersGenerator
from fastgrpo.generation.build import build_backend
from fastgrpo.update.logprobs import LogProbs
from fastgrpo.rollout.record import completion_mask
from fastgrpo.generation.sampler import Sampler

T = 12  # completion tokens


def build_generator(backend, model, sampling):
    """The backend `generation_backend=backend` builds for `model` (fp32: no weight copy)."""
    return build_backend(SimpleNamespace(generation_backend=backend), model, sampling, bf16=False)


def left_padded(tokenizer, texts):
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


def settings(tokenizer, **values):
    return replace(SamplingSettings(T, [tokenizer.eos_token_id], tokenizer.pad_token_id), **values)


def test_greedy_equals_generate_with_rows_ending_at_different_steps(tokenizer, make_model):
    model = make_model().eval()
    ids, mask = left_padded(tokenizer, ["Hello there, how are you today?", "Hi", "Count to ten, please, and then stop."])
    assert (mask == 0).any(-1).sum() == 2  # two prompts carry left padding
    greedy = settings(tokenizer, top_k=1, repetition_penalty=1.5)  # the penalty makes greedy rows vary their tokens
    free = TransformersGenerator(model, greedy).sample(ids, mask, 2).completion_ids  # (6, T), no EOS reached
    # EOS ids taken from the free run: row 0 ends at its step 3, row 4 at step 7, rows 2–3 never (checked below).
    eos = [int(free[0, 3]), int(free[4, 7])]
    greedy = replace(greedy, eos_token_ids=eos)
    reference = TransformersGenerator(model, greedy).sample(ids, mask, 2).completion_ids
    ours = Sampler(model, greedy).sample(ids, mask, 2).completion_ids
    lengths = completion_mask(reference, eos).sum(-1)
    assert len(set(lengths.tolist())) >= 3  # rows end at different steps (one runs to T)
    assert torch.equal(ours, reference)


def test_compaction_changes_no_row(tokenizer, make_model):
    model = make_model().eval()
    ids, mask = left_padded(tokenizer, ["Count to 3.", "Name a colour, any colour you like."])
    sampling = settings(tokenizer, temperature=0.8, top_k=50, repetition_penalty=1.2)
    torch.manual_seed(7)
    full = Sampler(model, replace(sampling, eos_token_ids=[])).sample(ids, mask, 4).completion_ids  # no EOS: all 8 rows run T steps
    eos = [int(full[0, 2]), int(full[5, 6])]  # rows 0 and 5 now end early, and leave the batch
    torch.manual_seed(7)
    compacted = Sampler(model, replace(sampling, eos_token_ids=eos)).sample(ids, mask, 4).completion_ids
    lengths = completion_mask(compacted, eos).sum(-1)
    assert lengths.min() < T and lengths.max() == T
    for row, length in enumerate(lengths.tolist()):  # every row: the same tokens up to its EOS, padding after
        assert torch.equal(compacted[row, :length], full[row, :length])
        assert (compacted[row, length:] == tokenizer.pad_token_id).all()


def test_sampled_logps_equal_training_forward(tokenizer, make_model):
    model = make_model().eval()
    ids, mask = left_padded(tokenizer, ["Count to 3.", "Name a colour, any colour you like.", "Hi"])
    sampling = settings(tokenizer, temperature=0.7, top_p=0.9, top_k=40, min_p=0.01, repetition_penalty=1.1)
    eos = [tokenizer.eos_token_id] + list(range(300, 1300))  # ~2 % of the vocabulary ends a row: uneven lengths
    torch.manual_seed(0)
    samples = Samples(*Sampler(model, replace(sampling, eos_token_ids=eos)).decode(ids, mask, 4))  # the log-probs too
    batch = SimpleNamespace(
        prompt_ids=ids.repeat_interleave(4, 0), prompt_mask=mask.repeat_interleave(4, 0),
        completion_ids=samples.completion_ids, completion_mask=completion_mask(samples.completion_ids, eos),
    )
    with torch.no_grad():
        logps = LogProbs(temperature=0.7)(model, batch).logps  # the trainer's log π(token) at temperature 0.7 (packed, chunked)
    used = batch.completion_mask.bool()
    assert used.sum(-1).min() < used.shape[1]  # some rows ended early (compaction ran)
    torch.testing.assert_close(samples.logps[used], logps[used], atol=1e-5, rtol=0)


def test_next_token_frequencies_match_softmax(tokenizer, make_model):
    model = make_model().eval()
    ids, mask = left_padded(tokenizer, ["Count to 3."])
    temperature, k, draws = 0.5, 20, 4000
    sampler = Sampler(model, settings(tokenizer, max_completion_length=1, temperature=temperature, top_k=k))
    torch.manual_seed(0)
    first = torch.cat([sampler.sample(ids, mask, 200).completion_ids[:, 0] for _ in range(draws // 200)])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[0, -1]
    top = logits.topk(k)
    expected = draws * (top.values / temperature).softmax(-1)  # top-k keeps k tokens, renormalised at T = 0.5
    observed = (first[:, None] == top.indices[None]).sum(0).float()
    assert observed.sum() == draws  # never a token outside the top k
    chi2 = ((observed - expected) ** 2 / expected).sum()
    assert expected.min() > 5  # the chi-square approximation holds
    assert chi2 < 43.8  # 99.9 % quantile of chi-square with k − 1 = 19 degrees of freedom


@pytest.mark.parametrize("backend", ["fastgrpo", "transformers"])
def test_generation_config_json_is_ignored(tokenizer, make_model, tmp_path, backend):
    model = make_model()
    model.generation_config.do_sample, model.generation_config.top_k = True, 5  # as a checkpoint's generation_config.json may say
    model.generation_config.min_new_tokens = T
    model.generation_config.no_repeat_ngram_size = 1
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.generation_config.top_k == 5 and loaded.generation_config.min_new_tokens == T
    ids, mask = left_padded(tokenizer, ["Count to 3."])
    # top_k = 0 and temperature 1: the first token ranges over the vocabulary, not over the model's top 5.
    generate = build_generator(backend, loaded, settings(tokenizer, max_completion_length=1))
    torch.manual_seed(0)
    first = generate.sample(ids, mask, 64).completion_ids[:, 0]
    with torch.no_grad():
        top5 = loaded(input_ids=ids, attention_mask=mask).logits[0, -1].topk(5).indices
    assert (~torch.isin(first, top5)).sum() > 32
    # min_new_tokens and no_repeat_ngram_size not applied: greedy repeats a token and stops at the EOS it picks.
    greedy = build_generator(backend, loaded, settings(tokenizer, top_k=1, eos_token_ids=[int(first[0])]))
    ref = build_generator(backend, make_model().eval(), settings(tokenizer, top_k=1, eos_token_ids=[int(first[0])]))
    assert torch.equal(greedy.sample(ids, mask, 1).completion_ids, ref.sample(ids, mask, 1).completion_ids)
    repeats = ref.sample(ids, mask, 1).completion_ids[0]
    assert len(set(repeats.tolist())) < len(repeats)  # the random model repeats itself when nothing forbids it


def test_unsupported_model_falls_back_to_generate(tokenizer):
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2))
    with pytest.warns(UserWarning, match="model_type 'gpt2'"):
        generate = build_generator("fastgrpo", gpt2, settings(tokenizer))
    assert isinstance(generate, TransformersGenerator)
    with pytest.raises(ValueError, match="generation_backend='sglang': use one of fastgrpo, transformers, vllm"):
        build_generator("sglang", gpt2, settings(tokenizer))
    with pytest.raises(ValueError, match="generation_backend='sglang': use one of fastgrpo, transformers, vllm"):
        GRPOConfig(generation_backend="sglang")


def test_peft_adapter_is_sampled_from(tokenizer, make_model):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(make_model(), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)).eval()
    ids, mask = left_padded(tokenizer, ["Count to 3.", "Hi"])
    greedy = settings(tokenizer, top_k=1, repetition_penalty=1.5)
    generate = build_generator("fastgrpo", model, greedy)
    assert isinstance(generate, Sampler)
    adapted = generate.sample(ids, mask, 2).completion_ids
    assert torch.equal(adapted, TransformersGenerator(model, greedy).sample(ids, mask, 2).completion_ids)
    with model.disable_adapter():  # the adapter changes the tokens, so equality above used it
        assert not torch.equal(adapted, generate.sample(ids, mask, 2).completion_ids)


def test_a_kv_cache_larger_than_the_machines_memory_is_refused_before_it_is_allocated(tokenizer, make_model):
    # conftest's model: 2 layers, 2 KV heads of 16 dims, fp32 → keys + values take 2·2·2·16·4 = 512 bytes per row and
    # column, plus 1 for the mask; each decode step's logits and their processed copy 2·V·4 bytes per row.
    import psutil

    model = make_model().eval()
    ids, mask = left_padded(tokenizer, ["Count to 3."])
    L, V, total = ids.shape[1] + T, model.config.vocab_size, psutil.virtual_memory().total
    # G whose cache alone needs twice this machine's memory; G whose cache fits in a twentieth of it but whose logits need
    # 1.2 times it (allocating either would get the process killed): the sampler says so before either is allocated.
    for G in (2 * total // (513 * L) + 1, int(1.2 * total / (8 * V)) + 1):
        assert G * 513 * L < total / 20 or G * 513 * L > 2 * total
        with pytest.raises(ValueError, match=rf"sampling {G} completions of up to {L} tokens .* needs a KV cache and logits of [0-9.]+ GiB, more than"):
            Sampler(model, settings(tokenizer)).sample(ids, mask, G)
