"""Datasets: loading rows from a spec or a file, checking them, and the order prompts are drawn in.

A dataset is a `datasets.Dataset` with a "prompt" column (text, or a list of
chat messages) and any other columns, which reward functions receive as
keyword lists. Sources: a hub name, a local json/jsonl/csv/parquet file, or
`reasoning-gym:<task>[,<task>]` (procedural tasks with their own scorers,
generated locally, no network).

Not here: rendering and tokenising prompts (rollout/prompts.py), the built-in tasks (tasks/).
"""

from __future__ import annotations

import csv
import json
import os
import warnings
from urllib.parse import parse_qsl

import datasets
import torch
from datasets import Dataset, IterableDataset, load_dataset

from ..model.model_files import check_hub_repo
from ..rollout.prompts import is_chat
from ..tasks.reasoning_gym import reasoning_gym_dataset

LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
# Endings of data files, never of hub dataset names: a spec ending so is a local path, looked up on the disk only.
FILE_ENDINGS = (*LOCAL_FORMATS, ".tsv", ".txt", ".arrow", ".gz", ".zip", ".xlsx")
IMAGE_COLUMNS = ("image", "images")  # TRL 1.16 reads these as the prompts' images
GENERATED_ROWS = 1000  # rows generated for reasoning-gym and calculator specs when no size is given


def load_dataset_spec(spec: str, split: str = "train", size: int | None = None, seed: int = 0, config: str | None = None,
                      streaming: bool = False) -> Dataset | IterableDataset:
    """A Dataset from a command-line spec (an IterableDataset with `streaming`).

    Args:
        spec: "reasoning-gym:<task>[,<task>][?key=value&key=value]" (the query
            sets task difficulty, e.g. "reasoning-gym:basic_arithmetic?max_terms=2",
            and `few_shot=N` solved examples before each question),
            "calculator" (the built-in agent task, tasks/calculator.py), a local
            .json/.jsonl/.csv/.parquet file, a local dataset folder (its data files, read
            by `datasets.load_dataset` with splits by file name), or a hub dataset name (needs network).
        split, config, streaming: the split, configuration (`load_dataset`'s name) and streaming of a hub dataset or
            a dataset folder, as TRL's script loads it (`splits_apply`; TRL's --dataset_train_split, --dataset_config,
            --dataset_streaming); a file or a generated task has one split and no configuration.
        size: rows: generated for reasoning-gym and calculator specs (None: `GENERATED_ROWS`), the first
            `size` rows of a file or hub dataset (None: all; a warning when it holds fewer).
        seed: the seed of reasoning-gym and calculator specs.
    Raises:
        ValueError: a local-looking path that does not exist (no hub lookup), a
            local file with an unsupported extension, that is empty, or that
            cannot be parsed (file and line number), a reasoning-gym spec that
            names no task or settings it refuses, or a dataset `check_dataset`
            refuses (no prompt column, a missing or blank prompt: the row); a size below 1; a split the
            dataset lacks (naming those it has); a split, configuration or streaming for a file or a generated task.
    Warns:
        UserWarning: a file or hub dataset that holds fewer rows than `size`.
    """
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"{spec}: size={size!r}; give a number of rows, 1 or more (or None for the default).")
    path, generated = os.path.expanduser(spec), GENERATED_ROWS if size is None else size
    if not splits_apply(spec) and (split != "train" or config is not None or streaming):
        given = ", ".join(f"{k}={v!r}" for k, v in (("split", split), ("config", config), ("streaming", streaming)) if v not in ("train", None, False))
        raise ValueError(f"dataset {spec!r}: {given} apply to a hub dataset or a dataset folder; a file or a generated task has "
                         "one split (train) and no configuration: drop them (--dataset_train_split, --dataset_config, --dataset_streaming).")
    if splits_apply(spec):
        splits = dataset_splits(spec, config, streaming)
        if split not in splits:
            raise ValueError(f"dataset {spec!r} has no split {split!r}; it has {', '.join(splits)}: name one of them "
                             "(--dataset_train_split, --dataset_test_split).")
        label = f"{spec} ({split} split)"  # errors name the split: the test split is loaded too, when evaluated
        if streaming:
            stream = splits[split] if size is None else splits[split].take(size)
            check_dataset(list(stream.take(1)), label)  # its first row, as far as a stream is read before training
            return stream
        dataset = first_rows(splits[split], size, spec)
    elif spec.startswith("reasoning-gym:"):
        tasks, _, query = spec.split(":", 1)[1].partition("?")
        kwargs = {k: _number(v) for k, v in parse_qsl(query)}
        few_shot = kwargs.pop("few_shot", 0)
        if not isinstance(few_shot, int) or few_shot < 0:
            raise ValueError(f"{spec}: few_shot={few_shot!r}; give a number of solved examples, 0 or more.")
        dataset = reasoning_gym_dataset(
            [t.strip() for t in tasks.split(",") if t.strip()], size=generated, seed=seed, task_kwargs=kwargs, few_shot=few_shot
        )
    elif spec == "calculator":
        from ..tasks.calculator import calculator_dataset

        dataset = calculator_dataset(generated, seed)
    elif os.path.exists(path):
        dataset = first_rows(load_data_file(path), size, spec)
    elif looks_like_local_path(spec):
        raise ValueError(
            f"dataset {spec!r}: no such file (looked in {os.getcwd()}); give an existing .json/.jsonl/.csv/.parquet file, "
            "reasoning-gym:<task>, or a hub dataset name (org/name)."
        )
    check_dataset(dataset, label if splits_apply(spec) else spec)
    return dataset


