"""`report_to`'s trackers as transformers' Trainer reads them: whether each can run.

Every name of transformers' `INTEGRATION_TO_CALLBACK` is a tracker (mlflow, comet_ml, wandb, trackio, tensorboard,
swanlab, clearml, dvclive, neptune, …; config/checks.py refuses any other when GRPOConfig is built); each runs as
transformers' own callback (run/callbacks.py).

GRPOConfig's `report_to` already names the trackers that run (config/report_to.resolve: "all" read as the installed
ones, "kubeflow" added inside a Kubeflow TrainJob, as TrainingArguments reads it).

- `check_available`: a named tracker that transformers' availability function says cannot run is refused when the
  trainer is built, before the model loads, with the command that fixes it (transformers' callback raises only
  when the Trainer builds it).

Not here: the callbacks' calls (run/callbacks.py), the completions table sent to W&B and Trackio (run/completion_tables.py).
"""

from __future__ import annotations

import importlib.util

from transformers.integrations.integration_utils import (is_azureml_available, is_clearml_available, is_codecarbon_available, is_dagshub_available,
                                                         is_dvclive_available, is_flytekit_available, is_kubeflow_available,
                                                         is_mlflow_available, is_neptune_available, is_swanlab_available,
                                                         is_tensorboard_available, is_trackio_available, is_wandb_available)


def _comet_installed() -> bool:
    """CometCallback's own test is the package (transformers' is_comet_available, "all"'s, also wants an API key set)."""
    return importlib.util.find_spec("comet_ml") is not None


# name → (transformers' test that its callback can be built, the pip package(s) that make it so, as its callback names them).
# A name transformers adds later and this table lacks is still accepted: its callback raises when it is built.
AVAILABLE = {
    "azure_ml": (is_azureml_available, "azureml-sdk"),
    "comet_ml": (_comet_installed, "comet-ml"),
    "mlflow": (is_mlflow_available, "mlflow"),  # also False with DISABLE_MLFLOW_INTEGRATION=TRUE, as transformers reads it
    "neptune": (is_neptune_available, "neptune"),
    "tensorboard": (is_tensorboard_available, "tensorboard"),
    "trackio": (is_trackio_available, "trackio"),
    "wandb": (is_wandb_available, "wandb"),
    "codecarbon": (is_codecarbon_available, "codecarbon"),
    "clearml": (is_clearml_available, "clearml"),
    "dagshub": (is_dagshub_available, "dagshub mlflow"),  # DagsHubCallback is an MLflowCallback
    "flyte": (is_flytekit_available, "flytekit"),
    "dvclive": (is_dvclive_available, "dvclive"),
    "swanlab": (is_swanlab_available, "swanlab"),
    "kubeflow": (is_kubeflow_available, None),  # not a package: the TrainJob's environment
}
KUBEFLOW_FIX = "set KUBEFLOW_TRAINER_SERVER_URL (a Kubeflow TrainJob with TrainJobRuntimeStatus sets it)"


def check_available(report_to: list[str]) -> None:
    """Refuse a named tracker whose callback transformers could not build (its package missing), before any compute.

    Raises:
        ValueError: naming the trackers and the fix: `pip install <package>` (the pip name, e.g. comet-ml for
            comet_ml), or for kubeflow the environment variable; or report_to='none'. (accelerate's own trackers
            would warn and log nowhere; transformers' Trainer raises a RuntimeError when it builds the callback.)
    """
    missing = [t for t in report_to if t in AVAILABLE and not AVAILABLE[t][0]()]
    if not missing:
        return
    packages = [AVAILABLE[t][1] for t in missing if AVAILABLE[t][1] is not None]
    fixes = [f"pip install {' '.join(packages)}"] if packages else []
    fixes += [KUBEFLOW_FIX] if "kubeflow" in missing else []
    raise ValueError(f"report_to={report_to} but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: "
                     f"{'; '.join(fixes)}, or report_to='none' (metrics.jsonl is written either way).")
