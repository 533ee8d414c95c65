"""Sequence-classification reward models as reward functions (TRL's reward-model protocol).

`reward_funcs` may hold a reward model (a hub id, a local folder or a
`PreTrainedModel` instance) beside plain functions. `RewardModel` wraps one as
a callable with the reward-function protocol (rewards.py), scoring each
completion as TRL does: prompt + completion (chat messages rendered with the
reward tokenizer's chat template, text concatenated), right-padded, the model's
single logit at the last non-pad token, in no_grad. Special tokens are the
ones the model was trained with: a chat's come from the template (as
`apply_chat_template(tokenize=True)` gives them, nothing added), a text's from
the reward tokenizer (its BOS, as `tokenizer(text)` adds it). TRL 1.16 adds
none to text, so a reward model whose tokenizer adds BOS scores text prompts
on tokens it never saw.
A tokenizer without a pad token pads with EOS and the model's config is told
so (TRL's handling of pad == EOS).

Not here: calling reward functions and checking their values (rewards.py).
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel

from .prompts import apply_template, check_token_ids, conversation, is_conversational


CLASSIFIER_SUFFIX = "ForSequenceClassification"  # transformers' class names for a model with a scoring head


def looks_like_model(spec: str) -> bool:
    """True for a local folder or a hub id ("org/name"): what TRL loads as a reward model."""
    return os.path.isdir(os.path.expanduser(spec)) or (spec.count("/") == 1 and not spec.startswith((".", "/", "~")))


def own_tokenizer(model: PreTrainedModel, name: str, trusted: bool):
    """The tokenizer saved with a reward model (TRL's `AutoTokenizer.from_pretrained(get_config_model_id(config))`).

    Raises:
        ValueError: an instance built from a config (no path to load one from: transformers looked up its class name on
            the hub, a minute without a network), or a path without a tokenizer's files, naming the fix:
            reward_processing_classes.
    """
    if not model.config.name_or_path:
        raise ValueError(f"reward model {name!r} was built from a config, so it has no saved tokenizer to load; give its tokenizer "
                         "in reward_processing_classes (one per reward_funcs entry, None for functions).")
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trusted)
    except (OSError, ValueError) as err:
        raise ValueError(f"reward model {name!r}: its tokenizer cannot be loaded from there ({str(err).strip().splitlines()[0]}); "
                         "save the tokenizer beside the model (tokenizer.save_pretrained), or give it in reward_processing_classes.") from err


class RewardModel:
    """A sequence-classification model scoring prompt + completion; called like a reward function.

    Args:
        model: a hub id, a local folder, or a `PreTrainedModel` with one output label.
        processing_class: its tokenizer; default: loaded from the model's own path.
        init_kwargs: passed to `from_pretrained` when `model` is a name (GRPOConfig.model_init_kwargs); its
            `trust_remote_code` also reaches the config and the tokenizer (TRL's).
    Attributes:
        __name__: the model's folder or repository name (TRL's reward name; logged as rewards/<name>/mean and /std).
    Raises:
        ValueError: a model that is no sequence classifier (by its config's architectures before it loads, by
            its class for an instance, or a checkpoint without the classification head, which transformers
            would fill with random weights: its rewards would be noise); a model with more than one output
            label; weights on the meta device; no processing_class and no tokenizer to load (`own_tokenizer`);
            a tokenizer with neither a pad nor an EOS token.
    """

    def __init__(self, model: str | PreTrainedModel, processing_class=None, init_kwargs: dict | None = None):
        trusted = bool((init_kwargs or {}).get("trust_remote_code", False))
        if isinstance(model, str):
            from ..model.loading import resolve_model_path

            path = resolve_model_path(model)
            config = AutoConfig.from_pretrained(path, trust_remote_code=trusted)
            architectures = config.architectures or []
            if architectures and not any(a.endswith(CLASSIFIER_SUFFIX) for a in architectures):
                raise ValueError(f"reward model {model!r} is a {architectures[0]}, not a sequence classifier; give a reward model "
                                 f"(…{CLASSIFIER_SUFFIX} with one label) or a reward function.")
            if architectures and config.num_labels != 1:  # a trained head of another size (loading it as one label fails in transformers)
                raise ValueError(f"reward model {model!r} has {config.num_labels} labels; a reward model has one (num_labels=1).")
            kwargs = {"num_labels": 1, **(init_kwargs or {})}
            model, info = AutoModelForSequenceClassification.from_pretrained(path, output_loading_info=True, **kwargs)
            if info["missing_keys"]:
                raise ValueError(f"reward model {path!r} has no trained {', '.join(sorted(info['missing_keys'])[:2])} in its checkpoint: "
                                 "transformers would start that head from random weights and score noise; give a trained reward model.")
        name = model.config.name_or_path or type(model).__name__
        if not type(model).__name__.endswith(CLASSIFIER_SUFFIX):
            raise ValueError(f"reward model {name!r} is a {type(model).__name__}, not a sequence classifier; give a reward model "
                             f"(…{CLASSIFIER_SUFFIX} with one label) or a reward function.")
        if model.config.num_labels != 1:
            raise ValueError(f"reward model {name!r} has {model.config.num_labels} labels; a reward model has one (num_labels=1).")
        if any(p.is_meta for p in model.parameters()):  # `.to(device)` failed at the first rollout: "Cannot copy out of meta tensor"
            raise ValueError(f"reward model {name!r} has its weights on the meta device (built under init_empty_weights or "
                             "device_map='meta'): they hold no values to score with; load it with from_pretrained, or give its path.")
        tokenizer = processing_class if processing_class is not None else own_tokenizer(model, name, trusted)
        if tokenizer.pad_token_id is None:  # pad == EOS, and the model must know it to find the last real token
            if tokenizer.eos_token is None:
                raise ValueError(f"reward model {name!r}'s tokenizer has neither a pad nor an EOS token to pad its batches with; "
                                 "set tokenizer.pad_token and give it in reward_processing_classes.")
            tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id
        self.model, self.tokenizer = model.eval().requires_grad_(False), tokenizer
        self.__name__ = name.rstrip("/").split("/")[-1]
        self.autocast, self.chat_template_kwargs = nullcontext, {}

    def prepare(self, device: torch.device, autocast, chat_template_kwargs: dict | None = None) -> None:
        """Move the model to the policy's device, score under the policy's precision (`autocast`: a context
        factory) and render chats with the run's chat_template_kwargs (as TRL does)."""
        self.model.to(device)
        self.autocast, self.chat_template_kwargs = autocast, chat_template_kwargs or {}

    def texts(self, prompts: list, completions: list) -> list[str]:
        """What the model reads: chat prompt + completion through its chat template, or text concatenated (TRL).

        Raises:
            ValueError: its tokenizer's chat template cannot render a conversation (prompts.apply_template).
        """
        if is_conversational(prompts[0]):
            where = f"reward model {self.__name__!r}"
            return [apply_template(self.tokenizer, conversation(p, c), where, **self.chat_template_kwargs) for p, c in zip(prompts, completions)]
        return [p + c for p, c in zip(prompts, completions)]

    def check_renders(self, samples: dict[str, list[tuple[int, list]]], chat_template_kwargs: dict | None) -> None:
        """Render each sample chat prompt with a one-word reply through this model's chat template, before the policy
        loads: a reward tokenizer that cannot render the prompts is refused now, not after the first rollout.

        Args:
            samples: {dataset name: [(row, prompt)]} (run/datasets.prompt_shapes).
        Raises:
            ValueError: the template fails, naming this model, the dataset and row, the template's error and the fix.
        """
        reply = [{"role": "assistant", "content": "reply"}]
        for name, rows in samples.items():
            for i, prompt in rows:
                apply_template(self.tokenizer, conversation(prompt, reply), f"reward model {self.__name__!r}, {name} row {i}",
                               **(chat_template_kwargs or {}))

    @torch.no_grad()
    def __call__(self, /, prompts: list, completions: list, **kwargs) -> list[float]:
        """N prompts and completions → N rewards (the model's logit); special tokens as the model was trained with them.
        Dataset columns in `kwargs` are ignored (`self` is positional-only, so a column of any name, even "self", passes through)."""
        inputs = self.tokenizer(
            text=self.texts(prompts, completions), return_tensors="pt", padding=True, padding_side="right",
            add_special_tokens=not is_conversational(prompts[0]),  # a chat template writes its own special tokens
        ).to(self.model.device)
        self._check_fits(inputs["input_ids"], inputs["attention_mask"])
        with self.autocast():
            logits = self.model(**inputs).logits[:, 0]  # (N,)
        return logits.float().tolist()

    def _check_fits(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """Refuse inputs the model cannot read (it would fail in its embedding with "index out of range in self").

        Raises:
            ValueError: a scored text longer than the model's context (config.max_position_embeddings), or a token id
                beyond its embedding rows (its tokenizer is not its own), naming both sizes.
        """
        longest, embedding = getattr(self.model.config, "max_position_embeddings", None), self.model.get_input_embeddings()
        length = int(mask.sum(-1).max())
        if isinstance(longest, int) and length > longest:
            raise ValueError(f"reward model {self.__name__!r} reads at most {longest} tokens, but a prompt + completion holds {length}; "
                             "lower max_prompt_length / max_completion_length, or score with a model of a longer context.")
        check_token_ids(ids[mask.bool()].unsqueeze(0), getattr(embedding, "num_embeddings", None), [f"reward model {self.__name__!r}'s input"],
                        self.tokenizer)

