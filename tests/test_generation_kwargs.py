"""TRL's generation_kwargs on every backend: stop strings and stop token ids with the engine's meaning, refusals named.

A tiny Llama whose head only ever samples two tokens (" hello", " world": every other logit is −100) makes the stops
certain to appear: " hello world" holds the stop string "o w" across two tokens, and " world" ends a row as a stop token.
vLLM: the request fields and the rows built from an engine's answer, without starting an engine.
"""

from types import SimpleNamespace

import pytest
import torch

from fastgrpo import GRPOConfig
from fastgrpo.config.generation_kwargs import check_bad_words
from fastgrpo.generation.build import build_backend
from fastgrpo.generation.contract import SamplingSettings
from fastgrpo.generation.stops import stop_criteria
from fastgrpo.generation.vllm.backend import VLLMGenerator, is_exact, sampling_params
from fastgrpo.generation.vllm.engines import Completion
from fastgrpo.rollout.collect import SingleTurn

from conftest import tiny_model

T = 6


def two_token_model(tokenizer):
    """`tiny_model` whose head samples " hello" or " world" only (both logits 0 plus the hidden state's ≈ 0 share, the rest −100)."""
    model = tiny_model(tokenizer, tied=False).eval()
    hello, world = tokenizer.encode(" hello"), tokenizer.encode(" world")
    assert len(hello) == len(world) == 1
    head = torch.nn.Linear(64, len(tokenizer), bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-100.0)
        head.bias[[hello[0], world[0]]] = 0.0
    model.lm_head = head
    return model, hello[0], world[0]


def settings(tokenizer, **kwargs):
    """SamplingSettings as the trainer builds them from a GRPOConfig's generation_kwargs (use_vllm=False)."""
    args = GRPOConfig(max_completion_length=T, generation_kwargs=kwargs)
    return SamplingSettings.from_config(args, [tokenizer.eos_token_id], tokenizer.pad_token_id)


def rollout(backend_name, model, sampling, tokenizer, G=16):
    torch.manual_seed(0)
    backend = build_backend(SimpleNamespace(generation_backend=backend_name), model, sampling, bf16=False, tokenizer=tokenizer)
    ids = torch.tensor([tokenizer.encode("Say it")])

    def decode(completion_ids, mask, prompts):
        return [tokenizer.decode(row[m.bool()], skip_special_tokens=True) for row, m in zip(completion_ids, mask)]

    produce = SingleTurn(lambda prompts: (ids, torch.ones_like(ids), 0), backend, decode, sampling.eos_token_ids)
    return produce([{"prompt": "Say it"}], G)


@pytest.mark.parametrize("backend", ["fastgrpo", "transformers"])
def test_stop_string_ends_a_completion_at_the_token_completing_it(tokenizer, backend):
    """transformers' stop_strings (StopStringCriteria): the row ends at the token whose text completes "o w" (" world" after
    " hello"), that token kept; the pads after it are masked; the row is finished (not truncated), and its text holds the
    stop string. A row never holding " hello world" runs to T and is truncated."""
    model, hello, world = two_token_model(tokenizer)
    out = rollout(backend, model, settings(tokenizer, stop_strings="o w"), tokenizer)
    pad = tokenizer.pad_token_id
    seen_stop = seen_run = False
    for row, mask, text, truncated in zip(out.completion_ids.tolist(), out.completion_mask.tolist(), out.completions, out.is_truncated.tolist()):
        pairs = [i for i in range(1, len(row)) if row[i - 1] == hello and row[i] == world]
        if pairs:  # ends at the first " hello world"
            end = pairs[0] + 1
            assert mask == [1] * end + [0] * (len(row) - end) and row[end:] == [pad] * (len(row) - end)
            assert not truncated and text.endswith("hello world")
            seen_stop = True
        else:
            assert len(row) == T and mask == [1] * T and truncated and set(row) <= {hello, world}
            seen_run = True
    assert seen_stop and seen_run  # 16 rows of 6 fair coin flips: both kinds occur


