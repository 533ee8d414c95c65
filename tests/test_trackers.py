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
import torch

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


def wandb_tables(folder):
    """The "completions" tables an offline W&B run saved (completions_<W&B step>_<hash>.table.json), in the order logged."""
    names = sorted((f for f in os.listdir(folder) if f.startswith("completions_")), key=lambda f: int(f.split("_")[1]))
    return [json.load(open(os.path.join(folder, f))) for f in names]


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
    tables = wandb_tables(folder)
    assert [t["data"][0][0] for t in tables] == [1, 2, 2]  # one per log() (the key "completions", TRL's): train()'s summary's too
    assert tables[2]["data"] == tables[1]["data"]  # the summary re-sends the latest batch, as TRL's log()
    for step, table in ((1, tables[0]), (2, tables[1])):
        parquet = pd.read_parquet(os.path.join(args.output_dir, "completions", f"completions_{step:05d}.parquet"))
        assert len(parquet) == 8  # 2 prompts × G = 4
        expected = parquet[~parquet["prompt"].astype(str).duplicated()] if unique else parquet  # TRL's log_unique_prompts
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
    assert [table[0]["step"] for table in tables] == [1, 2, 2]  # one per log() under TRL's key "completions", the summary's too
    assert tables[2] == tables[1]  # the summary's: the latest batch again, as TRL's log()
    for step, table in zip((1, 2), tables):
        parquet = pd.read_parquet(tmp_path / "fg" / "completions" / f"completions_{step:05d}.parquet")
        first = parquet[~parquet["prompt"].astype(str).duplicated()]  # log_unique_prompts: each prompt's first row (8 rows → 2)
        assert len(parquet) == 8 and len(table) == len(first) == 2
        for row, (_, want) in zip(table, first.iterrows()):
            assert list(row) == list(parquet.columns)  # TRL's columns, in order
            assert (row["step"], row["completion"], row["prompt"]) == (step, list(want["completion"]), list(want["prompt"]))
            assert (row["reward_even"], row["advantage"]) == (pytest.approx(want["reward_even"]), pytest.approx(want["advantage"]))


def test_an_evaluation_and_the_summary_log_trls_completions_buffer_again(tmp_path, tokenizer, make_model, prompts, monkeypatch, capsys):
    # TRL's log() tables its completions buffer (the latest generation_batch_size = 8 completions) at every call, and an
    # evaluation appends its own completions to that buffer first. fastgrpo sent a table with each training log only.
    wandb = pytest.importorskip("wandb")
    import pandas as pd

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    args = GRPOConfig(str(tmp_path / "fg"), per_device_train_batch_size=8, per_device_eval_batch_size=4, num_generations=4, max_completion_length=4,
                      max_steps=2, logging_steps=1, eval_strategy="steps", eval_steps=2, save_strategy="no", report_to="wandb",
                      log_completions=True, num_completions_to_print=None, disable_tqdm=True, bf16=False)
    trainer = GRPOTrainer(make_model(), reward_even, args=args, train_dataset=prompts.select(range(8)), eval_dataset=prompts.select([31]),
                          processing_class=tokenizer)
    trainer.train()
    wandb.finish()
    wandb.teardown()

    [run_dir] = [os.path.join(tmp_path, "wandb", d) for d in os.listdir(tmp_path / "wandb") if d.startswith("offline-run-")]
    tables = [t["data"] for t in wandb_tables(os.path.join(run_dir, "files", "media", "table"))]
    assert [t[0][0] for t in tables] == [1, 2, 2, 2]  # step 1's log, step 2's, its evaluation's, train()'s summary's
    step_2, evaluation, summary = tables[1:]
    assert len(evaluation) == 8 and evaluation[:4] == step_2[4:]  # 8 rows kept: the batch's last 4, then the evaluation's 4
    assert all("Count to 31." in str(row[1]) for row in evaluation[4:]) and not any("Count to 31." in str(row[1]) for row in step_2)
    assert summary == evaluation  # nothing new since: the same buffer
    parquet = pd.read_parquet(os.path.join(args.output_dir, "completions", "completions_00002.parquet"))  # step 2's last log: the summary's
    assert ["Count to 31." in str(p) for p in parquet["prompt"]] == [False] * 4 + [True] * 4
    assert capsys.readouterr().out.count(" Step 2 ") == 3  # TRL's panel at each of step 2's logs


def completion_rows(tag, n, extra=None):
    from fastgrpo.run.metrics import CompletionRows

    return CompletionRows([f"{tag}{i}" for i in range(n)], [f"c{i}" for i in range(n)], torch.arange(n, dtype=torch.float32).view(n, 1) / 4,
                          torch.full((n,), -1.0), extra)


def test_the_completions_buffer_keeps_the_latest_generation_batch_size_rows_as_trls_deques(tmp_path):
    from rich.console import Console

    from fastgrpo.run.completion_tables import CompletionTables

    tables = CompletionTables(str(tmp_path), ["r"], [], False, capacity=8, console=Console())
    prompts = lambda: list(tables.frame(1)["prompt"])  # noqa: E731
    tables.update([completion_rows("t", 8)], 1)  # a generation batch fills it
    tables.add([completion_rows("e", 2), completion_rows("f", 2)])  # an evaluation's two batches: the 4 oldest rows go
    assert prompts() == ["t4", "t5", "t6", "t7", "e0", "e1", "f0", "f1"]
    assert tables.frame(1)["r"].tolist() == [1.0, 1.25, 1.5, 1.75, 0.0, 0.25, 0.0, 0.25]  # each row keeps its own reward
    tables.update([], 1)  # a log without a new rollout (μ > 1): the buffer as it is
    assert prompts()[4:] == ["e0", "e1", "f0", "f1"]
    tables.add([completion_rows("g", 10, {"judge": list("abcdefghij")})])  # more than it holds: the latest 8
    assert prompts() == [f"g{i}" for i in range(2, 10)] and tables.frame(1)["judge"].tolist() == list("cdefghij")


def test_the_console_sample_is_trls_panel(tmp_path):
    # TRL's print_prompt_completions_sample: a panel "Step N", columns Prompt, Completion, each reward, Advantage, the
    # log_extra columns, 2 decimals, chat messages under their role; fastgrpo printed "completions at step N" with 3 digits.
    from rich.console import Console

    from fastgrpo.run.completion_tables import CompletionTables
    from fastgrpo.run.metrics import CompletionRows

    console = Console(record=True, width=160)
    tables = CompletionTables(str(tmp_path), ["judge"], [], False, capacity=8, console=console)
    rows = CompletionRows([[{"role": "user", "content": "Count to 3."}], "plain"], ["1 2 3", "no"], torch.tensor([[0.5], [float("nan")]]),
                          torch.tensor([1.234, -1.0]), {"source": ["a", "b"]})
    tables.update([rows], 1)
    tables.print_sample(3, None)
    text = console.export_text()
    assert " Step 3 " in text and all(word in text for word in ("Prompt", "Completion", "judge", "Advantage", "source"))
    assert all(cell in text for cell in ("USER", "Count to 3.", "plain", "1 2 3", "0.50", "nan", "1.23", "-1.00"))
    tables.print_sample(4, 1)  # one row of the two
    assert console.export_text().count("1 2 3") + console.export_text().count(" no ") == 1
    tables.print_sample(5, 0)
    assert console.export_text() == ""
