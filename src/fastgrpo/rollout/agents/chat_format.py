"""Rendering tools into prompts and tool calls out of completions: the chat template side of agent training.

A tool-calling conversation needs two things from the tokenizer (TRL 1.16's
requirements): a chat template that renders `tools=`, assistant `tool_calls`
and `tool` messages, and a `response_template` that transformers'
`tokenizer.parse_response` uses to read tool calls back out of a completion.

SmolLM2's own template (ChatML) renders neither, so fastgrpo ships
`CHATML_TOOLS_TEMPLATE`: SmolLM2's template (its default system line kept)
with Qwen2.5's tool format, which is ChatML too:

    <|im_start|>system … # Tools … <tools>{json schema per line}</tools> … <|im_end|>
    <|im_start|>assistant
    <tool_call>
    {"name": "multiply", "arguments": {"a": 3, "b": 4}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    12
    </tool_response><|im_end|>

`prepare_tool_tokenizer` installs it (and `CHATML_RESPONSE_TEMPLATE`) on a
ChatML tokenizer whose template has no tool support; any other tokenizer must
support tool calling itself, as TRL requires. One that does but has no
`response_template` (Qwen2.5's, Qwen3's: TRL's GRPOTrainer calls
`add_response_schema` for them) gets TRL's response template for the format
its template renders a sentinel tool call in (`recognise_tool_call_format`:
Hermes/Qwen JSON, Qwen3.5 XML, Llama 3.1 JSON).

Not here: calling the tools (tools.py), the multi-turn loop (multiturn.py).
"""

from __future__ import annotations

import copy
import re

from jinja2 import TemplateError

CHATML_TOOLS_TEMPLATE = (
    "{%- set default_system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set system = default_system %}{%- set rest = messages %}{%- endif %}"
    "{{- '<|im_start|>system\\n' + system }}"
    "{%- if tools %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>' }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- for message in rest %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{%- set call = call['function'] if 'function' in call else call %}"
    "{%- if (message['content'] or '') or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}"
    "{%- if call['arguments'] is string %}{{- call['arguments'] }}{%- else %}{{- call['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + (message['content'] | string) + '\\n</tool_response>' }}"
    "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- else %}{%- for part in message['content'] %}"  # text parts joined
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- else %}{{- raise_exception('a ' + part['type'] + ' content part: "
    "fastgrpo trains text-only models; give text parts ({\"type\": \"text\", \"text\": ...}) or a str') }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# TRL 1.16's response templates, copied as data from the module trl.chat_template_utils (`qwen3_template`,
# `qwen3_5_template`, `llama3_template`; TRL's `add_response_schema` sets them for the templates it knows by their
# whole text). TRL uses `qwen3_template` for Qwen2.5, Qwen3, Qwen3-2507 and Qwen3-VL alike.
THINK_FIELD = {"open": "<think>", "close_pattern": r"</think>\s*", "content": "text"}  # Qwen3's and Qwen3.5's reasoning
IM_END_CONTENT = {"close_pattern": r"<\|im_end\|>\s*", "content": "text"}  # ChatML's text up to the turn's end
QWEN3_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": THINK_FIELD,
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": IM_END_CONTENT,
    },
}

# transformers' response_template (5.13+) for CHATML_TOOLS_TEMPLATE: TRL's Qwen3 template without <think>.
CHATML_RESPONSE_TEMPLATE = {**QWEN3_RESPONSE_TEMPLATE,
                            "fields": {k: v for k, v in QWEN3_RESPONSE_TEMPLATE["fields"].items() if k != "reasoning_content"}}

QWEN3_5_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": THINK_FIELD,
        "tool_calls": {
            "open_pattern": r"<tool_call>\s*<function=(?P<name>[^\n>]+)>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "xml-inline",
            "content_args": {
                "tag_pattern": r"<parameter=(?P<key>[^>\n]+)>\s*(?P<value>.*?)\s*</parameter>",
                "value_parser": {"name": "text"},  # TRL's on transformers >= 5.15: typed by the tools' schemas
            },
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
        },
        "content": IM_END_CONTENT,
    },
}

LLAMA3_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "fields": {
        "tool_calls": {
            "open_pattern": r'\{"name":\s*"(?P<name>[^"]+)",\s*"parameters":\s*',
            "close_pattern": r"\}<\|eot_id\|>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
        },
        "content": {"close_pattern": r"<\|eot_id\|>\s*", "content": "text"},
    },
}