@pytest.mark.parametrize("backend", ["fastgrpo", "transformers"])
def test_suppress_tokens_and_bad_words_are_never_sampled(tokenizer, backend):
    """transformers' suppress_tokens / bad_words_ids (its own processors): suppressing " hello" leaves " world" only; the bad
    word " hello world" never appears while both tokens still do."""
    model, hello, world = two_token_model(tokenizer)
    out = rollout(backend, model, settings(tokenizer, suppress_tokens=[hello]), tokenizer)
    assert out.completion_ids.tolist() == [[world] * T] * 16
    rows = rollout(backend, model, settings(tokenizer, bad_words_ids=[[hello, world]]), tokenizer).completion_ids.tolist()
    assert all((a, b) != (hello, world) for row in rows for a, b in zip(row, row[1:]))
    assert {hello, world} <= {tok for row in rows for tok in row}


@pytest.mark.parametrize("backend", ["fastgrpo", "transformers"])
def test_min_new_tokens_forbids_an_end_before_that_many_completion_tokens(tokenizer, backend):
    """transformers' min_new_tokens counts completion tokens only (not the prompt's): with " world" as the one end id, every
    row's first 3 tokens are " hello"; without it 16 rows of fair coin flips end within 3 tokens."""
    model, hello, world = two_token_model(tokenizer)
    rows = rollout(backend, model, settings(tokenizer, eos_token_id=world, min_new_tokens=3), tokenizer).completion_ids.tolist()
    assert all(row[:3] == [hello] * 3 for row in rows) and any(world in row for row in rows)
    early = rollout(backend, model, settings(tokenizer, eos_token_id=world), tokenizer).completion_ids.tolist()
    assert any(world in row[:3] for row in early)


def test_turns_re_run_each_sequence_when_a_processor_reads_where_the_completion_stands(tokenizer):
    """Cached turns hold rows of different lengths in one history; min_new_tokens / bad_words_ids need each row's own, so the
    own sampler's multi-turn engine re-runs the sequences (each turn counts from 0, as each `generate` call does)."""
    model, hello, world = two_token_model(tokenizer)
    for kwargs, kind in (({}, "CachedTurns"), ({"min_new_tokens": 2}, "Reprefill"), ({"bad_words_ids": [[hello]]}, "Reprefill")):
        backend = build_backend(SimpleNamespace(generation_backend="fastgrpo"), model, settings(tokenizer, **kwargs), bf16=False, tokenizer=tokenizer)
        assert type(backend.turns()).__name__ == kind


@pytest.mark.parametrize("backend", ["fastgrpo", "transformers"])
def test_eos_token_id_replaces_the_ids_that_end_a_completion(tokenizer, backend):
    """transformers' eos_token_id: " world" ends a row (kept, finished) and the model's own EOS is no longer among the ends."""
    model, hello, world = two_token_model(tokenizer)
    sampling = settings(tokenizer, eos_token_id=world)
    assert sampling.eos_token_ids == (world,)
    out = rollout(backend, model, sampling, tokenizer)
    for row, mask, truncated in zip(out.completion_ids.tolist(), out.completion_mask.tolist(), out.is_truncated.tolist()):
        end = row.index(world) + 1 if world in row else len(row)
        assert mask[:end] == [1] * end and sum(mask) == end and row[: end - 1] == [hello] * (end - 1)
        assert truncated == (world not in row)
    assert not out.is_truncated.all()


def test_vllm_keys_join_the_stop_token_ids_and_go_to_sampling_params(tokenizer):
    """vLLM's stop_token_ids join EOS; stop, include_stop_str_in_output, skip_special_tokens and the penalties go to
    SamplingParams as given; vLLM's own SamplingParams accepts the fields (detokenize=True, which stop strings need)."""
    args = GRPOConfig(use_vllm=True, max_completion_length=T, generation_kwargs={
        "stop": "o w", "stop_token_ids": [7], "include_stop_str_in_output": True, "skip_special_tokens": False, "presence_penalty": 0.5})
    sampling = SamplingSettings.from_config(args, [2], 0)
    params = sampling_params(sampling, 4, T)
    assert params["stop"] == ["o w"] and params["stop_token_ids"] == [2, 7] and params["presence_penalty"] == 0.5
    assert params["include_stop_str_in_output"] is True and params["skip_special_tokens"] is False and params["ignore_eos"] is True
    assert not is_exact(sampling)  # a penalty: vLLM's log-probs are not those π_old is taken over
    assert is_exact(SamplingSettings.from_config(GRPOConfig(use_vllm=True, generation_kwargs={"stop": "x"}), [2], 0))
    vllm = pytest.importorskip("vllm")
    assert vllm.SamplingParams(**params, detokenize=True).stop == ["o w"]


