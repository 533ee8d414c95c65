"""What the docs and docstrings name exists: every `fastgrpo.…` name and `from fastgrpo… import …` line resolves,
every `something.py` they mention is a file of the repository, and no command points outside it.

Docs are what a new user copies; after the layout of issue 27 the README's LoRA import named a module that
no longer existed. Old spellings stay only where they are the subject: docs/design.md's table of where the old
modules went, and the maps that keep them working (tasks.MOVED_MODULES, run/checkpoint_files.MOVED_CLASSES).
"""

import importlib
import os
import re
import subprocess

import pytest

from fastgrpo import tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACKED = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
TEXTS = [f for f in TRACKED if f.endswith((".py", ".md")) and not f.startswith("tests/fixtures/")]
OTHER_PROJECTS = {"grpo_trainer.py", "engine/arg_utils.py", "arg_utils.py"}  # TRL's file (the behaviour matched), vLLM's (its flags, read)
USER_SCRIPTS = {"train.py", "my_trl_style_script.py"}  # the user's own script in an example command
USER_DOCS = [f for f in TEXTS if f.startswith(("src/", "docs/")) or f == "README.md"]  # what a user reads


def lines(names=TEXTS):
    """(file, line number, text) of `names`' lines, without the old-modules table and the alias maps."""
    for name in names:
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            table = alias_map = False
            for number, text in enumerate(f, 1):
                if name == "docs/design.md" and text.startswith("#"):
                    table = text.startswith("### Where the old modules went")
                alias_map = (alias_map or "MOVED_MODULES" in text or "MOVED_CLASSES" in text) and not text.startswith("}")
                if (table and text.startswith("|")) or alias_map:
                    continue
                yield name, number, text


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


def test_every_fastgrpo_name_in_docs_and_docstrings_resolves():
    missing = []
    for name, number, text in lines():
        dotted = re.findall(r"\bfastgrpo(?:\.\w+)+", text)
        dotted += [f"{m}.{n.strip()}" for m, names in re.findall(r"from (fastgrpo[\w.]*) import ([\w, ]+)", text)
                   for n in names.split(",") if n.strip()]
        dotted = [d.split(" ")[0] for d in dotted]
        missing += [f"{name}:{number}: {d}" for d in dotted if not resolves(d.rstrip("."))]
    assert not missing, "\n".join(missing)


def test_every_python_file_the_docs_and_the_library_name_exists():
    files = {f for f in TRACKED if f.endswith(".py")}
    missing = []
    for name, number, text in lines(USER_DOCS):
        for path in re.findall(r"(?<![\w/.<>-])((?:[\w.-]+/)*[\w-]+\.py)\b", text):
            if path in OTHER_PROJECTS | USER_SCRIPTS:
                continue
            if not any(f == path or f.endswith("/" + path) for f in files):
                missing.append(f"{name}:{number}: {path}")
    assert not missing, "\n".join(missing)


def test_no_tracked_text_points_outside_the_repository():
    outside = [f"{name}:{number}" for name, number, text in lines() if re.search(r"(?<![\w.])(/work/|\.\./shared|/tmp/[\w-]*\.lock)", text)]
    assert not outside, "\n".join(outside)


@pytest.mark.parametrize("old, new", sorted(tasks.MOVED_MODULES.items()))
def test_the_old_spelling_of_a_moved_module_still_imports(old, new):
    assert tasks.import_module(old) is importlib.import_module(new)
