"""TRL's `generation_kwargs`, read for the engine the run samples with: the keys fastgrpo honours and a refusal for the rest.

TRL 1.16 passes `generation_kwargs` to the engine: without vLLM into transformers' `GenerationConfig` (after its own
sampling values, so a key overrides them), with vLLM into `SamplingParams(**generation_kwargs)` (colocate; a server
builds the same). So a key means what that engine means by it:

- both: the sampling values (`temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty`) override the fields;
  `do_sample=True` is what GRPO does anyway.
- transformers (use_vllm=False): `eos_token_id` (an id or a list) is the whole set of ids that end a completion (the
  model's EOS ends it no more unless listed); `stop_strings` end it at the token that completes the text (transformers'
  `StopStringCriteria`; TRL's generate has no tokenizer and raises at its first rollout); the masks `suppress_tokens`
  (ids never sampled), `bad_words_ids` (id sequences never completed) and `min_new_tokens` (no EOS before that many
  completion tokens) apply transformers' own processors, which change only which tokens are drawn: the log-probs stay
  log softmax(logits / T), as TRL's training log-probs ignore every processor.
- vLLM (use_vllm=True): `stop_token_ids` end a completion besides EOS; `stop` strings end it at the token completing the
  text (vLLM keeps that token in `token_ids`, which TRL decodes, so the text holds the stop string);
  `include_stop_str_in_output`, `skip_special_tokens` only change vLLM's own text (TRL decodes the ids) and go to vLLM as
  given; `presence_penalty`, `frequency_penalty`, `min_tokens` go to vLLM, and like `repetition_penalty` there they turn
  vLLM's log-probs off as the sampler's (vllm/backend.py `is_exact`); vLLM's masks `bad_words` (strings never completed:
  vLLM forbids the last token of each word's tokens, with and without a leading space, where the completion so far holds
  the others), `logit_bias` ({token id: bias in [-100, 100]} added to the logits) and `allowed_token_ids` (the only ids
  sampled) go to vLLM too and turn its log-probs off (renormalised over what the mask leaves, as under top_k): π_old is the
  trainer's. As TRL's, the trainer's π (the loss's, π_old's) is log softmax(logits / T) without any of them (TRL's
  `_get_per_token_logps_and_entropies` masks nothing); `structured_outputs` (a dict of vLLM's
  `StructuredOutputsParams`, config/structured_outputs.py) makes every completion match its regex, choice, JSON schema or
  grammar, and turns vLLM's log-probs off too (renormalised over the tokens the grammar allows).

A completion ended by a stop string or stop token counts as finished, as one ended by EOS (TRL counts a stop string's
completion as truncated: its last id is no EOS). Every other key is refused by `check`, naming it and the fix; `check_bad_words` counts vLLM's `bad_words` as vLLM tokenizes them
when the trainer is built (vLLM's limit, VLLM_MAX_NUM_BAD_WORDS).

Not here: applying the sampling values to the fields (grpo_config.py), sampling (generation/).
"""

from __future__ import annotations

import os

from .structured_outputs import KWARGS_KEY
from .structured_outputs import check as check_structured_outputs

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")  # fields of their own (TRL passes them to the engine)
TRANSFORMERS_KEYS = ("stop_strings", "eos_token_id")
TRANSFORMERS_MASK_KEYS = ("suppress_tokens", "bad_words_ids", "min_new_tokens")  # processors that only forbid tokens
VLLM_STOP_KEYS = ("stop", "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens")
VLLM_PENALTY_KEYS = ("presence_penalty", "frequency_penalty", "min_tokens")  # change vLLM's distribution: its log-probs go unused
VLLM_MASK_KEYS = ("bad_words", "logit_bias", "allowed_token_ids")  # vLLM's masks: the same (renormalised over what they leave)
OTHER_ENGINES_KEY = {"stop": "stop_strings", "stop_token_ids": "eos_token_id", "stop_strings": "stop", "eos_token_id": "stop_token_ids",
                     "min_tokens": "min_new_tokens", "min_new_tokens": "min_tokens", "bad_words_ids": "bad_words", "bad_words": "bad_words_ids"}