def test_vllms_masks_go_to_sampling_params_and_turn_its_log_probs_off():
    """vLLM's bad_words, logit_bias and allowed_token_ids go to SamplingParams (TRL passes generation_kwargs to it); a JSON
    config's logit_bias keys are decimal strings (vLLM's server reads them with int()): they become the int ids vLLM's
    colocated SamplingParams indexes the logits with. vLLM applies the masks before its processed log-probs, which are then
    renormalised over what is left: not π_old's (is_exact False, as under top_k)."""
    for key, value, sent in (("bad_words", ("o w", "hello"), ["o w", "hello"]), ("logit_bias", {"7": 5, 9: -100}, {7: 5.0, 9: -100.0}),
                             ("allowed_token_ids", (2, 7, 9), [2, 7, 9])):
        sampling = SamplingSettings.from_config(GRPOConfig(use_vllm=True, max_completion_length=T, generation_kwargs={key: value}), [2], 0, 10)
        params = sampling_params(sampling, 4, T)
        assert params[key] == sent and not is_exact(sampling), key
        vllm = pytest.importorskip("vllm")
        assert getattr(vllm.SamplingParams(**params), key) == sent
    assert is_exact(SamplingSettings.from_config(GRPOConfig(use_vllm=True, generation_kwargs={"bad_words": []}), [2], 0))  # no word: no mask
    # ids beyond the model's vocabulary: vLLM refuses them at the first request, after the model loaded; here when the trainer is built
    for key, value in (("logit_bias", {"3": 1.0, "10": 2.0}), ("allowed_token_ids", [3, 12])):
        with pytest.raises(ValueError, match=rf"\['{key}'\]=.*: id 1[02] is beyond the model's 10 tokens; give ids below it"):
            SamplingSettings.from_config(GRPOConfig(use_vllm=True, generation_kwargs={key: value}), [2], 0, 10)
    assert SamplingSettings.from_config(GRPOConfig(use_vllm=True, generation_kwargs={"allowed_token_ids": [9]}), [2], 0, 10).vllm_params == {"allowed_token_ids": [9]}


def test_structured_outputs_go_to_every_request_and_turn_vllms_log_probs_off():
    """TRL's rules: generation_kwargs' structured_outputs dict is sent as vLLM's StructuredOutputsParams; the
    vllm_structured_outputs_regex field wins over it (TRL's warning). vLLM masks the tokens the grammar forbids, so its
    log-probs are renormalised over the allowed ones: not π_old's (is_exact False, as under top_k)."""
    choice = SamplingSettings.from_config(GRPOConfig(use_vllm=True, generation_kwargs={"structured_outputs": {"choice": ["yes", "no"]}}), [2], 0)
    assert sampling_params(choice, 4, T)["structured_outputs"] == {"choice": ["yes", "no"]} and not is_exact(choice)
    with pytest.warns(UserWarning, match=r"`structured_outputs_regex` takes precedence"):
        both = GRPOConfig(use_vllm=True, vllm_structured_outputs_regex="(yes|no)", generation_kwargs={"structured_outputs": {"choice": ["a"]}})
    assert SamplingSettings.from_config(both, [2], 0).structured_outputs == {"regex": "(yes|no)"}
    assert "structured_outputs" not in sampling_params(SamplingSettings.from_config(GRPOConfig(use_vllm=True), [2], 0), 4, T)
    with pytest.raises(ValueError, match=r"vllm_structured_outputs_regex='\(yes\|no\)' needs vLLM.*; set use_vllm=True, or remove it\.$"):
        GRPOConfig(vllm_structured_outputs_regex="(yes|no)")  # TRL's transformers path ignores the field


