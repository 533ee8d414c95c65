"""report_to="tensorboard" writes what TRL 1.16's GRPOTrainer writes (transformers' `TensorBoardCallback`): one event
file under output_dir/runs/<date>_<host>/, every logged record's numbers under `train/<key>`, evaluations under
`eval/<key>`, train()'s summary too, and the config as the `args` text. Any other tracker transformers' Trainer takes
runs as well, read as TrainingArguments reads `report_to`: MLflow (a local file store, read back with its client)
gets every logged number at its step, the summary and the config. With `log_completions`, W&B (an offline run's
files) and Trackio (its local database) get TRL's completions table at each log, as TRL sends it."""

import importlib.util
import json
import os
import subprocess
import sys
import warnings

import pytest

from fastgrpo import GRPOConfig, GRPOTrainer

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def reward_even(completion_ids, **kw):
    """Fraction of even token ids."""
    return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]


def event_files(output_dir):
    return [os.path.join(root, f) for root, _, files in os.walk(output_dir) for f in files if f.startswith("events.out.tfevents")]


def scalars(path):
    events = EventAccumulator(path)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}, events.Tags()["tensors"]


def test_tensorboard_writes_trls_tags_where_trl_writes_them(tmp_path, tokenizer, make_model, prompts):
    common = dict(per_device_train_batch_size=4, per_device_eval_batch_size=4, num_generations=4, max_completion_length=4, max_steps=2,
                  logging_steps=1, eval_strategy="steps", eval_steps=2, save_strategy="no", report_to="tensorboard", disable_tqdm=True, bf16=False)
    data = dict(train_dataset=prompts.select(range(8)), eval_dataset=prompts.select(range(1)), processing_class=tokenizer)
    ours = GRPOTrainer(make_model(), reward_even, args=GRPOConfig(str(tmp_path / "fg"), **common), **data)
    ours.train()
    [path] = event_files(ours.args.output_dir)
    assert os.path.relpath(path, ours.args.output_dir).startswith("runs" + os.sep)  # transformers' default_logdir()
    got, texts = scalars(path)
    history = ours.state.log_history
    train, evals, summary = [r for r in history if "reward" in r], [r for r in history if "eval_reward" in r], history[-1]
    assert got["train/reward"] == [(r["step"], pytest.approx(r["reward"])) for r in train] and [r["step"] for r in train] == [1, 2]
    assert got["eval/reward"] == [(2, pytest.approx(evals[0]["eval_reward"]))]
    assert got["train/train_runtime"] == [(2, pytest.approx(summary["train_runtime"]))]
    assert "args" in " ".join(texts) and "train/step" not in got  # the config as text; the step is the x axis, not a scalar

    trl = pytest.importorskip("trl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's own warnings about this tiny setup
        theirs = trl.GRPOTrainer(model=make_model(), reward_funcs=reward_even, args=trl.GRPOConfig(str(tmp_path / "trl"), use_cpu=True, **common), **data)
        theirs.train()
    [trl_path] = event_files(theirs.args.output_dir)
    assert set(scalars(trl_path)[0]) - set(got) == set()  # every tag TRL writes (fastgrpo adds its own: train/kl_old, …)


def test_mlflow_gets_every_logged_number_at_its_step_and_the_summary(tmp_path, tokenizer, make_model, prompts, monkeypatch):
    mlflow = pytest.importorskip("mlflow")  # the dev extra's mlflow-skinny: a local file store, no server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 keeps the file store behind this switch (a database wants sqlalchemy)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "fastgrpo")
    args = GRPOConfig(str(tmp_path / "fg"), per_device_train_batch_size=4, num_generations=4, max_completion_length=4, max_steps=2,
                      logging_steps=1, save_strategy="no", report_to="mlflow", disable_tqdm=True, bf16=False, beta=0.1)
    trainer = GRPOTrainer(make_model(), reward_even, args=args, train_dataset=prompts.select(range(8)), processing_class=tokenizer)
    trainer.train()  # report_to="mlflow" used to stop at GRPOConfig: only tensorboard, wandb and trackio were taken

    client = mlflow.MlflowClient()
    [run] = client.search_runs([client.get_experiment_by_name("fastgrpo").experiment_id])
    assert run.info.status == "FINISHED"  # MLflowCallback ended it at on_train_end
    history = trainer.state.log_history
    records, summary = history[:-1], history[-1]
    assert [r["step"] for r in records] == [1, 2] and "train_runtime" in summary
    for key in ("loss", "reward", "reward_std", "kl", "entropy", "learning_rate", "grad_norm", "completions/mean_length",
                "rewards/reward_even/mean", "frac_reward_zero_std", "clip_ratio/region_mean", "num_tokens"):  # fastgrpo's and TRL's keys
        got = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        assert got == [(r["step"], pytest.approx(r[key])) for r in records], key
    numbers = {k for r in history for k, v in r.items() if isinstance(v, (int, float)) and k != "step"}
    assert numbers - set(run.data.metrics) == set()  # every number logged, none dropped
    for key in ("train_runtime", "train_loss", "train_samples_per_second", "total_flos"):  # train()'s summary, at the last step
        assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)] == [(2, pytest.approx(summary[key]))], key
    assert run.data.params["num_generations"] == "4" and run.data.params["beta"] == "0.1"  # the config, as the run's parameters


