"""Tool-call formats fastgrpo recognises from what a chat template renders (chat_format.recognise_tool_call_format).

TRL 1.16's GRPOTrainer calls `add_response_schema` for tools on a template
without a `response_template` (Qwen2.5's, Qwen3's); fastgrpo reads the format
from a rendered tool call instead and must parse completions exactly as TRL's
template does. TRL is the oracle here only (its templates and parser).
"""

import copy

import pytest
from datasets import Dataset

from fastgrpo import GRPOTrainer
from fastgrpo.rollout.agents.chat_format import prepare_tool_tokenizer, tool_suffix_ids

from test_agents import config, multiply, scripted

u = pytest.importorskip("trl.chat_template_utils")  # the oracle: TRL's templates and add_response_schema

CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
ADD = '<tool_call>\n{"name": "multiply", "arguments": {"a": 5, "b": 6}}\n</tool_call>'
THINK = "<think>\nI should multiply 3 by 4.\n</think>\n\n"
XML_CALL = "<tool_call>\n<function=multiply>\n<parameter=a>\n3\n</parameter>\n<parameter=b>\n4\n</parameter>\n</function>\n</tool_call>"

SAMPLES = {  # assistant texts as the model writes them, each ending at the turn's end
    "chatml": [CALL + "<|im_end|>", CALL + "\n" + ADD + "<|im_end|>", "The answer is 12.<|im_end|>",
               THINK + CALL + "<|im_end|>", "Let me see.\n" + CALL + "<|im_end|>", "<tool_call>\n{not json\n</tool_call><|im_end|>"],
    "qwen3_5": [XML_CALL + "<|im_end|>", XML_CALL + "\n" + XML_CALL.replace("3", "5") + "<|im_end|>", "The answer is 12.<|im_end|>",
                THINK + XML_CALL + "<|im_end|>", "I should multiply.\n</think>\n\n" + XML_CALL + "<|im_end|>"],
    "llama3": ['{"name": "multiply", "parameters": {"a": 3, "b": 4}}<|eot_id|>', "The answer is 12.<|eot_id|>"],
}
TEMPLATES = [("qwen2_5", "chatml"), ("qwen3", "chatml"), ("qwen3_instruct_2507", "chatml"), ("qwen3_5_nothink", "qwen3_5"),
             ("qwen3_5_think", "qwen3_5"), ("llama3_1", "llama3"), ("llama3_2", "llama3")]


def with_template(tokenizer, name):
    """A shallow copy of the test tokenizer carrying TRL's copy of a model's chat template."""
    tok = copy.copy(tokenizer)
    tok.chat_template = getattr(u, f"{name}_chat_template")
    return tok


def parse(tok, text, prefix):
    """What `parse_response` gives, or the exception type it raises (a malformed call raises under TRL's template)."""
    try:
        return tok.parse_response(text, prefix=prefix, tools=[multiply])
    except ValueError as e:
        return type(e)


@pytest.mark.parametrize("name, samples", TEMPLATES)
def test_a_recognised_tool_format_parses_as_trls_add_response_schema(tokenizer, name, samples):
    """Qwen2.5/Qwen3 (Hermes JSON, with Qwen3's <think>), Qwen3.5 XML, Llama 3.1: fastgrpo's template parses as TRL's."""
    tok = with_template(tokenizer, name)
    ours, notice = prepare_tool_tokenizer(tok)
    assert notice and "response_template" in notice and ours is not tok
    assert getattr(tok, "response_template", None) is None  # the caller's tokenizer is left as it was
    trl_tok = u.add_response_schema(with_template(tokenizer, name))
    assert ours.response_template == trl_tok.response_template
    chat = [{"role": "user", "content": "hi"}]
    text_prefix = tok.apply_chat_template(chat, tools=[multiply], add_generation_prompt=True, tokenize=False)
    for text in SAMPLES[samples]:
        assert parse(ours, text, text_prefix) == parse(trl_tok, text, text_prefix), text
    prefix = tok.apply_chat_template(chat, tools=[multiply], add_generation_prompt=True, tokenize=True, return_dict=False)
    opened = "I should multiply.\n</think>\n\n" if text_prefix.endswith("<think>\n") else ""  # Qwen3.5-think opens the block
    ids = tok.encode(opened + SAMPLES[samples][0], add_special_tokens=False)
    parsed = ours.parse_response(ids, prefix=prefix, tools=[multiply])
    assert parsed == trl_tok.parse_response(ids, prefix=prefix, tools=[multiply])
    assert parsed["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": 3, "b": 4}}


def test_a_set_response_template_is_kept(tokenizer):
    tok = u.add_response_schema(with_template(tokenizer, "qwen3"))
    assert prepare_tool_tokenizer(tok) == (tok, None)


def test_trl_tools_script_on_qwen3s_template_calls_the_tool_and_trains(tmp_path, tokenizer, make_model):
    """TRL's documented Qwen3 setup (`tools=[multiply]`, no response_template): the call with a <think> block is parsed,
    the tool runs, its reply is context, and the update runs, logging TRL's tool metrics."""
    tok = with_template(tokenizer, "qwen3")
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 3 multiplied by 4?"}], "answer": 12}] * 2)
    seen, called = {}, []

    def tool(a: int, b: int) -> int:
        """
        Multiplies two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        called.append((a, b))
        return a * b
    tool.__name__ = "multiply"

    def accuracy(completions, answer, **kwargs):
        seen["completions"] = completions
        return [float(str(a) in c[-1]["content"]) for c, a in zip(completions, answer)]

    trainer = GRPOTrainer(model=make_model(), reward_funcs=accuracy, args=config(tmp_path), train_dataset=dataset,
                          processing_class=tok, tools=[tool])
    scripted(trainer, tokenizer, call=THINK + CALL, answer="The answer is 12.")
    rollout = trainer._collect()
    messages = seen["completions"][0]
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
    assert messages[0]["reasoning_content"] == "I should multiply 3 by 4."
    assert messages[0]["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": 3, "b": 4}}
    assert messages[1] == {"role": "tool", "name": "multiply", "content": "12"} and called == [(3, 4)] * 4
    assert rollout.rewards[:, 0].tolist() == [1.0] * 4
    call = tokenizer.encode(THINK + CALL + "<|im_end|>")
    suffix = tool_suffix_ids(trainer.tokenizer, [messages[1]], {})
    # What TRL renders after the turn with its training template for Qwen3 (the turn's <think> kept).
    assert tokenizer.decode(suffix) == "\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert rollout.completion_ids[0].tolist()[: len(call) + len(suffix)] == call + suffix
    trainer.train()
    assert trainer.last_metrics["tools/call_frequency"] == 1.0 and trainer.last_metrics["tools/failure_frequency"] == 0.0


def test_an_unrecognised_tool_format_names_trls_fix(tokenizer):
    """GLM-4-MoE's format is one fastgrpo does not read: the error names add_response_schema and response_template."""
    tok = with_template(tokenizer, "glm4moe")
    with pytest.raises(ValueError, match=r"add_response_schema\(tokenizer\).*tokenizer\.response_template"):
        prepare_tool_tokenizer(tok)
    fixed = u.add_response_schema(with_template(tokenizer, "glm4moe"))
    assert prepare_tool_tokenizer(fixed) == (fixed, None)
