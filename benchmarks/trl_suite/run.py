"""Run TRL's own GRPOTrainer tests offline against TRL or fastgrpo (only the import changed).

Usage (from the repository root; TRL's test file comes from a TRL checkout at the installed version):

    PYTHONPATH=$PWD/src python benchmarks/trl_suite/run.py --tests PATH/TO/trl/tests/test_grpo_trainer.py \
        --system fastgrpo [--compare benchmarks/results/<date>-trl-suite-trl.json] [-k EXPR]

What it does: copies the test file into a scratch package beside a `testing_utils` stand-in
(TrlTestCase and the require_* markers; vLLM, vision, liger, bitsandbytes and accelerator tests are
skipped), replaces `from trl import GRPOConfig, GRPOTrainer` with fastgrpo's for `--system fastgrpo`,
points every `trl-internal-testing/tiny-*` model at a local random-weight model of the same class
built here (SmolLM2's tokenizer, hidden size 16), and `load_dataset("trl-internal-testing/zen", ...)`
at the Zen of Python prompts (17 train / 2 test rows, standard and conversational), so nothing
touches the hub; on a machine without CUDA, TRL's TrainingArguments get use_cpu=True (its bf16
default refuses a CPU otherwise). To fit a 2-core CPU, a run that sets no max_steps stops after
`--max-steps` (default 3) optimizer steps on both systems, instead of 3 epochs of 17 prompts.
Writes {test id: outcome} as JSON and prints the counts; with `--compare` (the other system's
JSON) it prints which tests that pass there fail here. Not part of the default suite.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ZEN = [
    "Beautiful is better than", "Explicit is", "Simple is better", "Complex", "Flat is better than", "Sparse is better",
    "Readability", "Special cases aren't special", "Although practicality beats", "Errors should never", "Unless explicitly",
    "In the face of ambiguity, refuse", "There should be one--", "Although that way may not be", "Now is better than",
    "Although never is often better than", "If the implementation is hard to explain,", "If the implementation is easy to explain,",
    "Namespaces are one honking great",
]
MODELS = {  # hub name → (transformers class, config class, extra config)
    "tiny-Qwen2ForCausalLM-2.5": ("Qwen2ForCausalLM", "Qwen2Config", {}),
    "tiny-Qwen2ForSequenceClassification-2.5": ("Qwen2ForSequenceClassification", "Qwen2Config", {"num_labels": 1}),
    "tiny-Qwen3ForSequenceClassification": ("Qwen3ForSequenceClassification", "Qwen3Config", {"num_labels": 1}),
    "tiny-LlamaForSequenceClassification-3.2": ("LlamaForSequenceClassification", "LlamaConfig", {"num_labels": 1}),
    "tiny-Qwen3ForCausalLM": ("Qwen3ForCausalLM", "Qwen3Config", {"tie_word_embeddings": False}),
    "tiny-Gemma2ForCausalLM": ("Gemma2ForCausalLM", "Gemma2Config", {"head_dim": 8}),
    "tiny-Qwen3MoeForCausalLM": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}),
}


def build_models(cache: str) -> None:
    """Random-weight tiny models of each class the tests name, with SmolLM2's tokenizer, in `cache`/<hub name>."""
    import torch
    import transformers

    from fastgrpo.model.loading import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    for name, (model_cls, config_cls, extra) in MODELS.items():
        folder = os.path.join(cache, name)
        if os.path.isdir(folder):
            continue
        torch.manual_seed(0)
        config = getattr(transformers, config_cls)(
            vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=512, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **extra,
        )
        getattr(transformers, model_cls)(config).save_pretrained(folder)
        tok.save_pretrained(folder)


TESTING_UTILS = '''
import importlib.util
import pytest

class TrlTestCase:
    @pytest.fixture(autouse=True)
    def set_tmp_dir(self, tmp_path):
        self.tmp_dir = str(tmp_path)

def _needs(module):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} not installed")

require_peft, require_jmespath, require_liger_kernel = _needs("peft"), _needs("jmespath"), _needs("liger_kernel")
_skip = pytest.mark.skip(reason="needs an accelerator, vLLM, vision or a hub-only model: left out offline")
require_vllm = require_vision = require_bitsandbytes = require_kernels = require_torch_accelerator = require_ampere_or_newer = _skip
'''