@pytest.mark.parametrize("unique", [False, True])
def test_wandb_gets_trls_completions_table_at_each_log(tmp_path, tokenizer, make_model, prompts, monkeypatch, unique):
    wandb = pytest.importorskip("wandb")
    import pandas as pd

    monkeypatch.setenv("WANDB_MODE", "offline")  # the run's files under WANDB_DIR, nothing sent
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    args = GRPOConfig(str(tmp_path / "fg"), per_device_train_batch_size=8, num_generations=4, max_completion_length=4, max_steps=2,
                      logging_steps=1, save_strategy="no", report_to="wandb", log_completions=True, log_unique_prompts=unique,
                      num_completions_to_print=0, disable_tqdm=True, bf16=False)
    trainer = GRPOTrainer(make_model(), reward_even, args=args, train_dataset=prompts.select(range(8)), processing_class=tokenizer)
    trainer.train()
    wandb.finish()  # WandbCallback leaves the run open (for a later evaluate); its files are complete once it ends
    wandb.teardown()  # and the settings (WANDB_DIR) are read again by the next run in this process

    [run_dir] = [os.path.join(tmp_path, "wandb", d) for d in os.listdir(tmp_path / "wandb") if d.startswith("offline-run-")]
    folder = os.path.join(run_dir, "files", "media", "table")
    tables = [json.load(open(os.path.join(folder, f))) for f in sorted(os.listdir(folder)) if f.startswith("completions_")]
    assert len(tables) == 2  # one per log, as the parquet files (the key "completions", TRL's)
    for step in (1, 2):
        parquet = pd.read_parquet(os.path.join(args.output_dir, "completions", f"completions_{step:05d}.parquet"))
        assert len(parquet) == 8  # 2 prompts × G = 4
        expected = parquet[~parquet["prompt"].astype(str).duplicated()] if unique else parquet  # TRL's log_unique_prompts
        [table] = [t for t in tables if t["data"][0][0] == step]
        assert table["columns"] == list(parquet.columns) == ["step", "prompt", "completion", "reward_even", "advantage"]
        assert len(table["data"]) == (2 if unique else 8)
        for row, (_, want) in zip(table["data"], expected.iterrows()):
            assert row[0] == step and row[2] == want["completion"]
            assert row[3:] == [pytest.approx(want["reward_even"]), pytest.approx(want["advantage"])]


@pytest.mark.parametrize("kubeflow_job", [False, True])
def test_report_to_runs_the_trackers_trainingarguments_reads(tmp_path, monkeypatch, kubeflow_job):
    from transformers import TrainingArguments

    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_URL", raising=False)
    if kubeflow_job:  # inside a Kubeflow TrainJob, TrainingArguments adds its progress reporter to any report_to
        monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "https://kubeflow.invalid")
    for report_to in ("all", "none", "wandb", ["mlflow", "tensorboard"], "kubeflow"):
        theirs = TrainingArguments(str(tmp_path), report_to=report_to, use_cpu=True).report_to  # transformers' reading, the oracle
        assert GRPOConfig(report_to=report_to).report_to == theirs, report_to  # args.report_to as TRL's: the trackers that run
    if importlib.util.find_spec("mlflow"):  # "all" used to mean the installed ones of tensorboard, wandb and trackio only
        assert "mlflow" in GRPOConfig(report_to="all").report_to


TRACKIO_RUN = """
import json, sys
from datasets import Dataset
sys.path.insert(0, sys.argv[2])  # tests/: conftest's tiny model
from conftest import tiny_model
from fastgrpo import GRPOConfig, GRPOTrainer
from fastgrpo.model.loading import load_tokenizer

def reward_even(completion_ids, **kw):
    return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]

tokenizer = load_tokenizer("smollm2-135m-instruct")
prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}."}]} for i in range(8)])
args = GRPOConfig(sys.argv[1], per_device_train_batch_size=8, num_generations=4, max_completion_length=4, max_steps=2, logging_steps=1,
                  save_strategy="no", report_to="trackio", log_completions=True, log_unique_prompts=True, num_completions_to_print=0,
                  disable_tqdm=True, bf16=False, project="fastgrpo-test", run_name="run")
GRPOTrainer(tiny_model(tokenizer), reward_even, args=args, train_dataset=prompts, processing_class=tokenizer).train()
from trackio.sqlite_storage import SQLiteStorage
print(json.dumps([log["completions"]["_value"] for log in SQLiteStorage.get_logs("fastgrpo-test", "run") if "completions" in log]))
"""


def test_trackio_gets_trls_completions_table_with_unique_prompts(tmp_path):
    pytest.importorskip("trackio")
    import pandas as pd

    # its own process: trackio reads TRACKIO_DIR (its local database, no Space) when it is imported
    out = subprocess.run([sys.executable, "-c", TRACKIO_RUN, str(tmp_path / "fg"), os.path.dirname(os.path.abspath(__file__))],
                         capture_output=True, text=True, env={**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    tables = json.loads(out.stdout.strip().splitlines()[-1])
    assert [table[0]["step"] for table in tables] == [1, 2]  # one per log, under TRL's key "completions"
    for step, table in zip((1, 2), tables):
        parquet = pd.read_parquet(tmp_path / "fg" / "completions" / f"completions_{step:05d}.parquet")
        first = parquet[~parquet["prompt"].astype(str).duplicated()]  # log_unique_prompts: each prompt's first row (8 rows → 2)
        assert len(parquet) == 8 and len(table) == len(first) == 2
        for row, (_, want) in zip(table, first.iterrows()):
            assert list(row) == list(parquet.columns)  # TRL's columns, in order
            assert (row["step"], row["completion"], row["prompt"]) == (step, list(want["completion"]), list(want["prompt"]))
            assert (row["reward_even"], row["advantage"]) == (pytest.approx(want["reward_even"]), pytest.approx(want["advantage"]))