GROUP_KEYS = ("num_beams", "num_return_sequences", "n", "best_of", "num_beam_groups")  # GRPO's group is num_generations
LENGTH_KEYS = ("max_new_tokens", "max_tokens", "max_length")


def check(kwargs: dict, vllm: bool, max_completion_length: int) -> dict:
    """Every key of `generation_kwargs` checked for the engine; → the sampling fields it sets ({"top_k": 20}).

    Args:
        kwargs: the user's generation_kwargs.
        vllm: the run samples with vLLM (use_vllm=True / generation_backend="vllm").
        max_completion_length: T, which vLLM's `min_tokens` and transformers' `min_new_tokens` may not pass (vLLM refuses
            the request; transformers' would forbid EOS in every completion, each truncated).
    Raises:
        ValueError: a key fastgrpo does not honour for this engine, a stop key of the wrong type or structured outputs vLLM
            refuses (config/structured_outputs.py `check`); the message names
            the key, what TRL does with it and what to use instead.
    """
    engine = "vLLM's SamplingParams" if vllm else "transformers' GenerationConfig"
    fields = {}
    for key, value in kwargs.items():
        if key == "do_sample" and value is True:  # what GRPO always does: nothing to set
            continue
        if key in SAMPLING_KEYS:
            fields[key] = value  # TRL lets generation_kwargs override the sampling fields
        elif key == "structured_outputs" and vllm:
            check_structured_outputs(value, f"{KWARGS_KEY}={value!r}")
        elif key in (VLLM_STOP_KEYS + VLLM_PENALTY_KEYS + VLLM_MASK_KEYS if vllm else TRANSFORMERS_KEYS + TRANSFORMERS_MASK_KEYS):
            _check_type(key, value)
            if key in ("min_tokens", "min_new_tokens") and value > max_completion_length:
                why = "which vLLM refuses" if vllm else "so no completion could end before it is cut (EOS forbidden until then)"
                raise ValueError(f"generation_kwargs[{key!r}]={value} is more than max_completion_length={max_completion_length}, "
                                 f"{why}; lower it or raise max_completion_length.")
        else:
            raise ValueError(f"generation_kwargs[{key!r}]={value!r} cannot be honoured: {_why(key, vllm, engine)}")
    return fields


def _why(key: str, vllm: bool, engine: str) -> str:
    if key == "do_sample":
        return "GRPO samples (greedy groups have no spread to learn from); remove it."
    if key in LENGTH_KEYS:
        return "TRL sets the completion length from max_completion_length; use max_completion_length."
    if key in GROUP_KEYS:
        return "GRPO samples num_generations independent completions per prompt; use num_generations and remove it."
    did = "which refuses it (an unexpected keyword)" if vllm else "where transformers' generate never reads it"
    owner = "transformers'" if vllm else "vLLM's"
    if key in OTHER_ENGINES_KEY:
        also = " (strings: vLLM tokenizes them)" if key == "bad_words_ids" else " (ids: tokenizer(words, add_special_tokens=False).input_ids)" if key == "bad_words" else ""
        return f"it is {owner} key: TRL passes it to {engine}, {did}; use {OTHER_ENGINES_KEY[key]!r}{also}."
    if key == "suppress_tokens" and vllm:
        return (f"it is transformers' key: TRL passes it to {engine}, {did}; use vLLM's 'logit_bias' ({{id: -100}} for each id; "
                "the server clips biases to [-100, 100]) or 'allowed_token_ids', or set use_vllm=False.")
    if key in ("logit_bias", "allowed_token_ids") and not vllm:
        instead = "'suppress_tokens' (ids never sampled) for a bias of -100" if key == "logit_bias" else "'suppress_tokens' for the ids to leave out"
        return f"it is vLLM's key: TRL passes it to {engine}, {did}; use {instead}, or set use_vllm=True."
    if key == "structured_outputs":
        return (f"it is vLLM's key: TRL passes it to {engine}, which keeps it unused (no grammar masks the tokens); set "
                "use_vllm=True, or remove it.")
    if key in VLLM_PENALTY_KEYS:
        return f"it is vLLM's key: TRL passes it to {engine}, where transformers' generate never reads it; set use_vllm=True, or remove it."
    honoured = ", ".join((*SAMPLING_KEYS, *(VLLM_STOP_KEYS + VLLM_PENALTY_KEYS + VLLM_MASK_KEYS + ("structured_outputs",) if vllm else TRANSFORMERS_KEYS + TRANSFORMERS_MASK_KEYS)))
    return (f"TRL passes it to {engine}, where it would change what is sampled in a way fastgrpo's log-probs (π_old, the "
            f"sampler–trainer correction) do not follow, or means nothing for GRPO. fastgrpo honours {honoured}; remove it.")


