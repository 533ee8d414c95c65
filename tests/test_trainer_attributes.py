"""TRL 1.16 GRPOTrainer's (and transformers.Trainer's) attributes and methods that user code, callbacks and TRL's docs
use, which fastgrpo's trainer lacked (each an AttributeError): tools, rollout_func, environment_factories,
environments, data_collator, generation_config, generation_kwargs, is_in_train, get_train_dataloader,
get_eval_dataloader, get_test_dataloader, predict, create_optimizer/create_scheduler; and the Trainer methods that
have no meaning in fastgrpo's loop (compute_loss, training_step, …), refused with the fix.

Where it is cheap, the values are TRL's own trainer's on the same tiny model, data and config (trl 1.16, CPU).
"""

import copy
import re

import pytest
import trl
from datasets import Dataset, IterableDataset
from torch.utils.data import DataLoader
from transformers import GenerationConfig, TrainerCallback
from transformers.trainer_utils import PredictionOutput
from test_agents import IncrementEnv, config as agent_config, multiply, scripted
from test_trainer import reward_even_tokens

import fastgrpo
from fastgrpo import GRPOTrainer
from fastgrpo.run.dataloaders import train_dataloader
from fastgrpo.run.dataset_kinds import prompt_order
from fastgrpo.run.trainer_attributes import REFUSED_METHODS


def numbered_prompts(n=10):
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}."}], "n": i} for i in range(n)])


def shared_config(module, output_dir, **extra):
    """G = 4, 2 prompts a rollout (8 completions), μ = 2 passes over 2 steps: TRL's loader repeats each batch 4 times."""
    own = {"use_cpu": True} if module is trl else {"disable_tqdm": True, "max_prompt_length": 64}
    values = dict(output_dir=str(output_dir), per_device_train_batch_size=4, num_generations=4, steps_per_generation=2, num_iterations=2,
                  max_completion_length=4, max_steps=1, report_to="none", bf16=False, per_device_eval_batch_size=4, save_strategy="no", seed=0)
    return module.GRPOConfig(**{**values, **own, **extra})


@pytest.fixture(scope="module")
def both(tmp_path_factory, tokenizer):
    """{"trl": TRL's GRPOTrainer, "fastgrpo": fastgrpo's}, built from the same tiny model, data and config."""
    from conftest import tiny_model

    out = {}
    for module in (trl, fastgrpo):
        args = shared_config(module, tmp_path_factory.mktemp(module.__name__))
        out[module.__name__] = module.GRPOTrainer(tiny_model(tokenizer), reward_even_tokens, args=args, train_dataset=numbered_prompts(),
                                                  eval_dataset=numbered_prompts(), processing_class=tokenizer)
    return out


def ns(batches):
    return [[row["n"] for row in batch] for batch in batches]


def test_generation_config_data_collator_and_agent_attributes_are_trls(both):
    theirs, ours = both["trl"], both["fastgrpo"]
    # TRL builds a GenerationConfig from the sampling fields (without vLLM): max_new_tokens, do_sample, the pad/bos/eos
    # ids, temperature, top_p, top_k, min_p, repetition_penalty, cache_implementation, disable_compile
    assert isinstance(ours.generation_config, GenerationConfig)
    assert ours.generation_config.to_dict() == theirs.generation_config.to_dict()
    assert ours.generation_kwargs == theirs.generation_kwargs
    assert ours.generation_kwargs["max_new_tokens"] == 4 and ours.generation_config.disable_compile
    # TRL's data_collator is trl.trainer.utils.identity: a batch is its list of rows
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    assert ours.data_collator(rows) is rows and theirs.data_collator(rows) is rows
    assert ours.data_collator.__name__ == theirs.data_collator.__name__ == "identity"
    for name in ("rollout_func", "environment_factories", "environments"):  # no agents: TRL's None
        assert getattr(ours, name) is getattr(theirs, name) is None, name
    assert ours.tools == theirs.tools == []
    assert ours.is_in_train is theirs.is_in_train is False
    with pytest.raises(AttributeError, match=r"trainer.rollout_func = 1: fastgrpo reads rollout_func once, when the trainer is built, "
                                             r"so setting it here would change nothing; give GRPOTrainer\(rollout_func=…\) to a new trainer"):
        ours.rollout_func = 1
    with pytest.raises(AttributeError, match=r"trainer.data_collator = .*: fastgrpo's loop draws rows itself and never collates"):
        ours.data_collator = list


