"""What a GRPOTrainer subclass's `save_model` writes into each checkpoint (Trainer._save_checkpoint's call): files in
subfolders are checked one by one, and a save_model that raises leaves no half folder behind."""

import os

import pytest
from datasets import Dataset

import fastgrpo
from fastgrpo.run.checkpoint_files import CorruptCheckpointError, read_manifest, write_manifest


def reward_even_tokens(completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def test_a_subfolder_is_listed_by_its_files_not_its_own_size(tmp_path):
    """A folder's own size is the file system's (4096 or more on ext4, the names' lengths on tmpfs or btrfs): the manifest
    recorded it, so a checkpoint with a value_head/ folder copied to another file system was refused as corrupt, and
    the files inside it were never checked."""
    (tmp_path / "value_head").mkdir()
    (tmp_path / "value_head" / "weights.json").write_text('{"w": [1, 2, 3]}')
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    write_manifest(str(tmp_path), 1, "run")
    files = read_manifest(str(tmp_path))["files"]
    assert set(files) == {"model.safetensors", os.path.join("value_head", "weights.json")}
    (tmp_path / "value_head" / "weights.json").write_text('{"w": [1, 2')  # truncated
    with pytest.raises(CorruptCheckpointError, match="weights.json"):
        read_manifest(str(tmp_path))


def test_a_save_model_that_raises_leaves_no_temporary_folder(tmp_path, tokenizer, make_model):
    """The checkpoint's `.tmp-checkpoint-N` was removed after an OSError only: a subclass's save_model raising anything
    else (or Ctrl-C there) left it in output_dir. The checkpoints before it are kept and resume."""

    class Fails(fastgrpo.GRPOTrainer):
        def save_model(self, output_dir=None, _internal_call=False):
            super().save_model(output_dir, _internal_call)
            if _internal_call and self.state.global_step == 2:
                raise RuntimeError("value head not ready")

    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}."}]} for i in range(10)])
    fields = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=2,
                  save_steps=1, report_to="none", bf16=False, seed=0, disable_tqdm=True, max_prompt_length=64)
    trainer = Fails(make_model(), reward_even_tokens, args=fastgrpo.GRPOConfig(**fields), train_dataset=prompts, processing_class=tokenizer)
    with pytest.raises(RuntimeError, match="value head not ready"):
        trainer.train()
    assert sorted(n for n in os.listdir(tmp_path) if "checkpoint" in n) == ["checkpoint-1"]
    resumed = fastgrpo.GRPOTrainer(make_model(), reward_even_tokens, args=fastgrpo.GRPOConfig(**fields), train_dataset=prompts,
                                   processing_class=tokenizer)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 2