_SENTINELS = ("tool_name_a8f3", "arg_key_b9d4", "arg_val_d6e7", "tool_content_c4f9")

# The tool-call formats fastgrpo recognises from the sentinel exchange's rendering: (name, how the assistant turn
# with the sentinel call renders, the response template that parses it back).
_THINK = r"(?:<think>.*?</think>\s*)?"
TOOL_CALL_FORMATS = (
    ("Hermes/Qwen JSON (Qwen2.5, Qwen3)", re.compile(
        r"<\|im_start\|>assistant\n" + _THINK + r'<tool_call>\n\{"name": "tool_name_a8f3", "arguments": '
        r'\{"arg_key_b9d4": "arg_val_d6e7"\}\}\n</tool_call><\|im_end\|>', re.S), QWEN3_RESPONSE_TEMPLATE),
    ("Qwen3.5 XML", re.compile(
        r"<\|im_start\|>assistant\n" + _THINK + r"<tool_call>\n<function=tool_name_a8f3>\n<parameter=arg_key_b9d4>\n"
        r"arg_val_d6e7\n</parameter>\n</function>\n</tool_call><\|im_end\|>", re.S), QWEN3_5_RESPONSE_TEMPLATE),
    ("Llama 3.1 JSON", re.compile(
        r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n"
        r'\{"name": "tool_name_a8f3", "parameters": \{"arg_key_b9d4": "arg_val_d6e7"\}\}<\|eot_id\|>'), LLAMA3_RESPONSE_TEMPLATE),
)


def _render_tool_exchange(tokenizer) -> str | None:
    """The chat template's rendering of user → assistant calling a sentinel tool → the tool's reply; None when it fails."""
    if tokenizer.chat_template is None:
        return None
    call = {"type": "function", "function": {"name": _SENTINELS[0], "arguments": {_SENTINELS[1]: _SENTINELS[2]}}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": _SENTINELS[0], "content": _SENTINELS[3]},
    ]
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False)
    except (TemplateError, TypeError):
        return None


def supports_tool_calling(tokenizer) -> bool:
    """True when the chat template renders a whole user → assistant tool call → tool exchange (TRL's check).

    Every part must appear in the rendered text: the call's name, its argument
    key and value, and the tool message; templates that drop either side fail.
    A template that raises while rendering is False (nothing raised). Source:
    TRL 1.16's `supports_tool_calling` (trl.chat_template_utils).
    """
    rendered = _render_tool_exchange(tokenizer)
    return rendered is not None and all(s in rendered for s in _SENTINELS)


def recognise_tool_call_format(tokenizer) -> tuple[str, dict] | None:
    """The tool-call format the chat template renders, as (name, transformers response_template), or None.

    Read from what the template renders for a sentinel tool call (not by comparing
    whole template texts, as TRL's `add_response_schema` does), so a template that
    differs from Qwen's or Llama's elsewhere but writes tool calls alike is
    recognised. The templates are TRL 1.16's (`qwen3_template`, `qwen3_5_template`,
    `llama3_template` of the module trl.chat_template_utils). Returns a copy the
    caller may keep; raises nothing (a template that cannot render is None).
    """
    rendered = _render_tool_exchange(tokenizer)
    if rendered is None:
        return None
    for name, rendering, template in TOOL_CALL_FORMATS:
        if rendering.search(rendered):
            return name, copy.deepcopy(template)
    return None


