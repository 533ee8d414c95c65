"""The dataset objects GRPOTrainer takes, as TRL takes them, and reading an IterableDataset.

- train_dataset: a `datasets.Dataset` or list of dicts (random access: a
  seeded order per epoch, data.PromptOrder), or a `datasets.IterableDataset`
  (read in stream order, epoch after epoch, `StreamOrder`; needs max_steps,
  as in transformers).
- eval_dataset: a Dataset or list of dicts, or a `DatasetDict` / dict of them,
  evaluated one by one with metrics prefixed by the name (`eval_<name>_reward`),
  as transformers' Trainer does.

Anything else is refused with a ValueError naming its type, before any model loads.

Not here: the "prompt" column and emptiness checks (data.check_dataset).
"""

from __future__ import annotations

from collections.abc import Mapping

from datasets import IterableDataset

from .datasets import PromptOrder, check_dataset, check_text_only


def check_train_dataset(dataset, max_steps: int) -> None:
    """Refuse a train_dataset GRPOTrainer cannot read.

    Raises:
        ValueError: a dict/DatasetDict (of splits or of columns: the fix for each), an object without rows (a pandas
            DataFrame: the conversion named), an IterableDataset without
            max_steps or without a "prompt" column, an image column (datasets.check_text_only), and what check_dataset refuses.
    """
    if isinstance(dataset, IterableDataset):
        if max_steps <= 0:
            raise ValueError("train_dataset is an IterableDataset, which has no length; set max_steps (as transformers requires).")
        first = next(iter(dataset), None)
        if first is None or "prompt" not in first:
            raise ValueError(f"train_dataset (IterableDataset) yields {'no rows' if first is None else f'rows without a prompt column (columns: {list(first)})'}; give rows with a 'prompt'.")
        check_text_only(list(first), "train_dataset")
        return
    if isinstance(dataset, Mapping) and dataset and all(isinstance(v, (list, tuple)) for v in dataset.values()):
        raise ValueError(f"train_dataset is a {type(dataset).__name__} of columns {list(dataset)}; make it a dataset: "
                         "datasets.Dataset.from_dict(rows).")
    if isinstance(dataset, Mapping):
        raise ValueError(f"train_dataset is a {type(dataset).__name__} of splits {list(dataset)}; pass one split, e.g. dataset['train'].")
    if not has_rows(dataset):
        raise ValueError(f"train_dataset has type {type(dataset).__name__}; give a datasets.Dataset, an IterableDataset or a list of "
                         f"dicts{PANDAS_FIX if is_dataframe(dataset) else ''}.")
    check_dataset(dataset)


PANDAS_FIX = " (a pandas DataFrame: datasets.Dataset.from_pandas(df))"


def is_dataframe(dataset) -> bool:
    """A pandas DataFrame (its [0] is a column lookup, not a row), known without importing pandas."""
    return any(c.__module__.startswith("pandas") and c.__name__ == "DataFrame" for c in type(dataset).__mro__)


def eval_sets(eval_dataset) -> dict:
    """{metric prefix: rows} for an eval_dataset: {"eval": ds}, or {"eval_<name>": ds} for each entry of a dict.

    An IterableDataset is evaluated as TRL evaluates it: read through once per evaluation
    (evaluation.mean_rewards); here only its first row is checked.

    Raises:
        ValueError: a type without rows, or an IterableDataset without a first row or a prompt column
            (the message names the type or the columns), an image column (datasets.check_text_only); a dict with no
            dataset in it (nothing would be evaluated).
    """
    if isinstance(eval_dataset, Mapping) and not eval_dataset:
        raise ValueError("eval_dataset is an empty dict: nothing would be evaluated; give datasets by name ({'name': rows}), one dataset, or None.")
    named = {f"eval_{k}": v for k, v in eval_dataset.items()} if isinstance(eval_dataset, Mapping) else {"eval": eval_dataset}
    for prefix, ds in named.items():
        if isinstance(ds, IterableDataset):
            first = next(iter(ds), None)
            if first is None or "prompt" not in first:
                raise ValueError(f"{prefix} dataset (IterableDataset) yields {'no rows' if first is None else f'rows without a prompt column (columns: {list(first)})'}; give rows with a 'prompt'.")
            check_text_only(list(first), f"{prefix} dataset")
            continue
        if not has_rows(ds):
            raise ValueError(f"{prefix} dataset has type {type(ds).__name__}; give a datasets.Dataset, a list of dicts, or a dict of "
                             f"them{PANDAS_FIX if is_dataframe(ds) else ''}.")
        check_dataset(ds, f"{prefix} dataset")
    return named


def named_eval_set(sets: dict | None, name: str):
    """The set called `name` in a trainer's dict eval_dataset (its `eval_sets`; Trainer's `self.eval_dataset[name]`),
    for `evaluate(name)` and `get_eval_dataloader(name)`.

    Raises:
        KeyError: no set of that name (a single eval_dataset has none), naming the sets there are.
    """
    names = {set_name[len("eval_"):]: rows for set_name, rows in (sets or {}).items() if set_name != "eval"}
    if name not in names:
        raise KeyError(f"eval_dataset={name!r}: the trainer's eval_dataset has no set of that name (its named sets: {sorted(names)}).")
    return names[name]


def has_rows(dataset) -> bool:
    """True for random-access rows of dicts (a datasets.Dataset, a list of dicts), empty or not."""
    if isinstance(dataset, (str, bytes)) or is_dataframe(dataset) or not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        return False
    return len(dataset) == 0 or isinstance(dataset[0], Mapping)


class StreamOrder:
    """Rows of an IterableDataset in stream order, epoch after epoch; resumable by (epoch, position).

    Every process reads the same stream and takes its own share of each draw
    (as with data.PromptOrder). `set_epoch(e)` is called at each epoch's
    start, so a shuffled IterableDataset reshuffles as under transformers.

    Args:
        dataset: a `datasets.IterableDataset` with a "prompt" column.
    """

    size = per_pass = None  # unknown length

    def __init__(self, dataset: IterableDataset):
        self.dataset = dataset
        self.epoch, self.position = 0, 0
        self._rows = None

    def take(self, count: int) -> list[dict]:
        """The next `count` rows, starting a new epoch when the stream ends."""
        out: list[dict] = []
        while len(out) < count:
            if self._rows is None:
                self.dataset.set_epoch(self.epoch)
                self._rows = iter(self.dataset.skip(self.position) if self.position else self.dataset)
            row = next(self._rows, None)
            if row is None:
                self.epoch, self.position, self._rows = self.epoch + 1, 0, None
                continue
            out.append(row)
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position, self._rows = state["epoch"], state["position"], None


def prompt_order(train_dataset, args):
    """The order training prompts are drawn in: the stream's own (`StreamOrder`) for an IterableDataset, else a
    seeded permutation per epoch of whole rollouts (`datasets.PromptOrder`, data_seed or seed; shuffle_dataset=False: in order)."""
    if isinstance(train_dataset, IterableDataset):
        return StreamOrder(train_dataset)
    return PromptOrder(len(train_dataset), args.data_seed if args.data_seed is not None else args.seed, args.shuffle_dataset, args.prompts_per_rollout)
