"""Prompts as the model sees them: chat or text, rendered with the chat template and tokenised, left-padded.

Not here: loading datasets (run/datasets.py), repeating prompts G times (rollout/collect.py).
"""

from __future__ import annotations

import torch


EMBEDDING_FIX = "use the model's own tokenizer, or grow the embedding first: model.resize_token_embeddings(len(tokenizer))"


def check_token_ids(rows, vocab_size: int | None, what: str | list[str], tokenizer=None) -> None:
    """Refuse token ids the model has no embedding row for, before they reach it (an embedding lookup fails with
    "index out of range in self", naming no size).

    Args:
        rows: token ids per row (lists or 1-D tensors).
        vocab_size: rows of the model's input embedding; None: not checked.
        what: each row's name for the message, or what a row is ("tool reply", "rollout_func's completion_ids"),
            then named by its index.
        tokenizer: names the token in the message when given.
    Raises:
        ValueError: an id outside [0, vocab_size), naming the row, the token, the id and both sizes, with the fix.
    """
    if vocab_size is None:
        return
    for i, ids in enumerate(rows):
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            known = tokenizer is not None and 0 <= bad < len(tokenizer)  # past it (2**40) the tokenizer overflows: no such token
            text = tokenizer.convert_ids_to_tokens(bad) if known else None
            token = f" {text!r}" if text is not None else ""
            sizes = f" (its tokenizer has {len(tokenizer)} tokens)" if tokenizer is not None else ""
            name = what[i] if isinstance(what, (list, tuple)) else f"{what} {i}"
            raise ValueError(
                f"{name} holds token{token} id {bad}, but the model's input embedding has {vocab_size} rows{sizes}; "
                f"{EMBEDDING_FIX}."
            )


def is_conversational(prompt) -> bool:
    """True for a prompt given as chat messages ([{"role": …, "content": …}, …])."""
    return isinstance(prompt, list) and len(prompt) > 0 and isinstance(prompt[0], dict) and "role" in prompt[0]


def is_chat(prompt: list) -> bool:
    """At least one message, each a dict with a "role" and a text or list "content" (text parts, images)."""
    return bool(prompt) and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in prompt)


def ends_with_assistant(prompt) -> bool:
    """True for chat messages whose last message is the assistant's: the model continues it (a prefilled reply)."""
    return is_conversational(prompt) and prompt[-1].get("role") == "assistant"


def conversation(prompt: list, completion: list) -> list:
    """Chat prompt + completion messages as one conversation; a continued assistant message takes the completion's text.

    Args:
        prompt: chat messages (`ends_with_assistant` or not).
        completion: [{"role": "assistant", "content": text}], as reward functions receive it.
    Returns:
        prompt + completion, or, when the prompt ends with an assistant message, that
        message with the completion's text appended (what the model actually wrote on).
    """
    if not ends_with_assistant(prompt):
        return prompt + completion
    last, text = prompt[-1]["content"], completion[-1]["content"]
    content = last + [{"type": "text", "text": text}] if isinstance(last, list) else last + text  # content parts: one more text part
    return prompt[:-1] + [{**prompt[-1], "content": content}]


def apply_template(tokenizer, messages: list, where: str, **kwargs) -> str:
    """`tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)`, with a failure the user can act on.

    Raises:
        ValueError: the template fails on the messages (or the tokenizer has none), naming `where` (e.g. "train_dataset
            row 3"), the messages, the template's error and the fix (`render_fix`); the template's exception is chained.
    """
    if tokenizer.chat_template is None:  # transformers' own error here is a paragraph naming no prompt
        raise ValueError(f"{where}: chat messages {str(messages)[:160]} need a chat template to render; {render_fix(tokenizer, messages)}.")
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except Exception as err:  # the template's own error: jinja2's TemplateError, or a TypeError/ValueError raised inside it
        raise ValueError(
            f"{where}: the chat template cannot render {str(messages)[:160]} ({type(err).__name__}: {err}); "
            f"{render_fix(tokenizer, messages)}."
        ) from err


def render_fix(tokenizer, messages: list) -> str:
    """The fix a chat-template failure's message names: a tokenizer without a template, content given as parts, or else."""
    if tokenizer.chat_template is None:
        return ("the tokenizer has no chat template: give text prompts, or set tokenizer.chat_template on the tokenizer you "
                "pass (processing_class; reward_processing_classes for a reward model)")
    if any(isinstance(m.get("content"), list) for m in messages):
        return ("its content is a list of parts, and this template takes content as text only: give each message's "
                "content as a str (join the text parts), or use a tokenizer whose chat template takes content parts")
    return "fix the prompt's messages, or the tokenizer's chat_template"