def prepare_tool_tokenizer(tokenizer) -> tuple[object, str | None]:
    """A tokenizer that renders and parses tool calls, and a one-line notice when fastgrpo set its template.

    - A template that supports tool calling and has a `response_template` is kept.
    - One that supports tool calling without a `response_template` (Qwen2.5's, Qwen3's: TRL's `add_response_schema`
      sets one for them) gets, on a shallow copy, the response template of the tool-call format it renders
      (`recognise_tool_call_format`: Hermes/Qwen JSON, Qwen3.5 XML, Llama 3.1 JSON).
    - A ChatML template without tool support (SmolLM2's) gets, on a shallow copy, `CHATML_TOOLS_TEMPLATE` and
      `CHATML_RESPONSE_TEMPLATE`.
    The caller's tokenizer is left as it was.

    Raises:
        ValueError: a template that supports no tool calling and is not ChatML, or one that renders tool calls in
            a format fastgrpo does not recognise and has no `response_template` (the message names the fixes:
            `trl.chat_template_utils.add_response_schema(tokenizer)` or setting `tokenizer.response_template`).
    """
    if supports_tool_calling(tokenizer):
        if getattr(tokenizer, "response_template", None) is not None:
            return tokenizer, None
        recognised = recognise_tool_call_format(tokenizer)
        if recognised is None:
            raise ValueError(
                "the tokenizer's chat template renders tools but has no response_template to parse tool calls with, and "
                "fastgrpo does not recognise its tool-call format (it knows Hermes/Qwen JSON, Qwen3.5 XML, Llama 3.1 JSON). "
                "Set one before training: `from trl.chat_template_utils import add_response_schema; "
                "tokenizer = add_response_schema(tokenizer)` (for the templates TRL knows), or set "
                "tokenizer.response_template yourself (transformers' response parsing docs), and pass it as processing_class."
            )
        name, response_template = recognised
        tokenizer = copy.copy(tokenizer)
        tokenizer.response_template = response_template
        notice = f"the tokenizer has no response_template; its chat template writes {name} tool calls: parsing them with TRL's template for it."
        return tokenizer, notice
    template = tokenizer.chat_template or ""
    if "<|im_start|>" not in template or "<|im_end|>" not in template:
        raise ValueError(
            "the chat template does not support tool calling (it must render user → assistant with tool_calls → tool). "
            "Pass a processing_class whose template does, or a ChatML model such as SmolLM2 (fastgrpo ships a tool template for it)."
        )
    tokenizer = copy.copy(tokenizer)
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    tokenizer.response_template = CHATML_RESPONSE_TEMPLATE
    return tokenizer, "the chat template has no tool calling; using fastgrpo's ChatML tool template (Qwen2.5's <tool_call> format)."


def parse_assistant(tokenizer, ids: list[int], prefix: list[int], tools: list) -> dict:
    """One completion turn → an assistant message, with `tool_calls` when it made any (TRL's `parse_response`).

    Args:
        ids: the turn's tokens (up to and including its EOS, if any).
        prefix: the tokens before it (prompt and earlier turns): the parser anchors on the assistant header.
        tools: the tools the prompt offered (callables or schemas): arguments are typed by their schema.
    Returns:
        {"role": "assistant", "content": str, optionally "tool_calls": [{"type": "function", "function":
        {"name", "arguments"}}]}; a turn the parser cannot read (malformed JSON, cut short, arguments nested
        deeper than Python's recursion limit: a sampled `[[[[…`, where TRL's fallback raises) is plain content, as TRL falls back.
    """
    try:
        parsed = tokenizer.parse_response(ids, prefix=prefix, tools=tools or None)
        if parsed is None:
            raise ValueError("nothing parsed")
        content = parsed.get("content")
        parsed["content"] = content.removesuffix(tokenizer.eos_token) if isinstance(content, str) else ""
        calls = parsed.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise ValueError("tool_calls is not a list")
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise ValueError("a tool call without a name")
                if not isinstance(function.get("arguments"), dict):
                    function["arguments"] = {} if function.get("arguments") is None else function["arguments"]
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError):  # RecursionError: JSON nested past Python's limit
        parsed = {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}
    return parsed


def _dummy_turns(tool_messages: list[dict]) -> list[dict]:
    """TRL's dummy conversation the tool messages follow: a user turn, then an assistant turn calling the first one's tool."""
    call = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    return [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": call}]


# How much a tokenizer's normaliser may shorten text (in UTF-8 bytes) before it is split into tokens: Unicode NFKC maps a
# 4-byte character to a 1-byte one at most ("𝐀" → "A"). No chat model's normaliser deletes text (BERT's strips it).
NORMALISED_SHRINK = 4


def longest_token_bytes(tokenizer) -> int:
    """An upper bound on the bytes of text one token stands for: the longest UTF-8 vocabulary string of the tokenizer.

    A byte-level BPE string spells each byte as one character of 1–2 bytes; SentencePiece spells a space "▁" (3 bytes)
    and a fallback byte "<0x0A>" (6); an added token is its text. So a text of b bytes is at least
    b / (NORMALISED_SHRINK · this) tokens (`tool_suffix_floor`). Reads the vocabulary once (49k strings: ~30 ms).
    """
    return max(len(token.encode()) for token in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))) if token)