def dataset_splits(spec: str, config: str | None, streaming: bool) -> dict:
    """Every split of a hub dataset or a local dataset folder, as TRL's script loads them (`load_dataset(name,
    name=config, streaming=…)`); a folder written by `save_to_disk` is read with `load_from_disk` (one Dataset: its
    "train" split).

    Raises:
        ValueError: a folder `datasets` cannot read (no data files, files whose columns differ, …), a folder holding a
            model (config.json and weights: datasets read its JSON files as rows and failed with a traceback), or a
            configuration for a `save_to_disk` folder, naming the fix;
            see `check_hub_repo` for a hub name.
    """
    path = os.path.expanduser(spec)
    if not os.path.isdir(path):
        check_hub_repo(spec, "dataset")  # one quick probe: offline, load_dataset retries for half a minute, then a traceback
        return load_dataset(spec, name=config, streaming=streaming)
    if any(os.path.isfile(os.path.join(path, f)) for f in ("dataset_dict.json", "state.json")):  # save_to_disk's files
        if config is not None:
            raise ValueError(f"dataset folder {spec!r} was written by save_to_disk: it has no configurations; drop config={config!r} (--dataset_config).")
        saved = datasets.load_from_disk(path)
        splits = dict(saved) if isinstance(saved, datasets.DatasetDict) else {"train": saved}
        return {k: v.to_iterable_dataset() for k, v in splits.items()} if streaming else splits
    if os.path.isfile(os.path.join(path, "config.json")) and any(f.endswith((".safetensors", ".bin")) for f in os.listdir(path)):
        raise ValueError(f"dataset folder {spec!r} holds a model (config.json and weights), not a dataset; give the dataset's folder "
                         "(train.jsonl, test.jsonl, …, or one written by save_to_disk) or a data file, and the model with --model.")
    try:
        return load_dataset(path, name=config, streaming=streaming)
    except (datasets.exceptions.DatasetNotFoundError, datasets.exceptions.DatasetGenerationError, FileNotFoundError, ValueError) as err:
        err = err.__cause__ or err if isinstance(err, datasets.exceptions.DatasetGenerationError) else err  # the file's own error
        raise ValueError(f"dataset folder {spec!r} cannot be read by datasets.load_dataset ({err}); give a folder of data files "
                         "(train.jsonl, test.jsonl, …), one written by save_to_disk, or a data file.") from err