CONFTEST = '''
import os
os.environ["HF_HUB_OFFLINE"] = "1"
import datasets

ZEN = {zen!r}
_real = datasets.load_dataset

def load_dataset(path, name=None, split=None, **kwargs):
    if path != "trl-internal-testing/zen":
        return _real(path, name, split=split, **kwargs)
    rows = [{{"prompt": p}} if name == "standard_prompt_only" else {{"prompt": [{{"role": "user", "content": p}}]}} for p in ZEN]
    dd = datasets.DatasetDict(train=datasets.Dataset.from_list(rows[:17]), test=datasets.Dataset.from_list(rows[17:]))
    return dd if split is None else dd[split]

datasets.load_dataset = load_dataset

import torch
import transformers

_post_init = transformers.TrainingArguments.__post_init__

def _on_cpu(self):  # TRL's bf16 default refuses a CPU-only machine unless use_cpu is set
    self.use_cpu = self.use_cpu or not torch.cuda.is_available()
    _post_init(self)

transformers.TrainingArguments.__post_init__ = _on_cpu

MAX_STEPS = {max_steps}  # both systems: a run of num_train_epochs is capped to this many optimizer steps (2-core CPU)


def _capped(config_class):
    post_init = config_class.__post_init__

    def __post_init__(self):
        if MAX_STEPS and self.max_steps <= 0:
            self.max_steps = MAX_STEPS
        post_init(self)

    config_class.__post_init__ = __post_init__


import importlib

_capped(importlib.import_module("trl" if "{system}" == "trl" else "fastgrpo").GRPOConfig)
'''


def prepare(tests: str, system: str, cache: str, work: str, max_steps: int) -> str:
    """The scratch package with the rewritten test file; returns its path."""
    pkg = os.path.join(work, "tests")
    os.makedirs(pkg, exist_ok=True)
    with open(tests) as f:
        text = f.read()
    if system == "fastgrpo":
        text = text.replace("from trl import GRPOConfig, GRPOTrainer", "from fastgrpo import GRPOConfig, GRPOTrainer")
    text = text.replace("trl-internal-testing/tiny-", os.path.join(cache, "tiny-"))
    files = {"__init__.py": "", "testing_utils.py": TESTING_UTILS, "conftest.py": CONFTEST.format(zen=ZEN, max_steps=max_steps, system=system), "test_grpo_trainer.py": text}
    for name, content in files.items():
        with open(os.path.join(pkg, name), "w") as f:
            f.write(content)
    return pkg


def outcomes(junit: str) -> dict[str, str]:
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        result[f"{case.get('classname').split('.')[-1]}::{case.get('name')}"] = {"failure": "failed", "error": "failed"}.get(kind, kind)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", required=True, help="TRL's tests/test_grpo_trainer.py")
    parser.add_argument("--system", choices=["trl", "fastgrpo"], required=True)
    parser.add_argument("--out", help="where to write {test: outcome} (default benchmarks/results/trl-suite-<system>.json)")
    parser.add_argument("--compare", help="the other system's JSON: list the tests passing there and failing here")
    parser.add_argument("-k", default=None, help="pytest -k expression")
    parser.add_argument("--max-steps", type=int, default=3, help="cap on optimizer steps for runs that set none (0: TRL's epochs)")
    args = parser.parse_args()
    cache = os.path.join(os.path.expanduser("~"), ".cache", "fastgrpo-trl-suite")
    build_models(cache)
    work = tempfile.mkdtemp(prefix=f"trl-suite-{args.system}-")
    pkg = prepare(args.tests, args.system, cache, work, args.max_steps)
    junit = os.path.join(work, "junit.xml")
    cmd = [sys.executable, "-m", "pytest", pkg, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "--rootdir", work, "-rN"]
    subprocess.run(cmd + (["-k", args.k] if args.k else []), cwd=work, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    got = outcomes(junit)
    out = args.out or os.path.join(HERE, "..", "results", f"trl-suite-{args.system}.json")
    with open(out, "w") as f:
        json.dump(got, f, indent=1, sort_keys=True)
    counts = {k: sum(v == k for v in got.values()) for k in ("passed", "failed", "skipped")}
    print(f"{args.system}: {counts} → {out}")
    if args.compare:
        with open(args.compare) as f:
            other = json.load(f)
        passing = [t for t, v in other.items() if v == "passed"]
        failing = sorted(t for t in passing if got.get(t) != "passed")
        print(f"of {len(passing)} passing on the other system, {len(passing) - len(failing)} pass here ({100 * (len(passing) - len(failing)) / max(len(passing), 1):.0f} %)")
        for t in failing:
            print(f"  not passing here: {t} ({got.get(t, 'missing')})")


if __name__ == "__main__":
    main()