def test_a_regex_or_grammar_vllm_cannot_compile_is_refused_before_the_model_loads():
    """vLLM's "auto" backend (xgrammar, else guidance) compiles the constraint at the first request; here at the config."""
    pytest.importorskip("vllm")
    with pytest.raises(ValueError, match=r"vllm_structured_outputs_regex='\(yes' does not compile to a grammar \(xgrammar: .*; guidance: .*\); fix it\.$"):
        GRPOConfig(use_vllm=True, vllm_structured_outputs_regex="(yes")
    with pytest.raises(ValueError, match=r"\['structured_outputs'\]=\{'grammar': 'root ::= \('\} does not compile to a grammar"):
        GRPOConfig(use_vllm=True, generation_kwargs={"structured_outputs": {"grammar": "root ::= ("}})
    GRPOConfig(use_vllm=True, generation_kwargs={"structured_outputs": {"json": {"type": "object"}}})  # compiles: accepted


def test_vllm_rows_ended_by_a_stop_string_are_finished(tokenizer):
    """vLLM keeps the token completing a stop string in token_ids (stop_reason is the string): that row's length is its
    token count; a row ended by EOS or cut at T reads from EOS as before (stop length 0)."""
    EOS = tokenizer.eos_token_id

    class Engine:
        description, pushes_weights, max_model_len = "a fake engine", True, None

        def generate(self, prompts, params):
            return [[Completion([5, 6], [-1.0, -1.0], True), Completion([5, EOS], [-1.0, -1.0]), Completion([5] * T, [-1.0] * T)]]

    sampling = SamplingSettings.from_config(GRPOConfig(use_vllm=True, max_completion_length=T, generation_kwargs={"stop": "x"}), [EOS], 0)
    backend = VLLMGenerator(Engine(), sampling, vocab_size=len(tokenizer))
    ids = torch.tensor([[1, 2]])
    out = SingleTurn(lambda p: (ids, torch.ones_like(ids), 0), backend, lambda c, m, p: [""] * 3, sampling.eos_token_ids)([{"prompt": "p"}], 3)
    assert out.completion_mask.tolist() == [[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1] * T]
    assert out.is_truncated.tolist() == [False, False, True]