def splits_apply(spec: str) -> bool:
    """Whether `spec` names a dataset with splits and configurations: a local dataset folder or a hub name (not
    reasoning-gym:…, calculator, or a data file)."""
    path = os.path.expanduser(spec)
    if spec.startswith("reasoning-gym:") or spec == "calculator" or os.path.isfile(path):
        return False
    return os.path.isdir(path) or not looks_like_local_path(spec)


def first_rows(dataset: Dataset, size: int | None, spec: str) -> Dataset:
    """The first `size` rows of a file or hub dataset (all of them for None), as `--max_train_samples` takes them in
    transformers' example scripts.

    Warns:
        UserWarning: the dataset holds fewer than `size` rows (all are used).
    """
    if size is None:
        return dataset
    if len(dataset) < size:
        warnings.warn(f"dataset {spec} holds {len(dataset)} rows, fewer than size={size} (--dataset_size); all are used.", stacklevel=3)
    return dataset.select(range(min(size, len(dataset))))


def looks_like_local_path(spec: str) -> bool:
    """True for a spec that can only mean a file on this machine: it starts with ./, ../, / or ~, ends like a
    data file (`FILE_ENDINGS`), or its first folder exists here. A hub name (org/name) does none of these."""
    first = spec.split("/", 1)[0]
    return spec.startswith((".", "/", "~")) or spec.lower().endswith(FILE_ENDINGS) or ("/" in spec and os.path.isdir(first))