def test_generation_config_is_absent_with_vllm_as_in_trl(tmp_path, tokenizer, make_model, monkeypatch):
    """TRL 1.16 sets generation_config and generation_kwargs only for transformers' generate, never with use_vllm=True;
    fastgrpo says so and names the fields to read (the flag is set after the build here: no vLLM server is needed)."""
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=shared_config(fastgrpo, tmp_path / "out"), train_dataset=numbered_prompts(),
                          processing_class=tokenizer)
    monkeypatch.setattr(trainer.args, "use_vllm", True)
    for name in ("generation_config", "generation_kwargs"):
        with pytest.raises(AttributeError, match=r"with use_vllm=True TRL's GRPOTrainer has neither .* read the sampling fields from trainer.args"):
            getattr(trainer, name)


def test_setting_generation_config_or_kwargs_is_refused_naming_the_fix(tmp_path, tokenizer, make_model):
    """Found by the break sweep: TRL's generate reads trainer.generation_config at each rollout (setting it applies there);
    fastgrpo's sampler is built with the trainer, and setting either was Python's bare "property … has no setter"."""
    trainer = GRPOTrainer(make_model(), reward_even_tokens, args=shared_config(fastgrpo, tmp_path / "out"), train_dataset=numbered_prompts(),
                          processing_class=tokenizer)
    for name, value in (("generation_config", GenerationConfig(top_k=3)), ("generation_kwargs", {"top_k": 3})):
        with pytest.raises(AttributeError, match=rf"^trainer.{name} = .*: fastgrpo builds its sampler from GRPOConfig's sampling fields and "
                                                 r"generation_kwargs when the trainer is built, so setting it here would change nothing; give "
                                                 r"GRPOConfig\(generation_kwargs=\{…\}\) .* to a new GRPOTrainer\.$"):
            setattr(trainer, name, value)
    assert trainer.generation_kwargs["top_k"] == trainer.args.top_k


def test_changing_a_field_of_generation_config_is_refused_and_its_copies_generate(tmp_path, tokenizer, make_model):
    """TRL's generate reads trainer.generation_config at each rollout, so `trainer.generation_config.top_k = 3` applies
    there; fastgrpo's sampler was built with the trainer, and the change went nowhere, silently (session 37). Now it is
    refused naming the fix; copies, as transformers' generate takes them, are plain and writable."""
    model = make_model()
    trainer = GRPOTrainer(model, reward_even_tokens, args=shared_config(fastgrpo, tmp_path / "out"), train_dataset=numbered_prompts(),
                          processing_class=tokenizer)
    settings = trainer.generation_config
    for change in (lambda: setattr(settings, "top_k", 3), lambda: settings.update(top_k=3)):
        with pytest.raises(AttributeError, match=r"^trainer.generation_config.top_k = 3: fastgrpo builds its sampler from GRPOConfig's"):
            change()
    assert settings.top_k == trainer.args.top_k and isinstance(settings, GenerationConfig)
    plain = copy.deepcopy(settings)
    plain.top_k = 3
    assert type(plain) is GenerationConfig and plain.top_k == 3 and type(copy.copy(settings)) is GenerationConfig
    ids = tokenizer("1 2", return_tensors="pt").input_ids
    out = model.generate(ids, generation_config=settings, max_new_tokens=2, min_new_tokens=2)
    assert out.shape == (1, ids.shape[1] + 2)