@pytest.mark.parametrize(
    "use_vllm, kwargs, message",
    [
        (False, {"stop": "x"}, r"generation_kwargs\['stop'\]='x' cannot be honoured: it is vLLM's key: TRL passes it to transformers' GenerationConfig, where transformers' generate never reads it; use 'stop_strings'"),
        (True, {"stop_strings": ["x"]}, r"it is transformers' key: TRL passes it to vLLM's SamplingParams, which refuses it .*; use 'stop'"),
        (True, {"eos_token_id": 3}, r"use 'stop_token_ids'"),
        (False, {"presence_penalty": 0.5}, r"it is vLLM's key: .* set use_vllm=True, or remove it"),
        (False, {"num_beams": 4}, r"\['num_beams'\]=4 cannot be honoured: GRPO samples num_generations independent completions"),
        (False, {"max_new_tokens": 10}, r"use max_completion_length"),
        (False, {"no_repeat_ngram_size": 2}, r"\['no_repeat_ngram_size'\]=2 cannot be honoured: TRL passes it to transformers' GenerationConfig, where it would change what is sampled"),
        (True, {"ignore_eos": True}, r"\['ignore_eos'\]=True cannot be honoured: TRL passes it to vLLM's SamplingParams"),
        (True, {"stop_token_ids": 5}, r"generation_kwargs\['stop_token_ids'\]=5: give a list of token ids"),
        (True, {"min_tokens": 600}, r"generation_kwargs\['min_tokens'\]=600 is more than max_completion_length=512, which vLLM refuses"),
        (False, {"do_sample": False}, r"GRPO samples"),
        # transformers' masks: refused with vLLM naming vLLM's key where fastgrpo sends one; values its processors refuse
        # (at the first rollout) or that would truncate every completion, refused at the config
        (True, {"min_new_tokens": 3}, r"\['min_new_tokens'\]=3 cannot be honoured: it is transformers' key: .* use 'min_tokens'"),
        (False, {"min_tokens": 3}, r"\['min_tokens'\]=3 cannot be honoured: it is vLLM's key: .* use 'min_new_tokens'"),
        (True, {"suppress_tokens": [3]}, r"\['suppress_tokens'\]=\[3\] cannot be honoured: it is transformers' key: .* use vLLM's 'logit_bias' \(\{id: -100\} for each id; .*\) or 'allowed_token_ids', or set use_vllm=False\.$"),
        (True, {"bad_words_ids": [[3]]}, r"\['bad_words_ids'\]=\[\[3\]\] cannot be honoured: it is transformers' key: .* use 'bad_words' \(strings: vLLM tokenizes them\)\.$"),
        # vLLM's masks: without vLLM refused naming transformers' key; with it, values vLLM refuses at the first request (after
        # the model loaded), a single string (vLLM would ban each of its characters) and biases the server would clip
        (False, {"bad_words": ["x"]}, r"\['bad_words'\]=\['x'\] cannot be honoured: it is vLLM's key: .* use 'bad_words_ids' \(ids: tokenizer\(words"),
        (False, {"logit_bias": {3: -100}}, r"\['logit_bias'\]=\{3: -100\} cannot be honoured: it is vLLM's key: .* use 'suppress_tokens' \(ids never sampled\) for a bias of -100, or set use_vllm=True\.$"),
        (False, {"allowed_token_ids": [3]}, r"\['allowed_token_ids'\]=\[3\] cannot be honoured: it is vLLM's key: .* set use_vllm=True\.$"),
        (True, {"bad_words": "hello"}, r"\['bad_words'\]='hello': give a list of strings, none blank \(vLLM tokenizes each\)\.$"),
        (True, {"bad_words": ["ok", " "]}, r"\['bad_words'\]=\['ok', ' '\]: give a list of strings, none blank"),
        (True, {"allowed_token_ids": []}, r"\['allowed_token_ids'\]=\[\]: give a non-empty list of token ids \(each ≥ 0\)\.$"),
        (True, {"allowed_token_ids": [3, -1]}, r"\['allowed_token_ids'\]=\[3, -1\]: give a non-empty list of token ids"),
        (True, {"logit_bias": {3: 150}}, r"\['logit_bias'\]=\{3: 150\}: give a dict \{token id: bias\}, each id ≥ 0 .* each bias a number in \[-100, 100\]\.$"),
        (True, {"logit_bias": {3: float("-inf")}}, r"\['logit_bias'\]=\{3: -inf\}: give a dict"),
        (True, {"logit_bias": {3: float("nan")}}, r"\['logit_bias'\]=\{3: nan\}: give a dict"),
        (True, {"logit_bias": {"hello": 1.0}}, r"\['logit_bias'\]=\{'hello': 1.0\}: give a dict \{token id: bias\}"),
        (True, {"logit_bias": {-3: 1.0}}, r"\['logit_bias'\]=\{-3: 1.0\}: give a dict"),
        (True, {"logit_bias": [3, 1.0]}, r"\['logit_bias'\]=\[3, 1.0\]: give a dict"),
        # break sweep: two keys naming one id (vLLM's int() keeps the last bias, silently); a lone surrogate (JSON's "\ud800"),
        # on which vLLM's tokenizer raised a TypeError at the first request
        (True, {"logit_bias": {"05": 100, "5": -100}}, r"\['logit_bias'\]=\{'05': 100, '5': -100\} names one token id twice \(vLLM would keep only the last bias\)"),
        (True, {"logit_bias": {5: 1.0, "5": 2.0}}, r"\['logit_bias'\]=\{5: 1.0, '5': 2.0\} names one token id twice"),
        (True, {"bad_words": ["ok", "a\ud800"]}, r"\['bad_words'\] holds 'a\\ud800', a lone surrogate .* vLLM's tokenizer cannot encode"),
        (False, {"min_new_tokens": 600}, r"\['min_new_tokens'\]=600 is more than max_completion_length=512, so no completion could end"),
        (False, {"min_new_tokens": -1}, r"\['min_new_tokens'\]=-1: give an int ≥ 0\.$"),
        (False, {"suppress_tokens": [-3]}, r"\['suppress_tokens'\]=\[-3\]: give a list of token ids \(each ≥ 0\)\.$"),
        (False, {"bad_words_ids": [[]]}, r"\['bad_words_ids'\]=\[\[\]\]: give a non-empty list of non-empty lists of token ids"),
        (False, {"bad_words_ids": [5]}, r"\['bad_words_ids'\]=\[5\]: give a non-empty list of non-empty lists"),
        # found by the break sweep: vLLM refused each at the first request (after the model loaded); transformers ended every
        # completion at its first token (an empty stop string) or never stopped at the id (a negative one, with a warning)
        (False, {"stop_strings": ""}, r"generation_kwargs\['stop_strings'\]='': give a non-empty string or a list of them \(an empty one would end every completion at once\)\.$"),
        (False, {"stop_strings": ["</answer>", ""]}, r"\['stop_strings'\]=\['</answer>', ''\]: give a non-empty string"),
        (True, {"stop": [""]}, r"\['stop'\]=\[''\]: give a non-empty string"),
        (True, {"stop_token_ids": [-1]}, r"\['stop_token_ids'\]=\[-1\]: give a list of token ids \(each ≥ 0\)\.$"),
        (False, {"eos_token_id": -1}, r"\['eos_token_id'\]=-1: give a token id ≥ 0 or a list of them\.$"),
        (False, {"eos_token_id": [2, -5]}, r"\['eos_token_id'\]=\[2, -5\]: give a token id ≥ 0"),
        (True, {"presence_penalty": 2.5}, r"\['presence_penalty'\]=2.5: give a number in \[-2, 2\] \(vLLM's range\)\.$"),
        (True, {"frequency_penalty": float("nan")}, r"\['frequency_penalty'\]=nan: give a number in \[-2, 2\]"),
        # vLLM's structured outputs: TRL's transformers path keeps the dict unused; vLLM refused these at the first request
        (False, {"structured_outputs": {"choice": ["yes"]}}, r"\['structured_outputs'\]=\{'choice': \['yes'\]\} cannot be honoured: it is vLLM's key: .* set use_vllm=True"),
        (True, {"structured_outputs": {"choice": []}}, r"\['structured_outputs'\]=\{'choice': \[\]\}: choice=\[\] is refused by vLLM; give a non-empty list of strings\.$"),
        (True, {"structured_outputs": {"choices": ["a"]}}, r"unknown key\(s\) 'choices'; give exactly one of regex, json, choice, grammar"),
        (True, {"structured_outputs": {"regex": "a", "choice": ["a"]}}, r"2 constraints \(regex, choice\); give exactly one of"),
        (True, {"structured_outputs": "yes|no"}, r"\['structured_outputs'\]='yes\|no': give a dict of vLLM's StructuredOutputsParams"),
    ],
)
def test_keys_not_honoured_are_refused_naming_the_fix(use_vllm, kwargs, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(use_vllm=use_vllm, generation_kwargs=kwargs)


def test_stop_token_ids_beyond_the_vocabulary_are_refused_before_an_engine_starts(tokenizer, make_model, prompts, tmp_path):
    """Found by the break sweep: an id ≥ the model's vocabulary never ends a completion (vLLM refuses it at the first request,
    after the model loaded; transformers runs every row to T). Refused when the trainer is built, naming the key and the size;
    the last id is still accepted."""
    from fastgrpo import GRPOTrainer

    vocab = len(tokenizer)  # 49152: SmolLM2's embedding rows, as tiny_model's
    args = GRPOConfig(use_vllm=True, max_completion_length=T, generation_kwargs={"stop_token_ids": [7, vocab]})
    with pytest.raises(ValueError, match=rf"\['stop_token_ids'\]=\[7, {vocab}\]: id {vocab} is beyond the model's {vocab} tokens, so no completion would end there"):
        SamplingSettings.from_config(args, [2], 0, vocab)
    assert SamplingSettings.from_config(GRPOConfig(generation_kwargs={"eos_token_id": vocab - 1}), [2], 0, vocab).eos_token_ids == (vocab - 1,)
    args = GRPOConfig(output_dir=str(tmp_path), max_completion_length=T, per_device_train_batch_size=4, num_generations=4,
                      generation_kwargs={"eos_token_id": 10**9}, disable_tqdm=True)
    with pytest.raises(ValueError, match=rf"\['eos_token_id'\]=1000000000: id 1000000000 is beyond the model's {vocab} tokens"):
        GRPOTrainer(make_model(), lambda completions, **kw: [0.0] * len(completions), args=args, train_dataset=prompts, processing_class=tokenizer)
    # transformers' masks index the logits with their ids: an IndexError at the first rollout, after the model loaded
    for key, value in (("suppress_tokens", [3, vocab]), ("bad_words_ids", [[3], [4, vocab + 5]])):
        with pytest.raises(ValueError, match=rf"\['{key}'\]=.*: id {vocab if key == 'suppress_tokens' else vocab + 5} is beyond the model's {vocab} tokens"):
            SamplingSettings.from_config(GRPOConfig(generation_kwargs={key: value}), [2], 0, vocab)
    assert SamplingSettings.from_config(GRPOConfig(generation_kwargs={"suppress_tokens": [vocab - 1]}), [2], 0, vocab).suppress_tokens == (vocab - 1,)


def test_stop_criteria_are_transformers_own(tokenizer):
    """The criteria are transformers' StopStringCriteria; no strings, none."""
    assert stop_criteria(tokenizer, ()) is None
    assert type(stop_criteria(tokenizer, ("o w",))).__name__ == "StopStringCriteria"


def test_stop_strings_are_refused_for_a_multi_turn_rollout(tokenizer):
    """A multi-turn rollout ends each turn at EOS (its turns never read stop lengths): stop strings are refused, naming the
    stop token ids that do end turns."""
    from fastgrpo.rollout.producers import build_producer

    agents = SimpleNamespace(tools=[lambda x: x], environments=None, rollout_func=None)
    with pytest.raises(ValueError, match=r"stop strings end single-turn completions only.*stop_token_ids with vLLM, eos_token_id otherwise"):
        build_producer(GRPOConfig(generation_kwargs={"stop_strings": ["</tool_call>"]}), agents, tokenizer=tokenizer, encode=None,
                       backend=None, eos_token_ids=[0], device="cpu", trainer=None, notify=print)


def test_bad_words_vllm_would_refuse_are_refused_before_the_model_loads(tokenizer, monkeypatch):
    """vLLM bans each bad word with and without a leading space (where that spelling is another token sequence of the same
    length) and refuses a request with more sequences than VLLM_MAX_NUM_BAD_WORDS, at the first rollout after the model and the
    engine loaded; here load_policy refuses the same words when it has the tokenizer, before the model loads. vLLM's own
    SamplingParams.update_from_tokenizer is the oracle of the count."""
    from accelerate import Accelerator

    from fastgrpo.run.setup import load_policy

    monkeypatch.setenv("VLLM_MAX_NUM_BAD_WORDS", "4")  # read by vLLM's envs when it is used, and here
    words = ["hello", "world", "cat"]  # in SmolLM2's vocabulary with and without a space: 6 sequences
    args = GRPOConfig(use_vllm=True, generation_kwargs={"bad_words": words})
    with pytest.raises(ValueError, match=r"\['bad_words'\] has 3 words, 6 token sequences as vLLM bans them .* more than vLLM's "
                                         r"VLLM_MAX_NUM_BAD_WORDS=4: vLLM refuses the request at the first rollout\. Give fewer words"):
        load_policy("no/such-model", tokenizer, None, args, Accelerator(cpu=True))  # the model is never looked for
    monkeypatch.setenv("VLLM_MAX_NUM_BAD_WORDS", "6")  # exactly the count: accepted
    check_bad_words({"bad_words": words}, True, tokenizer)
    vllm = pytest.importorskip("vllm")
    monkeypatch.delenv("VLLM_MAX_NUM_BAD_WORDS")  # vLLM's default limit (128), whether or not its envs cached the value
    params = vllm.SamplingParams(bad_words=words)
    params.update_from_tokenizer(SimpleNamespace(encode=tokenizer.encode, max_token_id=len(tokenizer) - 1))  # vLLM's tokenizer's
    assert len(params.bad_words_token_ids) == 6  # the sequences vLLM counts against the limit: hello/ hello, world/ world, cat/ cat
    check_bad_words({"bad_words": words * 50}, False, tokenizer)  # without vLLM the key is refused earlier; nothing to count