def load_data_file(path: str) -> Dataset:
    """A local .json/.jsonl/.csv/.parquet file as a Dataset, its rows checked first, so a bad file is one clear line.

    Raises:
        ValueError: another extension, an empty file (no rows), or a row that
            cannot be parsed, naming the file and the line (`check_data_file`).
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in LOCAL_FORMATS:
        raise ValueError(f"dataset file {path!r}: use a .json, .jsonl, .csv or .parquet file.")
    rows = check_data_file(path, ext)
    if rows == 0:
        raise ValueError(f"dataset file {path!r} has no rows; give at least one row with a 'prompt'.")
    shown = not datasets.utils.are_progress_bars_disabled()
    datasets.utils.disable_progress_bars()  # a local file loads in moments: its progress bar would only bury the messages
    try:
        return load_dataset(LOCAL_FORMATS[ext], data_files=path, split="train")
    except Exception as err:  # datasets wraps the reader's own error (pandas, pyarrow) in a generic one
        cause = err
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__
        raise ValueError(f"dataset file {path!r} cannot be read as {LOCAL_FORMATS[ext]}: {cause}; fix the file.") from err
    finally:
        if shown:
            datasets.utils.enable_progress_bars()


def check_data_file(path: str, ext: str) -> int:
    """Parse a local data file once with the standard library (pyarrow for parquet); → its number of rows.

    Raises:
        ValueError: a line that does not parse or a row of the wrong shape, naming the file and the line (1-based).
    """
    if ext == ".parquet":
        import pyarrow.parquet

        try:
            return pyarrow.parquet.ParquetFile(path).metadata.num_rows
        except Exception as err:  # pyarrow.ArrowInvalid: not a parquet file
            raise ValueError(f"dataset file {path!r} is not a parquet file ({err}); write it with pandas.DataFrame.to_parquet.") from None
    if ext == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            rows = 0
            for row in reader:
                if header is not None and row and len(row) != len(header):
                    raise ValueError(
                        f"{path}, line {reader.line_num}: {len(row)} fields where the header has {len(header)} "
                        f"({', '.join(header)}); quote values that hold commas, or fix that line."
                    )
                rows += bool(row)
            return rows
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if ext == ".json" and text.lstrip().startswith("["):  # one JSON array of rows (else JSON lines, as datasets reads .json)
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {err.lineno}: not valid JSON ({err.msg} at column {err.colno}); fix that line.") from None
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise ValueError(f"{path}: row {i} is a JSON {type(row).__name__}, not an object with a 'prompt' field.")
        return len(rows)
    return check_json_lines(path)


def _number(text: str):
    """A query value as int, float, bool ("true"/"false", any case) or, failing those, the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def check_dataset(dataset, name: str = "train_dataset") -> None:
    """Refuse, before any compute, a dataset that cannot feed a GRPO run.

    Reads the "prompt" column once (a pass over the rows, no model).

    Raises:
        ValueError: no "prompt" column, no rows, an image column (`check_text_only`), or a row whose prompt is
            missing, blank ("", whitespace, no messages) or neither text nor
            chat messages, or a message whose content is not text (None outside a tool call), naming the
            row, counted from 0, and the fix.
    """
    if len(dataset) == 0:
        raise ValueError(f"{name} is empty; give it at least one prompt.")
    columns = getattr(dataset, "column_names", None) or list(dataset[0])
    if "prompt" not in columns:
        raise ValueError(f"{name} has no 'prompt' column (columns: {columns}); rename the column holding the prompts to 'prompt'.")
    check_text_only(columns, name)
    for i, prompt in enumerate(prompt_column(dataset)):
        if prompt is None:
            raise ValueError(f"{name} row {i} has no prompt (None); fill it in or drop the row.")
        if not isinstance(prompt, (str, list)):
            raise ValueError(f"{name} row {i}: prompt {prompt!r} is {type(prompt).__name__}; give text or a list of chat messages.")
        if isinstance(prompt, str) and not prompt.strip():
            raise ValueError(f"{name} row {i} has a blank prompt ({prompt!r}); the model needs text to continue. Fill it in or drop the row.")
        if isinstance(prompt, list) and not prompt:
            raise ValueError(f"{name} row {i} has no messages (prompt []); give at least one chat message, or drop the row.")
        if isinstance(prompt, list) and not is_chat(prompt):
            raise ValueError(
                f"{name} row {i}: prompt {str(prompt)[:80]} is a list but not chat messages; give text or "
                '[{"role": "user", "content": "..."}, ...].'
            )
        for j, message in enumerate(prompt if isinstance(prompt, list) else []):  # None is a tool call's content only
            if not isinstance(message["content"], (str, list)) and not (message["content"] is None and message.get("tool_calls")):
                raise ValueError(f"{name} row {i}, message {j} ({message['role']}): content {message['content']!r} is not text; "
                                 "the chat template would fail on it at the first rollout. Fill it in or drop the row.")


def check_text_only(columns: list[str], name: str) -> None:
    """Refuse TRL's image columns: fastgrpo trains text-only models, and a run would silently drop the images.

    Raises:
        ValueError: an "image" or "images" column (TRL 1.16 reads either as the prompts' images), naming it and the fix.
    """
    if images := [c for c in columns if c in IMAGE_COLUMNS]:
        raise ValueError(
            f"{name} has an {images[0]!r} column, which TRL reads as the prompts' images (its vision-language path); "
            "fastgrpo trains text-only models and would drop them. Remove or rename the column to train on the text "
            f"alone (dataset.remove_columns({images[0]!r})), or train the vision-language model with TRL."
        )


def prompt_column(dataset) -> list:
    """The "prompt" of every row, as one list (an Arrow column converts at once: ≈ 0.2 s per 100 k chat rows)."""
    if hasattr(dataset, "column_names"):
        return dataset["prompt"][:]
    return [row.get("prompt") for row in dataset]