def _check_type(key: str, value) -> None:
    """Refuse a value vLLM's SamplingParams refuses (its checks at the first request, after the model loaded) or one that
    would silently change the run: an empty stop string (vLLM: "stop cannot contain an empty string"; transformers' ends
    every completion at its first token), a negative token id (vLLM: out of vocabulary; transformers warns, then never
    stops there), a penalty outside vLLM's [-2, 2]; transformers' masks of the wrong shape (its processors raise at the first
    rollout: an empty bad word, a non-list); vLLM's masks of the wrong shape: `bad_words` as one string (vLLM's
    SamplingParams would ban each of its characters), a blank word (vLLM: "must tokenize to at least one token"), an empty
    `allowed_token_ids` (vLLM: "is not None and empty"), a `logit_bias` key that is no id (JSON's decimal strings, which
    vLLM's server takes, are ids) or a bias outside [-100, 100] or not finite (vLLM's server clips to that range, OpenAI's,
    and its colocated engine does not, so the two would sample differently); two `logit_bias` keys naming one id ("5" and
    "05", or 5 and "5": vLLM's int() keeps the last bias, silently); a bad word holding a lone surrogate (JSON's "\\ud800"
    alone: vLLM's tokenizer raises a TypeError)."""
    ok = {
        "stop": _strings(value), "stop_strings": _strings(value),
        "stop_token_ids": _all(value, int), "eos_token_id": _is_id(value) or _all(value, int),
        "include_stop_str_in_output": isinstance(value, bool), "skip_special_tokens": isinstance(value, bool),
        "presence_penalty": _is_number(value) and -2.0 <= value <= 2.0,
        "frequency_penalty": _is_number(value) and -2.0 <= value <= 2.0,
        "min_tokens": _is_int(value) and value >= 0, "min_new_tokens": _is_int(value) and value >= 0,
        "suppress_tokens": _all(value, int),
        "bad_words_ids": isinstance(value, (list, tuple)) and len(value) > 0 and all(_all(w, int) and len(w) > 0 for w in value),
        "bad_words": _all(value, str) and all(w.strip() for w in value),
        "allowed_token_ids": _all(value, int) and len(value) > 0,
        "logit_bias": isinstance(value, dict) and all(_bias_id(k) is not None and _is_number(b) and -100.0 <= b <= 100.0 for k, b in value.items()),
    }[key]
    if not ok:
        want = {"stop": "a non-empty string or a list of them (an empty one would end every completion at once)",
                "stop_strings": "a non-empty string or a list of them (an empty one would end every completion at once)",
                "stop_token_ids": "a list of token ids (each ≥ 0)", "eos_token_id": "a token id ≥ 0 or a list of them",
                "min_tokens": "an int ≥ 0", "min_new_tokens": "an int ≥ 0", "suppress_tokens": "a list of token ids (each ≥ 0)",
                "bad_words_ids": "a non-empty list of non-empty lists of token ids (each ≥ 0), as tokenizer(words, add_special_tokens=False).input_ids",
                "bad_words": "a list of strings, none blank (vLLM tokenizes each)", "allowed_token_ids": "a non-empty list of token ids (each ≥ 0)",
                "logit_bias": "a dict {token id: bias}, each id ≥ 0 (an int, or its decimal string as JSON writes it) and each bias a number in [-100, 100]"}.get(key, "a number in [-2, 2] (vLLM's range)" if "penalty" in key else "True or False")
        raise ValueError(f"generation_kwargs[{key!r}]={value!r}: give {want}.")
    if key == "logit_bias" and len({_bias_id(k) for k in value}) < len(value):  # "5" and "05" (or 5): vLLM's int() keeps the last
        raise ValueError(f"generation_kwargs['logit_bias']={value!r} names one token id twice (vLLM would keep only the last bias); "
                         "give each id once.")
    if key == "bad_words" and (odd := [w for w in value if any(0xD800 <= ord(ch) <= 0xDFFF for ch in w)]):  # JSON's "\ud800" alone
        raise ValueError(f"generation_kwargs['bad_words'] holds {odd[0]!r}, a lone surrogate (half of a JSON \\u escape pair), which "
                         "vLLM's tokenizer cannot encode (a TypeError at the first request, after the model loaded); give the whole character.")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_id(value) -> bool:
    return _is_int(value) and value >= 0


