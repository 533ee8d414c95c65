"""`environment_factory` as TRL 1.16 takes it: one environment per rollout row, its public methods as tools.

An environment is a class whose instances hold one episode's state:

- `reset(**row) -> str | list | None` starts an episode from the dataset row; a string
  (or a list of content parts, TRL's multimodal form) is appended to the row's last user message (the first observation);
- every other public method (no leading `_`) is a tool the model may call,
  described by its type hints and docstring like any tool (tools.py);
- an optional `get_reward()` (sync or async) scores the finished episode: it
  becomes one more reward function, weight 1, named after the class.

`environment_factory` is a class (or any zero-argument callable), or a dict
{name: factory} that routes each row by its `environment` column (only that
environment's tools are offered in its prompt). Instances are made once and
reused: a rollout of N rows takes N instances from a pool, growing it only
when it needs more than it holds ("construct once, reset often"). Two per
factory are made when the trainer is built (a prompt's G ≥ 2 rows take one
each), and every instance must be a new object: a factory returning one it
returned before (`lambda: env`) would make rows share an episode.

Checked before any model loads: a factory that needs
arguments, a `reset`/`get_reward` that is not a method (a property), a
`reset` that cannot take the dataset's columns or a `get_reward` that needs
arguments, a method named like a standalone tool, a routed row naming no factory, a factory that returns the
same instance twice (`lambda: env`: every row would share one episode). An exception raised inside
the environment's own code (its factory, `reset`) is an
`EnvironmentFunctionError` naming the class and method, the user's exception
chained with its traceback; `reset` returning anything but a str, a list of
content parts or None is refused naming the value.

Not here: calling tools (tools.py), the loop (multiturn.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable

from datasets import Dataset, IterableDataset

from .tools import check_distinct_names, tool_schema


class EnvironmentFunctionError(RuntimeError):
    """An environment's own code (its factory or `reset`) raised; the user's exception is chained (`__cause__`) with its traceback."""


def public_methods(instance) -> list[Callable]:
    """The environment's tools: its class's public functions other than `reset` and `get_reward`, bound to `instance`.

    Listed on the class, as TRL does: listing the instance would evaluate properties.
    """
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


def _check_factory(factory, label: str) -> None:
    """Refuse a factory TRL could not call with no arguments, before it is called.

    Raises:
        TypeError: not callable, or a class/function with required parameters (naming them and the fix).
    """
    if not callable(factory):
        raise TypeError(f"{label} is {factory!r} ({type(factory).__name__}); give an environment class (or a zero-argument "
                        "callable returning an environment), or a dict {name: class} routing rows by their `environment` column.")
    try:
        inspect.signature(factory).bind()
    except ValueError:  # no signature to read (a builtin): calling it tells
        return
    except TypeError as err:
        name = getattr(factory, "__name__", repr(factory))
        raise TypeError(f"{label} {name} cannot be called without arguments ({err}); TRL makes each environment with no "
                        f"arguments: give a zero-argument callable, e.g. functools.partial({name}, …) or lambda: {name}(…).") from None


def _make(factory, label: str):
    """One environment from its factory.

    Raises:
        EnvironmentFunctionError: the factory (the class's `__init__`) raised, naming it; its exception chained.
    """
    try:
        return factory()
    except Exception as err:
        what = f"environment {factory.__name__}'s __init__" if isinstance(factory, type) else f"{label} {getattr(factory, '__name__', repr(factory))}"
        raise EnvironmentFunctionError(f"{what} raised {type(err).__name__}: {err}") from err


def _hook(instance, name: str) -> Callable | None:
    """The environment's `reset` or `get_reward`, bound; None when it defines none.

    Read without calling anything first: a property is refused, not evaluated.
    Raises:
        TypeError: the name is bound to something that is not a method (a property, a value); an async `reset`
            (TRL calls it synchronously); a `get_reward` that needs arguments (TRL calls get_reward() with none).
    """
    cls = type(instance).__name__
    attr = inspect.getattr_static(instance, name, None)
    if attr is None:
        return None
    if not (callable(attr) or isinstance(attr, (staticmethod, classmethod))):
        what = "a property" if isinstance(attr, property) else f"{attr!r} ({type(attr).__name__})"
        usage = "def reset(self, **kwargs) -> str | None" if name == "reset" else "def get_reward(self) -> float"
        never = "reset would never run" if name == "reset" else "it would never be called, and the environment would give no reward"
        raise TypeError(f"environment {cls}'s {name} is {what}, not a method: {never}; define `{usage}`.")
    method = getattr(instance, name)
    if name == "reset" and inspect.iscoroutinefunction(method):
        raise TypeError(f"environment {cls}'s reset is async; TRL calls reset(**row) synchronously: make it a plain `def reset(self, **kwargs)`.")
    if name == "get_reward":
        try:
            inspect.signature(method).bind()
        except TypeError as err:
            raise TypeError(f"environment {cls}'s get_reward needs arguments ({err}); TRL calls get_reward() with none once per "
                            "finished episode: read what it needs from the environment's own state.") from None
        except ValueError:  # no signature to read
            pass
    return method


def _check_reset_takes(environment, keys: list[str], source: str) -> None:
    """Refuse a `reset` that cannot take `keys` as keyword arguments (TRL calls reset(**row) with every column of the row).

    Raises:
        TypeError: naming the class, its reset's signature, the columns and the fix; a column named as reset's own
            first parameter (`self`), which no signature can take.
    """
    reset = environment.reset
    if inspect.ismethod(reset):  # a column named as its first parameter (`self`) would be passed twice: "multiple values"
        first = next(iter(inspect.signature(reset.__func__).parameters), None)
        if first in keys:
            raise TypeError(f"{source} include {first!r}, which environment {type(environment).__name__}'s reset{inspect.signature(reset.__func__)} "
                            f"cannot take as a keyword: its {first!r} parameter is the environment itself (TRL calls reset(**row) with every "
                            f"column, and Python refuses a second value for {first!r}); rename the column.")
    try:
        inspect.signature(reset).bind(**dict.fromkeys(keys))
    except ValueError:  # no signature to read
        return
    except TypeError as err:
        raise TypeError(
            f"environment {type(environment).__name__}'s reset{inspect.signature(environment.reset)} cannot take {source} "
            f"{keys} as keywords ({err}); TRL calls reset(**row) with every column: define reset(self, **kwargs) -> str | None "
            "(name the columns it reads before **kwargs)."
        ) from None


def _method_schema(instance, method: Callable) -> dict:
    """An environment method's tool schema (`tool_schema`).

    Raises:
        ValueError: `tool_schema`'s, naming the class and that every public method is a tool, with the other fix: a
            leading `_` for a helper that is none (a TRL environment's `render(self)` without a docstring was refused as
            "tool 'render' has no JSON schema", naming neither its class nor why it was a tool).
    """
    try:
        return tool_schema(method)
    except ValueError as err:
        name = method.__name__
        raise ValueError(f"environment {type(instance).__name__}'s public method {name!r} is offered to the model as a tool (every "
                         f"public method but reset and get_reward is, TRL's rule): {err} A helper that is no tool: name it _{name}.") from None


def _env_reward(env_type: type, asynchronous: bool) -> Callable:
    """A reward function scoring the rows whose environment is exactly `env_type` with its `get_reward()`; None elsewhere."""
    if asynchronous:

        async def get_reward(environments, **kwargs):
            return [await e.get_reward() if type(e) is env_type else None for e in environments]
    else:

        def get_reward(environments, **kwargs):
            return [e.get_reward() if type(e) is env_type else None for e in environments]

    get_reward.__name__ = env_type.__name__  # logged as rewards/<ClassName>, TRL's name
    return get_reward


class Environments:
    """The environment factories, their tools, and the pool of instances a rollout draws from.

    Args:
        environment_factory: a factory (class or zero-argument callable), or {name: factory}.
        tools: standalone tools offered next to every environment's methods.
    Attributes:
        reward_funcs: one reward function per environment class with `get_reward` (append to the trainer's).
        routed: True for a dict of factories (rows carry an `environment` column).
        factories: {name: factory}, {None: factory} for a single one (TRL's `environment_factories`).
        latest: the instances `draw` handed out last, one per row (TRL's `trainer.environments`); None before the first.
    Raises:
        ValueError: an empty dict, an instance without `reset` (TRL's rule), a method whose JSON schema cannot be read
            (`_method_schema`) or named like a standalone tool (tools.check_distinct_names), a factory returning one instance
            twice (`_fresh`: two are made per factory here, as every prompt's G ≥ 2 rows need).
        TypeError: a factory that is not callable or needs arguments (`_check_factory`); a `reset`/`get_reward`
            that is not a method, an async `reset`, a `get_reward` needing arguments (`_hook`).
        EnvironmentFunctionError: a factory raised (`_make`).
    """

    def __init__(self, environment_factory, tools: list[Callable]):
        self.routed = isinstance(environment_factory, dict)
        factories = environment_factory if self.routed else {None: environment_factory}
        if not factories:
            raise ValueError("environment_factory is an empty dict; map each `environment` column value to a factory.")
        self.factories, self.pool, self.schemas, self.reward_funcs, self.latest = factories, {}, {}, [], None
        standalone, rewarded = [tool_schema(t) for t in tools], set()
        for name, factory in factories.items():
            _check_factory(factory, self._label(name))
            instance = self._fresh(name)
            if _hook(instance, "reset") is None:
                raise ValueError(
                    f"environment {type(instance).__name__} has no callable `reset`; every environment must define "
                    "reset(self, **row) -> str | None (TRL's rule), even one that only returns None."
                )
            methods = public_methods(instance)
            check_distinct_names([*((f"tools[{i}]", t) for i, t in enumerate(tools)), *(("its method", m) for m in methods)],
                                 f"tools and environment {type(instance).__name__}'s methods")
            self.pool[name] = [instance]
            self.pool[name].append(self._fresh(name))  # every prompt's G ≥ 2 rows take one each: made now, a shared one refused now
            self.schemas[name] = standalone + [_method_schema(instance, m) for m in methods]
            get_reward = _hook(instance, "get_reward")
            if get_reward is not None and type(instance) not in rewarded:  # one column per class
                rewarded.add(type(instance))
                self.reward_funcs.append(_env_reward(type(instance), inspect.iscoroutinefunction(get_reward)))

    def _fresh(self, name):
        """A new instance from the factory of `name`, refused when the pool holds that very object already.

        Raises:
            ValueError: the factory returned an instance it (or another factory of the dict) returned before, e.g.
                `lambda: env` or a cached one: the rows holding it would share one episode, their states interleaved.
            TypeError: the factory returned a class (`lambda: Cls`), not an instance.
            EnvironmentFunctionError: the factory raised (`_make`).
        """
        instance = _make(self.factories[name], self._label(name))
        if isinstance(instance, type):  # `lambda: Cls`: its methods would run unbound, with no state of their own
            raise TypeError(f"{self._label(name)} returned the class {instance.__name__}, not an instance; the class itself is a "
                            f"factory: environment_factory={instance.__name__}.")
        for other, pool in self.pool.items():
            if any(instance is e for e in pool):
                cls = type(instance).__name__
                again = f"the same {cls} instance twice" if other == name else f"the {cls} instance {self._label(other)} returned already"
                raise ValueError(
                    f"{self._label(name)} returned {again}: the rows of a rollout would share one "
                    "environment, their episodes' states interleaved (TRL calls the factory once per row for an instance of its "
                    f"own). Return a new instance from each call: pass the class (environment_factory={cls}) or a callable that "
                    f"makes one (lambda: {cls}(…)), not `lambda: env` or a cached instance."
                )
        return instance

    def _label(self, name) -> str:
        """How the user gave the factory of `name`: environment_factory, or environment_factory['name'] for a dict."""
        return f"environment_factory[{name!r}]" if self.routed else "environment_factory"

    def check_columns(self, columns: list[str], dataset_name: str) -> None:
        """Refuse, before any model loads, a dataset the environments cannot take: routed rows without an
        `environment` column, or a `reset` that cannot take the rows' columns as keywords.

        Raises:
            ValueError: a dict of factories over a dataset without an `environment` column.
            TypeError: a `reset` whose signature refuses the columns (`_check_reset_takes`).
        """
        if self.routed and "environment" not in columns:
            raise ValueError(
                f"environment_factory is a dict of {list(self.factories)}, which routes each row by its `environment` column, "
                f"but {dataset_name} has none (columns: {', '.join(columns)}); add it, or give a single environment factory."
            )
        keys = [c for c in columns if not (self.routed and c == "environment")]
        for instances in self.pool.values():
            _check_reset_takes(instances[0], keys, f"the columns of {dataset_name}")

    def check_routes(self, rows, dataset_name: str) -> None:
        """Refuse, before any model loads, a row whose `environment` names no factory of a dict environment_factory (TRL,
        and `route`, refuse it only at the rollout that draws the row, after the steps before it). Every row of a Dataset
        or a list is read (an Arrow column converts at once); an IterableDataset only to its first row.

        Raises:
            ValueError: naming the dataset, the row, its value, environment_factory's keys and the fix.
        """
        if not self.routed:
            return
        if isinstance(rows, IterableDataset):
            values = [next(iter(rows), {}).get("environment")]
        else:
            values = rows["environment"][:] if isinstance(rows, Dataset) else [row.get("environment") for row in rows]
        for i, name in enumerate(values):
            if not isinstance(name, Hashable) or name not in self.factories:
                raise ValueError(f"{dataset_name} row {i} has environment={name!r}, which is not among environment_factory's keys "
                                 f"{list(self.factories)}; give each row the key of its environment's factory.")

    def route(self, row: dict):
        """The factory name of a row: its `environment` column for a dict of factories, else None.

        Raises:
            ValueError: a routed row without an `environment` column, or one naming no factory.
        """
        if not self.routed:
            return None
        name = row.get("environment")
        if name not in self.factories:
            raise ValueError(f"a row has environment={name!r}, which is not among environment_factory's keys {list(self.factories)}.")
        return name

    def draw(self, rows: list[dict]) -> list:
        """One instance per row from the pool (made only when the pool runs short), in row order.

        Raises:
            ValueError: a factory returned an instance the pool holds already (`_fresh`).
        """
        taken: dict = {}
        out = []
        for row in rows:
            name = self.route(row)
            pool, index = self.pool[name], taken.get(name, 0)
            if index == len(pool):
                pool.append(self._fresh(name))
            taken[name] = index + 1
            out.append(pool[index])
        self.latest = out
        return out

    def tools(self, standalone: list[Callable]) -> list[Callable]:
        """TRL's `trainer.tools` with environments: the standalone tools, then each environment's methods (bound to the
        instance made first, which TRL probes), in the factories' order, each once."""
        out = list(standalone)
        for instances in self.pool.values():
            out += [m for m in public_methods(instances[0]) if m not in out]
        return out

    def reset(self, environments: list, rows: list[dict], prompts: list) -> list:
        """Reset each environment from its row; its observation is appended to the prompt's last user message.

        Returns the N prompts (new lists; the rows are not changed). The
        `environment` column of a routed row is not passed to `reset`.
        Raises:
            TypeError: a `reset` that cannot take the row's columns, or that returned neither a str, content parts nor None.
            EnvironmentFunctionError: `reset` raised.
        """
        out = []
        for environment, row, prompt in zip(environments, rows, prompts):
            kwargs = {k: v for k, v in row.items() if not (self.routed and k == "environment")}
            _check_reset_takes(environment, list(kwargs), "the row's columns")
            try:
                observation = environment.reset(**kwargs)
            except Exception as err:
                raise EnvironmentFunctionError(f"environment {type(environment).__name__}'s reset raised {type(err).__name__}: {err}") from err
            if observation is not None:
                prompt = prompt[:-1] + [{**prompt[-1], "content": _appended(prompt[-1]["content"], observation, environment)}]
            out.append(prompt)
        return out

    def schemas_of(self, rows: list[dict]) -> list[list[dict]]:
        """Per row, the tool schemas its prompt offers."""
        return [self.schemas[self.route(row)] for row in rows]

    @staticmethod
    def toolboxes(environments: list, tools: list[Callable]) -> list[dict[str, Callable]]:
        """Per row, {name: callable}: the standalone tools and its own environment's bound methods."""
        return [{t.__name__: t for t in [*tools, *public_methods(e)]} for e in environments]


def _appended(content: str | list, observation: str | list, environment) -> str | list:
    """A message's content with `reset`'s observation appended, as TRL 1.16 appends it: text to text; otherwise both
    as lists of content parts (a str becomes one {"type": "text"} part).

    Raises:
        TypeError: an observation that is neither a str nor a list of content parts (dicts with a "type").
    """
    parts = isinstance(observation, list) and all(isinstance(p, dict) and "type" in p for p in observation)
    if not (isinstance(observation, str) or parts):
        raise TypeError(
            f"environment {type(environment).__name__}'s reset returned {observation!r:.80} ({type(observation).__name__}); "
            'return a str (the first observation, appended to the row\'s last user message), a list of content parts '
            '([{"type": "text", "text": …}]) or None.'
        )
    if isinstance(content, str) and isinstance(observation, str):
        return content + observation
    as_parts = lambda x: [{"type": "text", "text": x}] if isinstance(x, str) else x  # noqa: E731
    return as_parts(content) + as_parts(observation)


def placeholder_dataset(environment_factory, max_steps: int, prompts_per_rollout: int) -> Dataset:
    """TRL's stand-in train_dataset when the environment owns the data: empty user prompts, one rollout's worth.

    Raises:
        ValueError: a dict of factories (rows must route), or max_steps ≤ 0 (nothing sets the run's length).
    """
    if isinstance(environment_factory, dict):
        raise ValueError(
            "a dict environment_factory needs a train_dataset with an `environment` column to route each row; "
            "give one, or a single environment factory."
        )
    if max_steps <= 0:
        raise ValueError(
            "without a train_dataset (the environment's reset() gives the prompt), set max_steps > 0 to give the run's length."
        )
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * prompts_per_rollout})