def tool_suffix_floor(tokenizer, tool_messages: list[dict], chat_template_kwargs: dict, token_bytes: int) -> int:
    """A lower bound on `len(tool_suffix_ids(tool_messages))` found without tokenising the replies' contents, so a tool
    reply of a million characters is known to pass a budget of a few hundred tokens in milliseconds (tokenising it took
    ~2 s; TRL's `_get_tool_suffix_ids` tokenises it whole before its length check drops it).

    The rendered text of b bytes is at least b / (NORMALISED_SHRINK · token_bytes) tokens; the suffix is the tokens
    after an index no larger than the token count of the same rendering with every content empty (the turns before the
    replies end at an EOS special token, which the tokenizer splits on first, so the contents cannot move it).

    Args:
        token_bytes: `longest_token_bytes(tokenizer)`.
    Returns:
        An int ≤ the suffix's token count (≤ 0 when nothing can be said).
    """
    dummy = _dummy_turns(tool_messages)
    text = tokenizer.apply_chat_template(dummy + tool_messages, tokenize=False, add_generation_prompt=True, **chat_template_kwargs)
    empty = [{**m, "content": ""} for m in tool_messages]
    before = tokenizer.apply_chat_template(dummy + empty, tokenize=True, return_dict=False, add_generation_prompt=True, **chat_template_kwargs)
    return -(-len(text.encode()) // (NORMALISED_SHRINK * token_bytes)) - len(before)


def tool_suffix_ids(tokenizer, tool_messages: list[dict], chat_template_kwargs: dict) -> list[int]:
    """The tokens that follow an assistant turn's EOS to hand `tool_messages` back and open the next assistant turn.

    TRL's `_get_tool_suffix_ids`: render a dummy conversation with and without
    the tool messages (generation prompt on) and keep the difference, so the
    next turn continues by token concatenation, never by re-tokenising the
    conversation.

    A template that renders the assistant turn itself differently once a tool
    message follows (Qwen3's drops the turn's `<think>` block) still gives the
    tokens after that turn's EOS: the turn's own tokens are the model's, never
    re-rendered. TRL gets the same suffix by swapping in its training template
    (`get_training_chat_template`, e.g. qwen3_training.jinja).

    Raises:
        ValueError: a template that is not prefix-preserving before the assistant turn (what precedes it renders
            differently), or whose longer rendering has no EOS ending that turn, naming TRL's training template as the fix
            (checked before the model loads: `check_tool_replies`).
    """
    dummy = _dummy_turns(tool_messages)
    prefix = tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=False, **chat_template_kwargs)
    full = tokenizer.apply_chat_template(
        dummy + tool_messages, tokenize=True, return_dict=False, add_generation_prompt=True, **chat_template_kwargs
    )
    eos = [i for i, token in enumerate(prefix) if token == tokenizer.eos_token_id]
    prefix = prefix[: eos[-1] + 1] if eos else prefix  # the turn ends at its EOS; the template's "\n" belongs to the suffix
    if full[: len(prefix)] == prefix:
        return full[len(prefix) :]
    # Only the assistant turn (after the EOS before it) may differ: the suffix then starts after the full rendering's
    # EOS that ends that turn (the same count of EOS tokens in).
    before = eos[-2] + 1 if len(eos) >= 2 else None
    full_eos = [i for i, token in enumerate(full) if token == tokenizer.eos_token_id]
    if before is None or full[:before] != prefix[:before] or len(full_eos) < len(eos):
        raise ValueError(
            "the chat template is not prefix-preserving: a tool message changes how the turns before it render, so a tool reply "
            "cannot be appended as tokens (TRL refuses it too, when the trainer is built). Give a processing_class whose template "
            "renders each turn the same whatever follows it; for the models TRL knows, its training template: "
            "`tokenizer.chat_template = trl.chat_template_utils.get_training_chat_template(tokenizer)`."
        )
    return full[full_eos[len(eos) - 1] + 1 :]


def check_tool_replies(tokenizer, chat_template_kwargs: dict) -> None:
    """Render a sentinel tool reply as `tool_suffix_ids` renders each one, before the model loads: a template it cannot
    append a reply with failed at the first tool call, after the model loaded and the first turns were sampled. TRL
    checks the same property when its trainer is built (`is_chat_template_prefix_preserving`).

    Raises:
        ValueError: `tool_suffix_ids`'s, naming the fix.
    """
    tool_suffix_ids(tokenizer, [{"role": "tool", "name": _SENTINELS[0], "content": _SENTINELS[3]}], chat_template_kwargs)