def _bias_id(key) -> int | None:
    """A `logit_bias` key as the token id it names (an int ≥ 0, or its decimal string: JSON's keys, which vLLM's server reads with
    int()), else None."""
    if _is_id(key):
        return key
    return int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _strings(value) -> bool:
    return (isinstance(value, str) and value != "") or (_all(value, str) and "" not in value)


def _all(value, kind) -> bool:
    return isinstance(value, (list, tuple)) and all(_is_id(v) if kind is int else isinstance(v, kind) for v in value)


def stop_strings(kwargs: dict | None, vllm: bool) -> tuple[str, ...]:
    """The strings that end a completion: vLLM's `stop` or transformers' `stop_strings`, as a tuple (() for none)."""
    value = (kwargs or {}).get("stop" if vllm else "stop_strings") or ()
    return (value,) if isinstance(value, str) else tuple(value)


def end_token_ids(kwargs: dict | None, vllm: bool, eos_token_ids, vocab_size: int | None = None) -> tuple[int, ...]:
    """The ids that end a completion: the model's EOS ids plus vLLM's `stop_token_ids`, or transformers' `eos_token_id`
    in their place (transformers' meaning: the whole set), sorted.

    Raises:
        ValueError: a given id ≥ `vocab_size` (the policy's embedding rows; None: not checked), which the model never
            samples: vLLM refuses it at the first request ("out-of-vocab token ids"), transformers never stops there.
    """
    kwargs = kwargs or {}
    key = "stop_token_ids" if vllm else "eos_token_id"
    given = kwargs.get(key, ())
    given = (given,) if isinstance(given, int) else tuple(given)
    beyond = [i for i in given if vocab_size is not None and i >= vocab_size]
    if beyond:
        raise ValueError(f"generation_kwargs[{key!r}]={kwargs[key]!r}: id {beyond[0]} is beyond the model's {vocab_size} tokens, so no "
                         "completion would end there; give ids below it (tokenizer.convert_tokens_to_ids(text) names one).")
    if not vllm and "eos_token_id" in kwargs:
        return tuple(sorted(set(given)))
    return tuple(sorted(set(eos_token_ids) | set(given if vllm else ())))


