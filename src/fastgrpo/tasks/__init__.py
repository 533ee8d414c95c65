"""tasks/: the built-in tasks (reasoning-gym, the calculator agent task) and the built-in rewards.
Imports nothing else of fastgrpo's but tasks/."""

import importlib

# "module:function" specs (--reward, --environment, --tools, filter_groups_metric) name modules by their public
# path; the ones the layout of issue 27 moved keep their old spelling (README's commands use it).
MOVED_MODULES = {"fastgrpo.agents.calculator": "fastgrpo.tasks.calculator"}


def import_module(name: str):
    """`importlib.import_module`, reading `MOVED_MODULES`' old spellings at their new homes.

    Raises:
        ImportError: as importlib raises it.
    """
    return importlib.import_module(MOVED_MODULES.get(name, name))
