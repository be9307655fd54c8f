"""enable_thinking (LLaMA-Factory's key): false renders every conversation with the chat template's
``enable_thinking`` false, in training and in the saved tokenizer; true (the default) leaves the
template as it is."""

from __future__ import annotations

import copy

# the generation-prompt end of Qwen3's chat template, the part that reads enable_thinking
QWEN3_LIKE = (  # Qwen3's chat template, cut to what reads enable_thinking: replies and the generation prompt
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' %}<|im_start|>assistant\n<think>\n\n</think>\n\n{{ m['content'] }}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
MESSAGES = [{"role": "user", "content": "2+2?"}]


def _tok(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = QWEN3_LIKE
    return tok


def test_thinking_off_writes_the_empty_thought_and_on_leaves_the_template(tokenizer):
    from cockpit.data.render import apply_template_choice

    on = _tok(tokenizer)
    apply_template_choice(on, None, None, enable_thinking=True)
    assert on.chat_template == QWEN3_LIKE
    assert "<think>" not in on.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    off = _tok(tokenizer)
    apply_template_choice(off, None, None, enable_thinking=False)
    prompt = off.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_settings_baked_once_and_undone_by_the_next_choice(tokenizer):
    """A tokenizer saved with the settings baked in (an adapter, an export) gets the next config's."""
    from cockpit.data.render import apply_template_choice, unwrapped

    tok = _tok(tokenizer)
    apply_template_choice(tok, None, "Be brief.", enable_thinking=False)
    apply_template_choice(tok, None, "Be brief.", enable_thinking=False)  # again: no double wrapping
    assert tok.chat_template.count("set enable_thinking") == 1 and tok.chat_template.count("Be brief.") == 1
    assert unwrapped(tok.chat_template) == QWEN3_LIKE
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.") and text.endswith("</think>\n\n")
    apply_template_choice(tok, None, None, enable_thinking=True)
    assert tok.chat_template == QWEN3_LIKE


def test_the_key_loads_and_reaches_the_rendered_training_text(tmp_path, tokenizer):
    import json

    from cockpit.config import load_config
    from cockpit.data.prepare import prepare_dataset

    (tmp_path / "d.jsonl").write_text(json.dumps({"instruction": "2+2?", "output": "4"}) + "\n")
    tok = _tok(tokenizer)
    (tmp_path / "c.yaml").write_text("model_name_or_path: smollm2-135m-instruct\ndataset: d.jsonl\nenable_thinking: false\n")
    cfg = load_config(str(tmp_path / "c.yaml"))
    assert cfg.enable_thinking is False
    rendered = prepare_dataset(cfg, tok).rendered
    assert "set enable_thinking = false" in tok.chat_template
    text = tok.decode(rendered[0].input_ids)
    assert "<think>\n\n</think>\n\n4" in text
    trained = tok.decode([i for i, lab in zip(rendered[0].input_ids, rendered[0].labels) if lab != -100])
    assert "</think>" not in trained and "4" in trained  # the empty thought is the prompt's, the answer is trained
