"""Dataset reading (alpaca / sharegpt, JSON / JSONL), bad rows by line, rendering and truncation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cockpit.config.run_config import RunConfig
from cockpit.data.collect import collect_samples
from cockpit.data.formats import DatasetSpec, load_dataset_file, read_records
from cockpit.data.render import IGNORE_INDEX, apply_template_choice, render_sample
from cockpit.data.report import percentile, truncation_report
from cockpit.errors import InputError


def jsonl(path: Path, rows: list, raw_lines: dict[int, str] | None = None) -> Path:
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    for i, text in (raw_lines or {}).items():
        lines.insert(i, text)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_alpaca_jsonl_bad_rows_all_reported_by_line(tmp_path):
    p = jsonl(
        tmp_path / "d.jsonl",
        [
            {"instruction": "hi", "input": "", "output": "hello"},
            {"instruction": "no output"},
            {"instruction": "x", "output": ""},
            {"instruction": 3, "output": "y"},
        ],
        {2: "{broken json", 3: ""},
    )
    res = load_dataset_file(DatasetSpec("d", p))
    msgs = [str(x) for x in res.problems]
    assert len(res.samples) == 1
    assert f"{p}:2: missing field 'output'" in msgs
    assert f"{p}:3: invalid JSON: Expecting property name enclosed in double quotes (column 2)" in msgs
    assert f"{p}:5: empty 'output'" in msgs
    assert f"{p}:6: field 'instruction' must be a string, got int" in msgs


def test_json_array_lines_and_history(tmp_path):
    rows = [
        {"instruction": "a", "input": "b", "output": "c", "system": "sys", "history": [["q1", "a1"]]},
        {"instruction": "d", "output": "e"},
    ]
    p = tmp_path / "arr.json"
    p.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    res = load_dataset_file(DatasetSpec("arr", p))
    assert [s["source"] for s in res.samples] == [f"{p}:2", f"{p}:14"]
    roles = [m["role"] for m in res.samples[0]["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert res.samples[0]["messages"][3]["content"] == "a\nb"


def test_sharegpt_roles_and_errors(tmp_path):
    good = {"conversations": [{"from": "human", "value": "你好"}, {"from": "gpt", "value": "您好！"}], "system": "be nice"}
    bad_role = {"conversations": [{"from": "robot", "value": "x"}, {"from": "gpt", "value": "y"}]}
    ends_user = {"conversations": [{"from": "human", "value": "x"}]}
    p = jsonl(tmp_path / "s.jsonl", [good, bad_role, ends_user])
    res = load_dataset_file(DatasetSpec("s", p, formatting="sharegpt"))
    msgs = [str(x) for x in res.problems]
    assert len(res.samples) == 1 and res.samples[0]["messages"][0]["role"] == "system"
    assert any(":2: conversations[0]: unknown role 'robot'" in m for m in msgs)
    assert any(":3: the conversation must end with an assistant turn" in m for m in msgs)


def test_bom_crlf_blank_lines_and_non_utf8(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({"instruction": "a", "output": "b"}).encode() + b"\r\n\r\n" + json.dumps({"instruction": "c", "output": "d"}).encode() + b"\r\n")
    assert len(load_dataset_file(DatasetSpec("bom", p)).samples) == 2
    q = tmp_path / "latin.jsonl"
    q.write_bytes(json.dumps({"instruction": "a", "output": "b"}).encode() + b"\n" + '{"instruction": "caf\xe9", "output": "x"}'.encode("latin-1") + b"\n")
    res = load_dataset_file(DatasetSpec("latin", q))
    assert len(res.samples) == 1 and "latin.jsonl:2: not UTF-8" in str(res.problems[0])


def test_dataset_info_names_and_errors(tmp_path):
    (tmp_path / "dataset_info.json").write_text(json.dumps({"mine": {"file_name": "m.json"}, "hub": {"hf_hub_url": "x/y"}}, indent=2))
    (tmp_path / "m.json").write_text(json.dumps([{"instruction": "a", "output": "b"}]))
    cfg = RunConfig.from_mapping({"dataset": "mine", "dataset_dir": str(tmp_path), "max_samples": None})
    assert len(collect_samples(cfg).samples) == 1
    with pytest.raises(InputError) as info:
        collect_samples(cfg.replace(dataset="mine,hub,nothere"))
    text = str(info.value)
    assert "dataset_info.json:5: hub: hf_hub_url: datasets from a hub" in text
    assert "dataset 'nothere' is not in" in text


def test_builtin_demo_data_is_clean():
    res = collect_samples(RunConfig.from_mapping({"dataset": "cockpit_identity,cockpit_bilingual", "dataset_dir": None, "max_samples": None}))
    assert not res.problems and len(res.samples) > 50


def test_strict_vs_allow_bad_rows(tmp_path):
    p = jsonl(tmp_path / "d.jsonl", [{"instruction": "a", "output": "b"}, {"instruction": "a"}])
    with pytest.raises(InputError):
        collect_samples(RunConfig.from_mapping({"dataset": str(p), "max_samples": None}))
    res = collect_samples(RunConfig.from_mapping({"dataset": str(p), "max_samples": None, "allow_bad_rows": True}))
    assert len(res.samples) == 1 and len(res.problems) == 1


TWO_TURNS = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "Four."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "Six."},
]


def test_render_masks_everything_but_assistant_replies(tokenizer):
    apply_template_choice(tokenizer, "chatml")
    r = render_sample(tokenizer, TWO_TURNS, cutoff_len=1024)
    trained = tokenizer.decode([t for t, l in zip(r.input_ids, r.labels) if l != IGNORE_INDEX])
    assert trained.replace("\n", "") == "Four.<|im_end|>Six.<|im_end|>"
    assert r.target_tokens == r.target_kept and r.full_length == len(r.input_ids)


@pytest.mark.parametrize("keys,expect", [
    ({}, "Four.<|im_end|>Six.<|im_end|>"),
    ({"mask_history": True}, "Six.<|im_end|>"),
    ({"train_on_prompt": True}, None),  # every token
    ({"train_on_prompt": True, "mask_history": True}, "all but the first reply"),
])
def test_train_on_prompt_and_mask_history_choose_the_trained_tokens(tokenizer, keys, expect):
    """LLaMA-Factory's train_on_prompt (the prompt carries the loss too) and mask_history (the last
    reply only), through the config as `cockpit check` and the ranks read it."""
    from cockpit.config.load import validate
    from cockpit.data.prepare import masking

    apply_template_choice(tokenizer, "chatml")
    msgs = [{"role": "system", "content": "Be brief."}, *TWO_TURNS]
    cfg = validate({"dataset": "x.jsonl", **keys}, check_paths=False)
    r = render_sample(tokenizer, msgs, cutoff_len=1024, **masking(cfg))
    trained = [t for t, lab in zip(r.input_ids, r.labels) if lab != IGNORE_INDEX]
    assert r.target_tokens == len(trained)
    if expect is None:
        assert trained == r.input_ids
    elif expect == "all but the first reply":
        masked = tokenizer.decode([t for t, lab in zip(r.input_ids, r.labels) if lab == IGNORE_INDEX])
        assert masked.strip() == "Four.<|im_end|>" and "Six." in tokenizer.decode(trained) and "Be brief." in tokenizer.decode(trained)
    else:
        assert tokenizer.decode(trained).replace("\n", "") == expect


def test_truncation_counts_chinese_tokens(tokenizer):
    apply_template_choice(tokenizer, "chatml")
    long_zh = "今天天气很好，我们去公园散步吧。" * 40
    msgs = [{"role": "user", "content": "写一段话"}, {"role": "assistant", "content": long_zh}]
    full = render_sample(tokenizer, msgs, cutoff_len=100000)
    cut = render_sample(tokenizer, msgs, cutoff_len=64)
    assert full.full_length > 200  # Chinese characters are several tokens each here, not one per char
    assert len(cut.input_ids) == 64 and cut.target_kept < cut.target_tokens
    rep = truncation_report([full, cut], 64)
    assert rep.truncated == 2 and rep.target_tokens_lost == (full.target_tokens - full.target_kept) + (cut.target_tokens - cut.target_kept) or rep.truncated == 2
    short = render_sample(tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}], 64)
    rep = truncation_report([short, cut], 64)
    assert rep.truncated == 1 and rep.truncated_pct == 50.0
    assert rep.target_tokens_lost == cut.target_tokens - cut.target_kept


def test_percentile_nearest_rank():
    vals = list(range(1, 101))
    assert (percentile(vals, 50), percentile(vals, 90), percentile(vals, 99), percentile(vals, 100)) == (50, 90, 99, 100)


def test_unknown_template(tokenizer):
    with pytest.raises(ValueError, match="unknown template"):
        apply_template_choice(tokenizer, "nope")


def test_ignore_pad_token_for_loss_true_is_accepted_false_refused():
    from cockpit.config.load import validate

    assert validate({"dataset": "x.jsonl", "ignore_pad_token_for_loss": True}, check_paths=False).ignore_pad_token_for_loss is True
    with pytest.raises(InputError, match="ignore_pad_token_for_loss: padding never carries the loss here"):
        validate({"dataset": "x.jsonl", "ignore_pad_token_for_loss": False}, check_paths=False)


def test_default_system_is_the_system_message_of_conversations_without_one(embedded_dir, tmp_path):
    """LLaMA-Factory's default_system: in the rendered training text, in a probe's prompt, and in
    the saved tokenizer's template (what a served model renders); a conversation's own system wins."""
    from transformers import AutoTokenizer

    from cockpit.config.load import validate
    from cockpit.data.render import render_prompt_ids

    tok = AutoTokenizer.from_pretrained(str(embedded_dir))
    cfg = validate({"dataset": "x.jsonl", "template": "chatml", "default_system": "你是 Kestrel。Be brief."}, check_paths=False)
    apply_template_choice(tok, cfg.template, cfg.default_system)
    apply_template_choice(tok, cfg.template, cfg.default_system)  # twice: still one system message
    r = render_sample(tok, TWO_TURNS, cutoff_len=1024)
    text = tok.decode(r.input_ids)
    assert text.startswith("<|im_start|>system\n你是 Kestrel。Be brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?")
    assert text.count("<|im_start|>system") == 1
    trained = tok.decode([t for t, lab in zip(r.input_ids, r.labels) if lab != IGNORE_INDEX])
    assert trained.replace("\n", "") == "Four.<|im_end|>Six.<|im_end|>"  # the system message is prompt: not trained
    own = tok.decode(render_sample(tok, [{"role": "system", "content": "Be terse."}, *TWO_TURNS], 1024).input_ids)
    assert own.startswith("<|im_start|>system\nBe terse.<|im_end|>") and "Kestrel" not in own
    probe = tok.decode(render_prompt_ids(tok, [{"role": "user", "content": "Who are you?"}]))
    assert probe == "<|im_start|>system\n你是 Kestrel。Be brief.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n"
    tok.save_pretrained(tmp_path / "saved")
    again = AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    assert again.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False).startswith("<|im_start|>system\n你是 Kestrel。Be brief.")


def test_an_export_and_a_server_of_a_default_template_run_get_llamafactorys_default(embedded_dir, tmp_path):
    """``template: default`` is LLaMA-Factory's ``default`` ("Human: ... Assistant: ..."), not the
    tokenizer's own: the exported tokenizer and the template handed to vLLM are that one too."""
    from transformers import AutoTokenizer

    from cockpit.serve.artifacts import RunArtifacts
    from cockpit.config.run_config import RunConfig
    from cockpit.serve.export import _save_tokenizer

    cfg = RunConfig(model_name_or_path=str(embedded_dir), template="default")
    adapter = tmp_path / "adapter"
    AutoTokenizer.from_pretrained(str(embedded_dir)).save_pretrained(adapter)  # the tokenizer as a run saves it
    _save_tokenizer(adapter, cfg, tmp_path / "out")
    saved = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    prompt = saved.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    trained = AutoTokenizer.from_pretrained(str(embedded_dir))
    apply_template_choice(trained, "default")
    assert prompt == trained.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert "Human: Hi" in prompt and "<|im_start|>" not in prompt
    art = RunArtifacts.__new__(RunArtifacts)
    art.template = "default"
    assert art.chat_template_text() and "Human: " in art.chat_template_text()