def check_renders(tokenizer, samples: dict[str, list[tuple[int, list]]], chat_template_kwargs: dict | None) -> None:
    """Render sample chat prompts with the tokenizer's chat template before any model loads, so one the template cannot
    render is refused now rather than at the first rollout (or the first evaluation).

    Args:
        tokenizer: the tokenizer the rollout renders with.
        samples: {dataset name: [(row, prompt)]}, e.g. each shape's first prompt (run/datasets.prompt_shapes).
        chat_template_kwargs: the template's extra variables (TRL's field).
    Raises:
        ValueError: a prompt the template fails on, naming the dataset and row (counted from 0, as `dataset[i]`),
            the template's error and the fix (`PromptEncoder.render`).
    """
    encoder = PromptEncoder(tokenizer, None, chat_template_kwargs)
    for name, rows in samples.items():
        for i, prompt in rows:
            encoder.render(prompt, where=f"{name} row {i}")


class PromptEncoder:
    """Prompts (text or messages) → left-padded token ids, cut to max_prompt_length.

    Chat prompts are rendered with the tokenizer's chat template and the
    generation prompt; the rendered text is tokenised without adding special
    tokens, since templates already carry their own BOS (TRL does the same).
    Text prompts get exactly what the tokenizer adds (e.g. its BOS), as
    `tokenizer(text)` would.
    Prompts longer than `max_prompt_length` tokens lose their left part.

    Args:
        tokenizer: a transformers tokenizer with padding_side "left".
        max_prompt_length: tokens, or None for no limit.
        chat_template_kwargs: extra variables for the chat template, e.g.
            {"enable_thinking": False} (TRL's chat_template_kwargs).
        vocab_size: rows of the model's input embedding: a prompt holding a token id beyond them is
            refused (`check_token_ids`); None: not checked.
        room: the most tokens a prompt may hold (after the cut to max_prompt_length): the model's context less
            max_completion_length (run/setup.check_context_length); a longer one is refused, as the vLLM backend
            refuses one its engine cannot hold with its completion; None: not checked.
    """

    def __init__(self, tokenizer, max_prompt_length: int | None, chat_template_kwargs: dict | None = None, vocab_size: int | None = None,
                 room: int | None = None):
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.vocab_size = vocab_size
        self.room = room

    def check(self, rows, what: str | list[str]) -> None:
        """`check_token_ids` against this encoder's model: other tokens that reach the model (a tool reply's)."""
        check_token_ids(rows, self.vocab_size, what, self.tokenizer)

    def render(self, prompt, tools: list | None = None, where: str = "a prompt") -> str:
        """The prompt text the model sees; `tools` (JSON schemas) are rendered by the chat template (agents).

        A conversation ending with an assistant message is continued
        (`continue_final_message=True`: the model writes on inside that message,
        as transformers' chat pipeline and TRL's `apply_chat_template` helper
        do); any other gets the generation prompt that opens a new assistant
        turn. TRL 1.16's GRPOTrainer always adds the generation prompt, which
        closes the final assistant message and starts another.

        Raises:
            ValueError: the chat template fails on the prompt (`apply_template`).
            TypeError: a prompt that is neither text nor chat messages.
        """
        if is_conversational(prompt):
            continues = ends_with_assistant(prompt)
            return apply_template(
                self.tokenizer, prompt, where, tools=tools or None, add_generation_prompt=not continues, continue_final_message=continues,
                **self.chat_template_kwargs,
            )
        if isinstance(prompt, str):
            return prompt
        raise TypeError(f"prompt {prompt!r} is neither text nor a list of chat messages.")

    def __call__(self, prompts: list, tools: list[list] | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Returns (prompt_ids (B, P), prompt_mask (B, P), number of prompts truncated); `tools`: per prompt, its tool schemas.

        Raises:
            ValueError: a prompt holding a token id the model has no embedding row for (`vocab_size`), one longer than
                `room` (its completion would not fit in the model's context: sampling past it fails on a model with learned
                positions and leaves the trained positions on any other), or one the chat template cannot render (`render`).
        """
        tools = tools or [None] * len(prompts)
        texts = [self.render(p, t) for p, t in zip(prompts, tools)]
        ids = [self.tokenizer(text, add_special_tokens=not is_conversational(p))["input_ids"] for text, p in zip(texts, prompts)]
        limit = self.max_prompt_length
        truncated = sum(1 for x in ids if limit is not None and len(x) > limit)
        if limit is not None:
            ids = [x[-limit:] for x in ids]
        self.check(ids, [f"prompt {text[-80:]!r}" for text in texts])
        if self.room is not None and (long := next((i for i, x in enumerate(ids) if len(x) > self.room), None)) is not None:
            raise ValueError(
                f"the prompt {texts[long][:60]!r}… has {len(ids[long])} tokens, more than the {self.room} the model's context "
                f"(config.max_position_embeddings) leaves beside max_completion_length. Set max_prompt_length={max(self.room, 1)} or "
                "less (prompts keep their last tokens), lower max_completion_length, or leave such rows out of the dataset."
            )
        width = max(len(x) for x in ids)
        pad = self.tokenizer.pad_token_id
        prompt_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
        prompt_mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        return prompt_ids, prompt_mask, truncated
