"""`report_to` checked as GRPOConfig is built: the names transformers' Trainer takes, each once.

TrainingArguments (transformers 5.19) keeps any text and `get_reporting_integration_callbacks` raises for a name that is
not one of `INTEGRATION_TO_CALLBACK`'s when the Trainer is built; the names are lower case and one text is one name
("wandb,mlflow" too). A name given twice gives two of its callbacks (Trainer warns and adds both), so every number is
logged twice at each step. Here each of these is refused before anything loads, naming the fix.

`resolve` then reads the list as TrainingArguments.__post_init__ does, so `args.report_to` names the trackers that run.

Not here: whether each is installed (run/trackers.py, when the trainer is built).
"""

from __future__ import annotations

import os


def check(report_to: list[str]) -> None:
    """Refuse a `report_to` list (GRPOConfig's, after "none" became []) transformers' Trainer would refuse or double.

    Raises:
        ValueError: "none" or "all" beside other names; a name transformers does not take (with the likely fix: the
            lower-case name for "MLflow", a list for "wandb,mlflow"); a name given twice.
    """
    if "none" in report_to:
        raise ValueError(f"report_to={report_to}: 'none' means no tracker; give it alone, or list the trackers without it.")
    if "all" in report_to and report_to != ["all"]:
        raise ValueError(f"report_to={report_to}: 'all' means every installed tracker; give it alone, or list the trackers "
                         "without it (transformers' Trainer refuses the list).")
    if named := [t for t in report_to if t != "all"]:  # transformers (and torch) imported only then: a config without one stays cheap
        from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK  # noqa: PLC0415 (Trainer's trackers)

        for tracker in named:
            if tracker not in INTEGRATION_TO_CALLBACK:
                raise ValueError(f"report_to={tracker!r}: {_hint(tracker, INTEGRATION_TO_CALLBACK)}use 'none', 'all' or one of "
                                 f"{', '.join(INTEGRATION_TO_CALLBACK)} (transformers' trackers).")
    if len(set(report_to)) < len(report_to):
        raise ValueError(f"report_to={report_to} names a tracker twice, so its callback would log every number twice at each "
                         "step (transformers' Trainer adds one per mention); name each once.")


def _hint(given, trackers) -> str:
    """The likely fix for a name transformers does not take: a list written as one text ("wandb,mlflow"), or a known name
    in other case or with spaces ("MLflow", " none"); "" for anything else."""
    if not isinstance(given, str):
        return ""
    if len(given.replace(",", " ").split()) > 1:
        return ("several trackers are a list (YAML `report_to: [wandb, mlflow]`, Python report_to=['wandb', 'mlflow']; the "
                "--report_to flag takes one name, as TRL's); ")
    name = given.strip().lower()
    return f"did you mean {name!r} (lower case, no spaces)? " if name in (*trackers, "none", "all") else ""


def resolve(report_to: list[str]) -> list[str]:
    """The trackers that run, in order, as TrainingArguments.__post_init__ (transformers 5.19) leaves `report_to`: ["all"]
    becomes `get_available_reporting_integrations()` (the installed ones), and "kubeflow" is appended when
    `is_kubeflow_available()` (KUBEFLOW_TRAINER_SERVER_URL set, inside a Kubeflow TrainJob) and not named."""
    if report_to == ["all"]:
        from transformers.integrations import get_available_reporting_integrations  # noqa: PLC0415 (only then)

        report_to = get_available_reporting_integrations()
    if "kubeflow" not in report_to and "KUBEFLOW_TRAINER_SERVER_URL" in os.environ:  # transformers imported only then
        from transformers.integrations import is_kubeflow_available  # noqa: PLC0415

        report_to = [*report_to, "kubeflow"] if is_kubeflow_available() else report_to
    return list(report_to)