def masks(kwargs: dict | None, vllm: bool, vocab_size: int | None = None) -> dict:
    """transformers' masks (`suppress_tokens`, `bad_words_ids`, `min_new_tokens`) as given, ids as tuples; {} with vLLM.

    Raises:
        ValueError: an id ≥ `vocab_size` (the policy's embedding rows; None: not checked), which transformers' processors
            index the logits with: an IndexError at the first rollout, after the model loaded.
    """
    given = {k: v for k, v in (kwargs or {}).items() if k in TRANSFORMERS_MASK_KEYS and not vllm}
    for key in ("suppress_tokens", "bad_words_ids"):
        ids = given.get(key, ())
        beyond = [i for i in (ids if key == "suppress_tokens" else [i for word in ids for i in word]) if vocab_size is not None and i >= vocab_size]
        if beyond:
            raise ValueError(f"generation_kwargs[{key!r}]={ids!r}: id {beyond[0]} is beyond the model's {vocab_size} tokens; give ids "
                             "below it (tokenizer.convert_tokens_to_ids(text) names one).")
    if "suppress_tokens" in given:
        given["suppress_tokens"] = tuple(given["suppress_tokens"])
    if "bad_words_ids" in given:
        given["bad_words_ids"] = tuple(tuple(w) for w in given["bad_words_ids"])
    return given


def vllm_params(kwargs: dict | None, vocab_size: int | None = None) -> dict:
    """The keys that go to vLLM (penalties, masks, and the flags of vLLM's own text), as given but `logit_bias`'s keys as ints
    (vLLM's colocated SamplingParams indexes the logits with them; a server's JSON writes them as strings again).

    Raises:
        ValueError: a `logit_bias` or `allowed_token_ids` id ≥ `vocab_size` (the policy's embedding rows; None: not checked),
            which vLLM refuses at the first request ("out-of-vocab token ids"), after the model loaded.
    """
    given = {k: v for k, v in (kwargs or {}).items() if k in ("include_stop_str_in_output", "skip_special_tokens", *VLLM_PENALTY_KEYS, *VLLM_MASK_KEYS)}
    if "logit_bias" in given:
        given["logit_bias"] = {_bias_id(k): float(b) for k, b in given["logit_bias"].items()}
    for key in ("bad_words", "allowed_token_ids"):
        if key in given:
            given[key] = list(given[key])  # vLLM's SamplingParams takes lists
    for key in ("logit_bias", "allowed_token_ids"):
        beyond = [i for i in given.get(key, ()) if vocab_size is not None and i >= vocab_size]
        if beyond:
            raise ValueError(f"generation_kwargs[{key!r}]={kwargs[key]!r}: id {beyond[0]} is beyond the model's {vocab_size} tokens; give "
                             "ids below it (tokenizer.convert_tokens_to_ids(text) names one).")
    return given


def check_bad_words(kwargs: dict | None, vllm: bool, tokenizer) -> None:
    """vLLM's `bad_words` read as its `SamplingParams.update_from_tokenizer` reads them (vLLM 0.32), when the trainer is built
    with the tokenizer, before the model loads: each word, left-stripped, encoded without and with a leading space (the spaced
    form kept when it starts with another token and has as many tokens); vLLM refuses the request (at the first rollout,
    after the model and the engine loaded) when a word encodes to no token or the forms number more than
    `VLLM_MAX_NUM_BAD_WORDS` (128 unless that environment variable is set, as vLLM's envs read it).

    Raises:
        ValueError: naming the word, or the count and the limit, and the fix.
    """
    words = (kwargs or {}).get("bad_words") if vllm else None
    forms = 0
    for word in words or ():
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        if not plain:
            raise ValueError(f"generation_kwargs['bad_words'] holds {word!r}, which the tokenizer encodes to no token (vLLM refuses "
                             "it at the first request); remove it.")
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        forms += 2 if spaced and spaced[0] != plain[0] and len(spaced) == len(plain) else 1
    limit = int(os.environ.get("VLLM_MAX_NUM_BAD_WORDS", "128"))
    if forms > limit:
        raise ValueError(f"generation_kwargs['bad_words'] has {len(words)} words, {forms} token sequences as vLLM bans them (each "
                         f"word with and without a leading space), more than vLLM's VLLM_MAX_NUM_BAD_WORDS={limit}: vLLM refuses "
                         "the request at the first rollout. Give fewer words, or raise VLLM_MAX_NUM_BAD_WORDS.")
