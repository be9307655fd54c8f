"""tool_format (issue 18): a glaive-style sharegpt dataset (``tools`` column, ``function_call`` and
``observation`` turns) renders with its tools in the prompt, the calls trained and the observations
masked; ``cockpit check`` reads it; a tiny run trains on it (slow)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, cockpit, tiny_config

FIXTURES = ROOT / "tests" / "fixtures"


def samples():
    from cockpit.data.formats import DatasetSpec, load_dataset_file

    loaded = load_dataset_file(DatasetSpec("toolcall_demo", FIXTURES / "toolcall_sharegpt.json", "sharegpt"))
    assert not loaded.problems
    return loaded.samples


@pytest.fixture()
def tok(embedded_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(embedded_dir))  # a fresh copy: templates are set on it


def split(tok, rendered):
    """(prompt text: the masked tokens, trained text: the labelled tokens)."""
    masked = [i for i, label in zip(rendered.input_ids, rendered.labels) if label == -100]
    trained = [i for i, label in zip(rendered.input_ids, rendered.labels) if label != -100]
    return tok.decode(masked), tok.decode(trained)


def test_sharegpt_reader_keeps_tools_calls_and_observations():
    first, second, plain = samples()
    assert first["tools"][0]["name"] == "get_weather" and "tools" in second
    assert plain["tools"] == []  # its column is "[]": tools given, none listed (LLaMA-Factory's empty system slot)
    call = first["messages"][1]
    assert call["role"] == "assistant" and call["tool_calls"] == [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
    ]
    assert first["messages"][2] == {"role": "tool", "content": '{"temperature": 21, "sky": "sunny"}'}


def test_qwen_format_puts_the_schema_in_the_prompt_trains_the_call_and_masks_the_observation(tok):
    from cockpit.data.render import apply_template_choice, render_sample

    apply_template_choice(tok, "qwen")  # LLaMA-Factory's qwen: <tool_response> observations (chatml: tool turns)
    sample = samples()[0]
    prompt, trained = split(tok, render_sample(tok, sample["messages"], 2048, tools=sample["tools"], tool_format="qwen"))
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt and "Current weather of a city" in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>' in trained
    assert "<tool_response>" in prompt and '"temperature": 21' in prompt
    assert '"temperature": 21' not in trained and "<tools>" not in trained
    assert "It is sunny in Paris" in trained


def test_default_format_lists_the_tools_and_trains_action_lines(tok):
    from cockpit.data.render import apply_template_choice, render_sample

    apply_template_choice(tok, "chatml")
    sample = samples()[0]
    prompt, trained = split(tok, render_sample(tok, sample["messages"], 2048, tools=sample["tools"], tool_format="default"))
    assert "> Tool Name: get_weather" in prompt and "unit (string): Temperature unit, should be one of [celsius, fahrenheit]" in prompt
    assert 'Action: get_weather\nAction Input: {"city": "Paris", "unit": "celsius"}' in trained
    assert '"temperature": 21' in prompt and '"temperature": 21' not in trained


def test_predictions_ask_with_the_tools_in_the_prompt(tok):
    """do_predict's prompts are written as training writes them: the tool list in the system
    message, the call and the observation before the last reply; a conversation cut after the
    call has the call as its label."""
    from cockpit.config.run_config import RunConfig
    from cockpit.data.render import apply_template_choice
    from cockpit.train.predict import prediction_prompt

    apply_template_choice(tok, "qwen")  # LLaMA-Factory's qwen: <tool_response> observations (chatml: tool turns)
    sample, cfg = samples()[0], RunConfig(tool_format="qwen", default_system=None)
    ids, label = prediction_prompt(tok, sample, cfg)
    prompt = tok.decode(ids)
    call = '"arguments": {"city": "Paris", "unit": "celsius"}'
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt and call in prompt
    assert '"temperature": 21' in prompt and prompt.endswith("<|im_start|>assistant\n")
    assert label.startswith("It is sunny in Paris")
    ids, label = prediction_prompt(tok, {**sample, "messages": sample["messages"][:2]}, cfg)
    assert "<tools>" in tok.decode(ids) and call not in tok.decode(ids)
    assert label.startswith("<tool_call>") and call in label


def test_unset_tool_format_uses_qwen_for_the_qwen_template_and_keeps_default_system(tok):
    from cockpit.data.render import apply_template_choice, render_sample

    apply_template_choice(tok, "qwen")  # LLaMA-Factory's qwen: <tool_response> observations (chatml: tool turns)
    sample = samples()[0]
    r = render_sample(tok, sample["messages"], 2048, tools=sample["tools"], default_system="You are a weather bot.")
    prompt, trained = split(tok, r)
    assert prompt.startswith("<|im_start|>system\nYou are a weather bot.\n\n# Tools") and "<tool_call>" in trained


def test_the_tokenizers_own_template_writes_tools_as_llamafactory_parses_it(tok):
    """No template key: LLaMA-Factory parses the tokenizer's Jinja into slots (issue 31), so even a Jinja with
    a tool section of its own gets LLaMA-Factory's default tool format (the tools after the system prompt,
    Action / Action Input calls) and tool results in its user slot; so does Cockpit."""
    from cockpit.data.render import apply_template_choice, render_sample

    tok.chat_template = (
        "{% if tools %}<|im_start|>system\nTOOLS{% for t in tools %} {{ t.function.name if t.function else t.name }}{% endfor %}<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.tool_calls %}{% for c in m.tool_calls %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}"
        "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    apply_template_choice(tok, None)
    sample = samples()[0]
    prompt, trained = split(tok, render_sample(tok, sample["messages"], 2048, tools=sample["tools"]))
    assert "TOOLS get_weather" not in prompt and "You have access to the following tools:" in prompt
    assert "> Tool Name: get_weather" in prompt
    assert 'Action: get_weather\nAction Input: {"city": "Paris", "unit": "celsius"}' in trained
    assert '<|im_start|>user\n{"temperature": 21' in prompt and '"temperature": 21' not in trained


def test_bad_function_call_and_tools_are_reported_by_line(tmp_path):
    from cockpit.data.formats import DatasetSpec, load_dataset_file

    good = json.loads((FIXTURES / "toolcall_sharegpt.json").read_text())[0]
    bad_call = json.loads(json.dumps(good))
    bad_call["conversations"][1]["value"] = "get_weather(Paris)"
    bad_tools = dict(good, tools="[{not json")
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (good, bad_call, bad_tools)))
    loaded = load_dataset_file(DatasetSpec("bad", path, "sharegpt"))
    assert len(loaded.samples) == 1
    assert [p.line for p in loaded.problems] == [2, 3]
    assert "function_call: invalid JSON" in loaded.problems[0].message and "tools: invalid JSON" in loaded.problems[1].message


def test_tool_format_values(tiny_model_dir):
    from cockpit.config import validate
    from cockpit.errors import InputError

    base = {"model_name_or_path": str(tiny_model_dir), "dataset": "cockpit_identity", "use_cpu": True}
    for ok in ("default", "qwen", "glm4", "llama3", "mistral", "seed_oss"):
        assert validate({**base, "tool_format": ok}).tool_format == ok
    for left_out in ("gemma4", "qwen3_5"):
        with pytest.raises(InputError, match="tool_format.*not implemented"):
            validate({**base, "tool_format": left_out})
    with pytest.raises(InputError, match="tool_format"):
        validate({**base, "tool_format": "hermes"})


def toolcall_config(tmp_path: Path, model_dir: Path, **over) -> Path:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    shutil.copy(FIXTURES / "toolcall_sharegpt.json", data / "toolcall_sharegpt.json")
    shutil.copy(FIXTURES / "toolcall_dataset_info.json", data / "dataset_info.json")
    over = {"tool_format": "qwen", "template": "qwen", "probes": None, **over}
    return tiny_config(tmp_path, model_dir, "tools", dataset="toolcall_demo", dataset_dir=str(data), cutoff_len=512, **over)


def test_cockpit_check_reads_the_tool_dataset(tmp_path, tiny_model_dir):
    """What ``cockpit check CONFIG --json`` prints (its code, in-process: the CLI's start-up is slow)."""
    from cockpit.config import load_config
    from cockpit.preflight.checks import check_run

    out = check_run(load_config(toolcall_config(tmp_path, tiny_model_dir)), log=lambda *_: None, with_devices=False).as_dict()
    assert out["samples"] == 3 and out["truncation"]["samples"] == 3 and out["formats"] == {"toolcall_demo": "sharegpt"}
    trained = "".join(p["text"] for p in out["preview"]["pieces"] if p["trained"])
    prompt = "".join(p["text"] for p in out["preview"]["pieces"] if not p["trained"])
    assert "<tools>" in prompt and "<tool_call>" in trained and "<tool_response>" in prompt
    assert out["template"] == "qwen (LLaMA-Factory 0.9.5's, token for token)"  # the data report says which


def test_cockpit_check_says_the_tokenizers_own_template_rendered(tmp_path, tiny_model_dir):
    """No template key: the data report says the tokenizer's own template, parsed as LLaMA-Factory parses it."""
    from cockpit.config import load_config
    from cockpit.preflight.checks import check_run

    cfg = load_config(toolcall_config(tmp_path, tiny_model_dir, template=None))
    out = check_run(cfg, log=lambda *_: None, with_devices=False).as_dict()
    assert out["template"] == (
        "the tokenizer's own (parsed into LLaMA-Factory's slots as LLaMA-Factory does without a template key)"
    )
    trained = "".join(p["text"] for p in out["preview"]["pieces"] if p["trained"])
    assert "<tool_call>" in trained  # tool_format qwen, set by the config, writes the calls


@pytest.mark.slow
def test_a_tiny_run_trains_on_tool_calls(tmp_path, tiny_model_dir):
    cfg = toolcall_config(tmp_path, tiny_model_dir, max_steps=3, save_steps=10)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = next(d for d in (tmp_path / "runs").iterdir() if d.is_dir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["state"] == "finished" and summary["steps"] == 3 and summary["samples"] == 3
    assert math.isfinite(summary["last_loss"]) and (run / "adapter" / "adapter_config.json").exists()
