"""`environment_factory` as TRL 1.16 takes it: one environment per rollout row, its public methods as tools.

An environment is a class whose instances hold one episode's state:

- `reset(**row) -> str | None` starts an episode from the dataset row; a string
  is appended to the row's last user message (the first observation);
- every other public method (no leading `_`) is a tool the model may call,
  described by its type hints and docstring like any tool (tools.py);
- an optional `get_reward()` (sync or async) scores the finished episode: it
  becomes one more reward function, weight 1, named after the class.

`environment_factory` is a class (or any zero-argument callable), or a dict
{name: factory} that routes each row by its `environment` column (only that
environment's tools are offered in its prompt). Instances are made once and
reused: a rollout of N rows takes N instances from a pool, growing it only
when it needs more than it holds ("construct once, reset often").

Not here: calling tools (tools.py), the loop (multiturn.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from datasets import Dataset

from .tools import check_distinct_names, tool_schema


def public_methods(instance) -> list[Callable]:
    """The environment's tools: its class's public functions other than `reset` and `get_reward`, bound to `instance`.

    Listed on the class, as TRL does: listing the instance would evaluate properties.
    """
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


def _env_reward(env_type: type) -> Callable:
    """A reward function scoring the rows whose environment is exactly `env_type` with its `get_reward()`; None elsewhere."""
    if inspect.iscoroutinefunction(env_type.get_reward):

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
    Raises:
        ValueError: an empty dict, a factory that is not callable, an instance without a callable
            `reset` (TRL's rule), or a method whose JSON schema cannot be read (tools.py) or named like a
            standalone tool (tools.check_distinct_names).
    """

    def __init__(self, environment_factory, tools: list[Callable]):
        self.routed = isinstance(environment_factory, dict)
        factories = environment_factory if self.routed else {None: environment_factory}
        if not factories:
            raise ValueError("environment_factory is an empty dict; map each `environment` column value to a factory.")
        self.factories, self.pool, self.schemas, self.reward_funcs = factories, {}, {}, []
        standalone, rewarded = [tool_schema(t) for t in tools], set()
        for name, factory in factories.items():
            if not callable(factory):
                raise ValueError(f"environment_factory[{name!r}] is {factory!r}; give a class or a zero-argument callable.")
            instance = factory()
            if not callable(getattr(instance, "reset", None)):
                raise ValueError(
                    f"environment {type(instance).__name__} has no callable `reset`; every environment must define "
                    "reset(self, **row) -> str | None (TRL's rule), even one that only returns None."
                )
            methods = public_methods(instance)
            check_distinct_names([*((f"tools[{i}]", t) for i, t in enumerate(tools)), *(("its method", m) for m in methods)],
                                 f"tools and environment {type(instance).__name__}'s methods")
            self.pool[name] = [instance]
            self.schemas[name] = standalone + [tool_schema(m) for m in methods]
            if callable(getattr(instance, "get_reward", None)) and type(instance) not in rewarded:  # one column per class
                rewarded.add(type(instance))
                self.reward_funcs.append(_env_reward(type(instance)))

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
        """One instance per row from the pool (made only when the pool runs short), in row order."""
        taken: dict = {}
        out = []
        for row in rows:
            name = self.route(row)
            pool, index = self.pool[name], taken.get(name, 0)
            if index == len(pool):
                pool.append(self.factories[name]())
            taken[name] = index + 1
            out.append(pool[index])
        return out

    def reset(self, environments: list, rows: list[dict], prompts: list) -> list:
        """Reset each environment from its row; its observation is appended to the prompt's last user message.

        Returns the N prompts (new lists; the rows are not changed). The
        `environment` column of a routed row is not passed to `reset`.
        """
        out = []
        for environment, row, prompt in zip(environments, rows, prompts):
            kwargs = {k: v for k, v in row.items() if not (self.routed and k == "environment")}
            observation = environment.reset(**kwargs)
            if observation is not None:
                prompt = prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + observation}]
            out.append(prompt)
        return out

    def schemas_of(self, rows: list[dict]) -> list[list[dict]]:
        """Per row, the tool schemas its prompt offers."""
        return [self.schemas[self.route(row)] for row in rows]

    @staticmethod
    def toolboxes(environments: list, tools: list[Callable]) -> list[dict[str, Callable]]:
        """Per row, {name: callable}: the standalone tools and its own environment's bound methods."""
        return [{t.__name__: t for t in [*tools, *public_methods(e)]} for e in environments]


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