def test_get_train_dataloader_yields_trls_batches(both):
    """TRL's loader: per generation batch, this process's rows, each prompt G = 4 times in a row, the batch repeated
    μ × steps_per_generation = 4 times; 10 prompts, 2 a rollout: 5 rollouts, 20 batches. fastgrpo's first pass is the same."""
    theirs, ours = both["trl"].get_train_dataloader(), both["fastgrpo"].get_train_dataloader()
    assert isinstance(ours, DataLoader) and isinstance(ours.dataset, Dataset)
    assert len(ours) == len(theirs) == 20
    batches = ns(ours)
    assert batches == ns(theirs)
    assert all(batch == batches[4 * (i // 4)] for i, batch in enumerate(batches))  # each rollout's batch 4 times
    assert sorted({n for batch in batches for n in batch}) == list(range(10))
    assert all(len(batch) == 8 and batch[:4] == [batch[0]] * 4 and batch[4:] == [batch[4]] * 4 for batch in batches)


def test_get_train_dataloader_replays_the_prompts_the_trainer_samples_pass_after_pass(tmp_path, tokenizer, make_model):
    """Two passes of training (5 prompts, 2 a rollout: 2 rollouts a pass, the fifth prompt left out, as TRL's sampler
    drops an incomplete batch; 1 optimizer step each: 4 steps): the rewards see the loader's batches, in its order,
    its second iteration being the second pass (its own permutation)."""
    seen = []

    def record(completions, n, **kwargs):
        seen.append(list(n))
        return [0.0] * len(completions)

    args = fastgrpo.GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4, max_completion_length=2,
                               max_prompt_length=64, max_steps=4, logging_steps=100, save_strategy="no", report_to="none",
                               disable_tqdm=True, seed=3)
    trainer = GRPOTrainer(make_model(), record, args=args, train_dataset=numbered_prompts(5), processing_class=tokenizer)
    loader = trainer.get_train_dataloader()
    assert len(loader) == 2
    expected = ns(loader) + ns(loader)
    trainer.train()
    assert seen == expected
    assert len({n for batch in expected[:2] for n in batch}) == 4 and expected[:2] != expected[2:]


@pytest.mark.parametrize("rows,draws_per_pass", [(8, [2, 2, 2]), (6, [2, 1, 2])])
def test_a_streams_loader_replays_the_stream_order_one_pass_per_iteration(rows, draws_per_pass):
    """A stream (no length, as TRL's loader over one) on 2 processes, 4 prompts a draw: each process gets its half of
    every draw, and the iterations together are the trainer's draws (dataset_kinds.StreamOrder). A pass ends with the
    draw that runs past the stream's end (6 rows: [0-3], [4, 5, 0, 1] | [2-5] | [0-3], …); 8 rows fill whole draws,
    so each pass is its own 2."""
    stream = IterableDataset.from_generator(lambda: iter(numbered_prompts(rows)))
    args = fastgrpo.GRPOConfig(output_dir="unused", per_device_train_batch_size=4, num_generations=2, world_size=2, max_steps=10,
                               disable_tqdm=True)
    assert args.prompts_per_rollout == 4
    order = prompt_order(stream, args)
    draws = [[r["n"] for r in order.take(4)] for _ in range(sum(draws_per_pass))]
    halves = []
    for process in (0, 1):
        loader = train_dataloader(stream, args, process, 2)
        with pytest.raises(TypeError):
            len(loader)
        halves.append([ns(loader) for _ in draws_per_pass])
    assert [len(p) for p in halves[0]] == draws_per_pass
    for process, passes in enumerate(halves):
        flat = [batch for one_pass in passes for batch in one_pass]
        assert flat == [[n for n in d[2 * process : 2 * process + 2] for _ in range(2)] for d in draws]


def test_get_eval_dataloader_yields_the_batches_evaluate_samples(both, tmp_path, tokenizer, make_model):
    """TRL's eval loader: each eval prompt num_generations_eval times, eval_batch_size rows a batch (TRL shuffles the
    prompts; fastgrpo's evaluation walks them in order: the same rows, the same means)."""
    seen = []

    def record(completions, n, **kwargs):
        seen.append(list(n))
        return [0.0] * len(completions)

    theirs = ns(both["trl"].get_eval_dataloader())
    ours = ns(both["fastgrpo"].get_eval_dataloader())
    assert sorted(map(tuple, ours)) == sorted(map(tuple, theirs)) == [(i,) * 4 for i in range(10)]
    sets = {"small": numbered_prompts(3), "big": numbered_prompts(10)}
    trainer = GRPOTrainer(make_model(), record, args=shared_config(fastgrpo, tmp_path / "out", per_device_eval_batch_size=8),
                          train_dataset=numbered_prompts(), eval_dataset=sets, processing_class=tokenizer)
    loader = trainer.get_eval_dataloader("small")
    assert len(loader) == 2 and ns(loader) == [[0, 0, 0, 0, 1, 1, 1, 1], [2, 2, 2, 2]]
    trainer.evaluate(sets["small"])
    assert seen == ns(loader)
    assert ns(trainer.get_test_dataloader(numbered_prompts(2))) == [[0, 0, 0, 0, 1, 1, 1, 1]]
    with pytest.raises(ValueError, match=r"this is a dict of 2 sets; pass one of them, or its name: get_eval_dataloader\('name'\)"):
        trainer.get_eval_dataloader()
    with pytest.raises(KeyError, match=r"no set of that name \(its named sets: \['big', 'small'\]\)"):
        trainer.get_eval_dataloader("medium")
    no_eval = GRPOTrainer(make_model(), record, args=shared_config(fastgrpo, tmp_path / "none"), train_dataset=numbered_prompts(),
                          processing_class=tokenizer)
    with pytest.raises(ValueError, match="a dataloader needs one eval dataset: pass one, or give GRPOTrainer an eval_dataset"):
        no_eval.get_eval_dataloader()


def test_predict_returns_trls_prediction_output_without_logging(both):
    """Trainer.predict under TRL's GRPOTrainer: PredictionOutput(predictions=None, label_ids=None, metrics) with
    test_loss, test_model_preparation_time and the speed keys; nothing logged; on_prediction_step per batch, on_predict."""

    class Seen(TrainerCallback):
        def __init__(self):
            self.steps, self.predicted = 0, None

        def on_prediction_step(self, args, state, control, **kwargs):
            self.steps += 1

        def on_predict(self, args, state, control, metrics, **kwargs):
            self.predicted = metrics

    got = {}
    for name, trainer in both.items():
        seen = Seen()
        trainer.add_callback(seen)
        history = list(trainer.state.log_history)
        got[name] = trainer.predict(numbered_prompts(2), metric_key_prefix="final")
        trainer.pop_callback(seen)
        assert trainer.state.log_history == history, name
        assert seen.predicted is got[name].metrics and seen.steps == 2, name  # 2 prompts × G = 4, 4 completions a batch
    theirs, ours = got["trl"], got["fastgrpo"]
    assert isinstance(ours, PredictionOutput) and ours.predictions is None and ours.label_ids is None
    assert set(theirs.metrics) == {"final_loss", "final_model_preparation_time", "final_runtime", "final_samples_per_second",
                                   "final_steps_per_second"}
    assert set(theirs.metrics) < set(ours.metrics) and "final_reward" in ours.metrics
    assert abs(ours.metrics["final_loss"]) < 1e-6 and abs(theirs.metrics["final_loss"]) < 1e-6  # ρ = 1, β = 0, Â sums to 0 per group
    assert all(key.startswith("final_") for key in ours.metrics)


def test_is_in_train_is_trainers(tmp_path, tokenizer, make_model):
    """Trainer sets is_in_train on entering train() and clears it after on_train_end: True in every callback of the
    run (an evaluation within it too), False before and after, as TRL's trainer reports on the same run."""

    class Watch(TrainerCallback):
        def __init__(self):
            self.trainer, self.seen = None, []

        def on_train_begin(self, args, state, control, **kwargs):
            self.seen.append(("begin", self.trainer.is_in_train))

        def on_evaluate(self, args, state, control, **kwargs):
            self.seen.append(("evaluate", self.trainer.is_in_train))

        def on_train_end(self, args, state, control, **kwargs):
            self.seen.append(("end", self.trainer.is_in_train))

    got = {}
    for module in (trl, fastgrpo):
        watch = Watch()
        args = shared_config(module, tmp_path / module.__name__, eval_strategy="steps", eval_steps=1, num_iterations=1, steps_per_generation=1,
                             max_completion_length=2)
        trainer = module.GRPOTrainer(make_model(), reward_even_tokens, args=args, train_dataset=numbered_prompts(),
                                     eval_dataset=numbered_prompts(1), processing_class=tokenizer, callbacks=[watch])
        watch.trainer = trainer
        before = trainer.is_in_train
        trainer.train()
        got[module.__name__] = (before, watch.seen, trainer.is_in_train)
    assert got["fastgrpo"] == got["trl"] == (False, [("begin", True), ("evaluate", True), ("end", True)], False)


def test_tools_environments_and_rollout_func_are_trls(tmp_path, tokenizer, make_model):
    """TRL's trainer.tools: the tools given, then each environment's public methods bound to the instance it probed;
    environment_factories: {None: factory}; environments: None until a batch is drawn, then that batch's instances,
    one per completion, the ones the rewards receive; rollout_func: the function given."""
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Increment the counter by 2."}]}] * 2)
    received = []

    def reward_func(environments, **kwargs):
        received.append(environments)
        return [0.0] * len(environments)

    def add(a: int, b: int) -> int:
        """
        Adds two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b

    trainer = GRPOTrainer(model=make_model(), reward_funcs=reward_func, args=agent_config(tmp_path), train_dataset=dataset,
                          processing_class=tokenizer, environment_factory=IncrementEnv, tools=[add])
    probe = trainer.assembly.producer.environments.pool[None][0]
    assert trainer.tools == [add, probe.increment] and trainer.environment_factories == {None: IncrementEnv}
    assert trainer.environments is None and trainer.rollout_func is None
    scripted(trainer, tokenizer, call='<tool_call>\n{"name": "increment", "arguments": {"step": 2}}\n</tool_call>')
    trainer._collect()
    assert trainer.environments is received[-1] and len(trainer.environments) == 4
    assert all(type(e) is IncrementEnv for e in trainer.environments) and trainer.environments[0] is probe
    with pytest.raises(AttributeError, match=r"trainer.environments = \[\]: the trainer sets it to each batch's environments"):
        trainer.environments = []

    routed = {"inc": IncrementEnv}
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "Go."}], "environment": "inc"}] * 2)
    trainer = GRPOTrainer(model=make_model(), reward_funcs=reward_func, args=agent_config(tmp_path, output_dir=str(tmp_path / "r")),
                          train_dataset=rows, processing_class=tokenizer, environment_factory=routed)
    assert trainer.environment_factories is routed and [m.__name__ for m in trainer.tools] == ["increment"]

    def rollout_func(prompts, trainer):
        return {"prompt_ids": [[1]] * len(prompts), "completion_ids": [[2]] * len(prompts), "logprobs": None}

    trainer = GRPOTrainer(model=make_model(), reward_funcs=reward_even_tokens, args=agent_config(tmp_path, output_dir=str(tmp_path / "f")),
                          train_dataset=dataset, processing_class=tokenizer, rollout_func=rollout_func)
    assert trainer.rollout_func is rollout_func and trainer.tools == [] and trainer.environment_factories is None
    trainer = GRPOTrainer(model=make_model(), reward_funcs=reward_even_tokens, args=agent_config(tmp_path, output_dir=str(tmp_path / "t")),
                          train_dataset=dataset, processing_class=tokenizer, tools=[multiply])
    assert trainer.tools == [multiply]


def test_trainers_optimizer_methods_return_what_the_trainer_built(both):
    """Trainer's create_optimizer / create_scheduler return the optimizer and schedule a trainer already has;
    fastgrpo's are built with the trainer."""
    ours = both["fastgrpo"]
    assert ours.create_optimizer() is ours.optimizer and ours.create_scheduler(10) is ours.lr_scheduler
    assert ours.create_optimizer_and_scheduler(10) is None


@pytest.mark.parametrize("name", sorted(REFUSED_METHODS))
def test_trainer_methods_without_meaning_in_fastgrpos_loop_are_refused_with_the_fix(both, name):
    """compute_loss, training_step, prediction_step, evaluation_loop, hyperparameter_search: TRL has them (an
    AttributeError named nothing); fastgrpo's loop has no batch they could run on, so each call says what to use."""
    assert callable(getattr(trl.GRPOTrainer, name))
    with pytest.raises(NotImplementedError, match=re.escape(f"trainer.{name}(…) is not available in fastgrpo: {REFUSED_METHODS[name]}.")):
        getattr(both["fastgrpo"], name)(None, {})
