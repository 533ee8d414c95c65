"""vLLM's structured outputs (TRL's `vllm_structured_outputs_regex`, `generation_kwargs["structured_outputs"]`), checked
before any model loads and resolved to the one dict every engine request carries.

TRL 1.16 (its `VLLMGeneration` and `VLLMClient.generate`): colocated, `SamplingParams(structured_outputs=
StructuredOutputsParams(regex=…))`, and a dict in generation_kwargs["structured_outputs"] becomes
`StructuredOutputsParams(**dict)`; both set, the regex wins with a warning. A server gets `"structured_outputs": {…}`
in the /v1/completions request (TRL's client lets the generation_kwargs dict win there; fastgrpo keeps the colocated
rule on both engines). Without vLLM TRL ignores both (transformers' GenerationConfig keeps the dict as an unused
attribute), so fastgrpo refuses them, naming use_vllm=True.

vLLM masks every token the grammar forbids before sampling, so its log-probs are renormalised over the allowed ones
(a forced token has log-prob 0): not the trainer's π; generation/vllm/backend.py `is_exact` then drops them.

Not here: sending them (generation/vllm/backend.py `sampling_params`, colocate.py, server.py).
"""

from __future__ import annotations

import importlib.util
import warnings

# vLLM 0.32's StructuredOutputsParams fields: exactly one constraint, and the options that shape it.
CONSTRAINTS = ("regex", "json", "choice", "grammar", "json_object", "structural_tag")
OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")
KWARGS_KEY = "generation_kwargs['structured_outputs']"


def check(value, name: str) -> None:
    """Refuse structured outputs vLLM would refuse at the first request (after the model and the engine loaded).

    Args:
        value: the dict for vLLM's `StructuredOutputsParams` ({"regex": "(yes|no)"}, {"choice": ["yes", "no"]}, …).
        name: how the user gave it, with the value, for the message ("vllm_structured_outputs_regex='(yes'").
    Raises:
        ValueError: not a dict; a key StructuredOutputsParams does not take; not exactly one constraint; an empty choice
            list, grammar, JSON schema or structural tag, json_object other than True (vLLM's own request checks); a
            constraint neither xgrammar nor guidance compiles (vLLM's "auto" backend tries xgrammar, then guidance;
            checked where vLLM is installed here: a server's trainer may not have it, and the server then checks).
    """
    if not isinstance(value, dict):
        raise ValueError(f"{name}: give a dict of vLLM's StructuredOutputsParams, e.g. {{'regex': '(yes|no)'}}.")
    unknown = sorted(set(value) - set(CONSTRAINTS + OPTIONS))
    given = [k for k in CONSTRAINTS if value.get(k) is not None]
    if unknown or len(given) != 1:
        what = f"unknown key(s) {', '.join(map(repr, unknown))}" if unknown else f"{len(given)} constraints ({', '.join(given) or 'none'})"
        raise ValueError(f"{name}: {what}; give exactly one of {', '.join(CONSTRAINTS)} (vLLM's StructuredOutputsParams), "
                         f"optionally with {', '.join(OPTIONS)}.")
    key, constraint = given[0], value[given[0]]
    empty = (key == "choice" and (not isinstance(constraint, list) or not constraint or not all(isinstance(c, str) for c in constraint))) \
        or (key in ("grammar", "json", "structural_tag") and isinstance(constraint, str) and not constraint.strip()) \
        or (key == "regex" and (not isinstance(constraint, str) or "\x00" in constraint)) or (key == "json_object" and constraint is not True)
    if empty:
        want = {"choice": "a non-empty list of strings", "regex": "a regex string without NUL", "json_object": "True"}.get(key, "a non-empty string or dict")
        raise ValueError(f"{name}: {key}={constraint!r} is refused by vLLM; give {want}.")
    if importlib.util.find_spec("vllm") is not None:
        _compiles(value, name)


def _compiles(value: dict, name: str) -> None:
    """vLLM's "auto" backend check (SamplingParams._validate_structured_outputs): xgrammar compiles it, else guidance.
    A vLLM whose validators live elsewhere than 0.32's modules is left to check at the first request, as a server does."""
    try:
        from vllm.exceptions import VLLMValidationError  # noqa: PLC0415 (optional; only here)
        from vllm.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: PLC0415
        from vllm.v1.structured_output.backend_guidance import validate_guidance_grammar  # noqa: PLC0415
        from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar  # noqa: PLC0415
    except ImportError:  # another vLLM's layout, or a grammar backend not installed: the engine checks at the first request
        return

    try:
        validate_xgrammar_grammar(SamplingParams(structured_outputs=StructuredOutputsParams(**value)))  # it rewrites a choice: a copy
        return
    except (ValueError, VLLMValidationError) as err:  # a NUL in a regex is a ValueError there
        xgrammar = err
    try:
        validate_guidance_grammar(SamplingParams(structured_outputs=StructuredOutputsParams(**value)))
    except (ValueError, VLLMValidationError) as err:
        why = f"xgrammar: {xgrammar}; guidance: {err}"
        raise ValueError(f"{name} does not compile to a grammar ({' '.join(why.split())}); fix it.") from None


def resolve(regex: str | None, kwargs: dict | None) -> dict | None:
    """The structured outputs every request carries: {"regex": vllm_structured_outputs_regex} over the generation_kwargs
    dict (TRL's colocated rule; `check_fields` warns when both are set); None: none."""
    return {"regex": regex} if regex is not None else (kwargs or {}).get("structured_outputs")


def check_fields(regex: str | None, kwargs: dict | None, vllm: bool) -> None:
    """GRPOConfig's `vllm_structured_outputs_regex` with its `generation_kwargs`, before any model loads (the dict itself is
    checked with the other generation_kwargs, config/generation_kwargs.py).

    Raises:
        ValueError: a regex without vLLM (TRL's transformers path ignores it), naming use_vllm=True; one `check` refuses.
    Warns:
        UserWarning: both are set; the regex wins (TRL's colocated warning, word for word).
    """
    if regex is None:
        return
    if not vllm:
        raise ValueError(f"vllm_structured_outputs_regex={regex!r} needs vLLM, which masks the tokens the regex forbids (TRL ignores it "
                         "without vLLM; fastgrpo's own sampler and transformers' generate have no grammar); set use_vllm=True, or remove it.")
    check({"regex": regex}, f"vllm_structured_outputs_regex={regex!r}")
    if (kwargs or {}).get("structured_outputs") is not None:
        warnings.warn("Both `structured_outputs_regex` and `generation_kwargs['structured_outputs']` are set; "
                      "`structured_outputs_regex` takes precedence.", UserWarning, stacklevel=2)
