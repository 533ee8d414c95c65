"""The tree is the architecture: imports run one way, down the floors, with no circles, and modules stay small.

Floors, bottom to top (docs/design.md, "What each package may import"): config/ · algo/ · tasks/ · model/ ·
generation/ · rollout/ · update/ · run/ · the top-level modules (trainer.py, trl_methods.py, cli.py and the public
data.py / rewards.py). A module may import its own package and any package on a lower floor, never a higher one.
The imports are read from the source with `ast` (function-level imports included, TYPE_CHECKING ones too).
"""

import ast
import os

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src", "fastgrpo")
FLOORS = ["config", "algo", "tasks", "model", "generation", "rollout", "update", "run", "<top>"]


def modules() -> dict[str, str]:
    """{dotted module under fastgrpo: path}."""
    out = {}
    for folder, _, files in os.walk(SRC):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), SRC)[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__") if rel != "__init__" else ""] = os.path.join(folder, name)
    return out


def imports_of(module: str, path: str, known: set[str]) -> set[str]:
    """The fastgrpo modules `module` imports (dotted under fastgrpo; "" is the package itself)."""
    is_package = path.endswith("__init__.py")
    package = module.split(".") if is_package else module.split(".")[:-1]
    if module == "":
        package = []
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == "fastgrpo" or node.module.startswith("fastgrpo.")):
                target = node.module.removeprefix("fastgrpo").removeprefix(".")
            else:
                continue
            for alias in node.names:  # `from . import trainer` imports a module
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("fastgrpo."):
                    found.add(alias.name.removeprefix("fastgrpo."))
    return found - {module}


def floor(module: str) -> int:
    """The floor of a module: its package's index in FLOORS; top-level modules (and the package) are the top."""
    head = module.split(".")[0]
    return FLOORS.index(head) if head in FLOORS[:-1] else len(FLOORS) - 1


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports_of(m, p, set(mods)) for m, p in mods.items()}


def test_the_import_reader_sees_what_a_module_imports():
    g = graph()
    assert "run.metrics" in g["trainer"] and "algo.reductions" in g["run.metrics"]
    assert "generation.contract" in g["generation.sampler"] and "model.loading" in g["generation.sampler"]
    assert floor("run.metrics") > floor("update.step") > floor("rollout.record") > floor("generation.contract") > floor("algo.losses")
    assert floor("trainer") == floor("cli") == floor("") == len(FLOORS) - 1


def test_no_import_runs_up_a_floor():
    upward = [(m, t) for m, targets in graph().items() for t in targets if floor(t) > floor(m)]
    assert upward == [], f"imports that run up a floor (module → import): {upward}"


def test_no_import_circles():
    g = graph()
    done, on_path, cycles = set(), [], []

    def visit(m):
        on_path.append(m)
        for t in sorted(g.get(m, set())):
            if t in on_path:
                cycles.append(on_path[on_path.index(t):] + [t])
            elif t not in done and t in g:
                visit(t)
        on_path.pop()
        done.add(m)

    for m in sorted(g):
        if m not in done:
            visit(m)
    assert cycles == [], f"import circles: {cycles}"


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_module_is_over_400_lines(module):
    with open(modules()[module]) as f:
        assert sum(1 for _ in f) <= 400


def test_at_most_six_top_level_modules_and_the_trainer_fits_one_screen_of_300_lines():
    top = sorted(name for name in os.listdir(SRC) if name.endswith(".py") and name != "__init__.py")
    assert len(top) <= 6, top
    with open(os.path.join(SRC, "trainer.py")) as f:
        assert sum(1 for _ in f) <= 300