def prompt_shapes(dataset, limit: int = 32) -> list[tuple[int, list]]:
    """(row, prompt) for the first chat prompt of each shape, up to `limit` shapes: what `prompts.check_renders` renders.

    A shape is the messages' roles in order, each content's kind (text, None, or its parts' types) and whether it
    calls tools: two prompts of one shape take the same path through a chat template. An IterableDataset gives its
    first row only (reading it through would consume the stream). Text prompts are not rendered: none is listed.
    """
    prompts = [next(iter(dataset), {}).get("prompt")] if isinstance(dataset, datasets.IterableDataset) else prompt_column(dataset)
    shapes: dict[tuple, tuple[int, list]] = {}
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, list) or not is_chat(prompt):
            continue
        shape = tuple((m["role"], _content_kind(m["content"]), bool(m.get("tool_calls"))) for m in prompt)
        shapes.setdefault(shape, (i, prompt))
        if len(shapes) == limit:
            break
    return list(shapes.values())


def _content_kind(content) -> object:
    if isinstance(content, list):  # a part's type as text: an unhashable one (a list) is still a kind
        return tuple(repr(part.get("type")) if isinstance(part, dict) else type(part).__name__ for part in content)
    return type(content).__name__


def check_json_lines(path: str) -> int:
    """Parse a .jsonl file line by line before `datasets` reads it, so a bad row is one clear line; → the rows.

    Raises:
        ValueError: a line that is not a JSON object, naming the file and the line number (1-based).
    """
    rows = 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            rows += 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {number}: not valid JSON ({err.msg} at column {err.colno}); fix or remove that line.") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}, line {number}: a JSON {type(row).__name__}, not an object with a 'prompt' field.")
    return rows


def rollouts_per_pass(size: int, batch: int) -> int:
    """Draws of `batch` prompts in one pass over `size` prompts: whole batches only, as TRL's `RepeatSampler` drops a
    pass's incomplete batch; 1 for a dataset smaller than a batch (cycled through, where TRL would train nothing)."""
    return max(size // batch, 1)


class PromptOrder:
    """The order prompts are drawn in: a seeded permutation per epoch, endless, TRL's `RepeatSampler` order.

    Every process holds the same order (same seed) and takes its own share of each draw, so no prompt is split or
    repeated across processes. A pass (epoch) is `per_pass` prompts: whole batches of `batch`, the permutation's last
    size mod batch left out, as TRL's `RepeatSampler` drops a pass's incomplete batch (another tail each pass when
    shuffled); a dataset smaller than one batch, where TRL would train nothing, is cycled through instead.

    Args:
        size: rows in the dataset.
        seed: epoch e's order is the (e + 1)-th `torch.randperm` of one generator seeded with it, as TRL's sampler's.
        shuffle: False keeps the dataset order (TRL's shuffle_dataset).
        batch: prompts per draw, all processes (a rollout's, or a DAPO round's: generation_batch_size / G).
    """

    def __init__(self, size: int, seed: int, shuffle: bool = True, batch: int = 1):
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.per_pass = min(rollouts_per_pass(size, batch) * batch, size)
        self.epoch, self.position, self.generator, self.drawn = 0, 0, torch.Generator().manual_seed(seed), []  # drawn: [epoch, its permutation]

    def _permutation(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        if self.drawn and self.drawn[0] > self.epoch:  # an earlier epoch (a loaded state): draw again from the start
            self.generator, self.drawn = torch.Generator().manual_seed(self.seed), []
        while not self.drawn or self.drawn[0] < self.epoch:
            self.drawn = [self.drawn[0] + 1 if self.drawn else 0, torch.randperm(self.size, generator=self.generator).tolist()]
        return self.drawn[1]

    def take(self, count: int) -> list[int]:
        """The next `count` row indices, wrapping into a new epoch as needed."""
        out = []
        while len(out) < count:
            order = self._permutation()
            chunk = order[self.position : min(self.position + count - len(out), self.per_pass)]
            out += chunk
            self.position += len(chunk)
            if self.position >= self.per_pass:
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
