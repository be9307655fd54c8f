"""Conversations -> token ids and labels through a chat template; loss on assistant tokens only.

Each assistant turn's span is found by rendering the conversation up to that turn twice (with
the generation prompt, and with the turn); the text in between (the reply and its end-of-turn
marker) is trained, everything else is masked with -100. Token/character alignment uses the
fast tokenizer's offsets, so it works for any template and any script (Chinese included).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cockpit.data import tools as tools_mod

IGNORE_INDEX = -100

# A small set of named templates; omitted/'default' uses the tokenizer's own.
_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_LLAMA3 = (
    "{{ '<|begin_of_text|>' }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
_ALPACA = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}{{ '### Instruction:\n' + message['content'] + '\n\n' }}"
    "{% else %}{{ '### Response:\n' + message['content'] + eos_token + '\n\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Response:\n' }}{% endif %}"
)
# Qwen3's assistant turn: LLaMA-Factory's ReasoningTemplate writes an empty thought into a reply that has
# none (trained); with enable_thinking false it drops the reply's thought and puts the empty one in the prompt.
_QWEN3 = (
    "{%- set thinking = enable_thinking is not defined or enable_thinking -%}"
    "{% for message in messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' %}"
    "{% if not thinking and '<think>\n' in content and '\n</think>\n\n' in content %}"
    "{% set content = content.split('\n</think>\n\n', 1)[1].lstrip('\n') %}{% endif %}"
    "{% if not thinking %}{{ '<|im_start|>assistant\n<think>\n\n</think>\n\n' }}"
    "{% else %}{{ '<|im_start|>assistant\n' }}"
    "{% if '<think>' not in content and '</think>' not in content %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
    "{{ content + '<|im_end|>' + '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>' + '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if not thinking %}{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}"
)


@dataclass(frozen=True)
class TemplateSpec:
    """A template Cockpit renders as LLaMA-Factory 0.9.5's of the same name (tests/test_lf_templates.py):
    its Jinja, its default system prompt, its tool format and how it writes observations
    (cockpit.data.tools.as_text_turns)."""

    jinja: str
    default_system: str = ""
    tool_format: str | None = None
    observation: str | None = None

    def chat_template(self) -> str:
        if self.tool_format is None:
            return self.jinja
        return tools_mod.TOOL_HINT % (self.tool_format, self.observation or "user") + self.jinja


_ALPACA_SYSTEM = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
)
_QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
_SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face."
TEMPLATE_SPECS = {
    "chatml": TemplateSpec(_CHATML, tool_format="default", observation="tool"),
    "llama3": TemplateSpec(_LLAMA3),
    "alpaca": TemplateSpec(_ALPACA, _ALPACA_SYSTEM),
    "qwen": TemplateSpec(_CHATML, _QWEN_SYSTEM, "qwen", "qwen"),
    "qwen3": TemplateSpec(_QWEN3, tool_format="qwen", observation="qwen"),
    "qwen3_nothink": TemplateSpec(_CHATML, tool_format="qwen", observation="qwen"),
    "smollm": TemplateSpec(_CHATML, tool_format="default", observation="user"),
    "smollm2": TemplateSpec(_CHATML, _SMOLLM2_SYSTEM, "default", "user"),
}
NAMED_TEMPLATES = {name: spec.chat_template() for name, spec in TEMPLATE_SPECS.items()}
TEMPLATE_ALIASES = {"qwen2": "qwen", "qwen2_5": "qwen"}


def template_default_system(template: str | None, default_system: str | None) -> str | None:
    """The system prompt of a conversation without one: the config's ``default_system``, else the
    named template's own (LLaMA-Factory's ``default_system`` of that template)."""
    if default_system is not None or not template:
        return default_system
    spec = TEMPLATE_SPECS.get(TEMPLATE_ALIASES.get(template, template))
    return (spec.default_system or None) if spec else None


def template_names() -> list[str]:
    return ["default", *NAMED_TEMPLATES, *TEMPLATE_ALIASES]


def apply_template_choice(
    tokenizer: Any, template: str | None, default_system: str | None = None, enable_thinking: bool = True
) -> None:
    """Set the tokenizer's chat template from the config's ``template`` key (ValueError if unknown);
    ``default_system``: the system message of every conversation that has none; ``enable_thinking``
    false: the template renders with ``enable_thinking = false`` (a reasoning model's own template,
    e.g. Qwen3's, then writes its empty thought). Both are baked into the template, so training,
    probes, chat and the saved tokenizer (a served model) render alike."""
    if getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = unwrapped(tokenizer.chat_template)  # a template Cockpit saved before
    if not template or template == "default":
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat template of its own; set template to one of " + ", ".join(NAMED_TEMPLATES)
            )
    else:
        name = TEMPLATE_ALIASES.get(template, template)
        if name not in NAMED_TEMPLATES:
            raise ValueError(f"unknown template {template!r}; known: {', '.join(template_names())}")
        tokenizer.chat_template = NAMED_TEMPLATES[name]
    default_system = template_default_system(template, default_system)
    if default_system:
        tokenizer.chat_template = with_default_system(tokenizer.chat_template, default_system)
    if not enable_thinking:
        tokenizer.chat_template = with_thinking_off(tokenizer.chat_template)


_SYSTEM_MARK = "{#- cockpit default_system -#}"
_THINKING_MARK = "{#- cockpit enable_thinking -#}"


def with_thinking_off(template: str) -> str:
    """``template`` rendered with ``enable_thinking`` false (LLaMA-Factory's ``enable_thinking: false``)."""
    return _THINKING_MARK + "{%- set enable_thinking = false -%}" + _THINKING_MARK + template


def unwrapped(template: str) -> str:
    """``template`` without the settings Cockpit wrapped around it (enable_thinking, default_system)."""
    for mark in (_THINKING_MARK, _SYSTEM_MARK):  # outermost first
        if template.startswith(mark):
            template = template.split(mark, 2)[2]
    return template


def with_default_system(template: str, system: str) -> str:
    """``template`` with a system message ``system`` put first in a conversation that has none
    (LLaMA-Factory's ``default_system``). Applied once: an already wrapped template is unwrapped first."""
    import json

    if template.startswith(_SYSTEM_MARK):
        template = template.split(_SYSTEM_MARK, 2)[2]
    literal = json.dumps(system, ensure_ascii=False)  # a JSON string is a Jinja string literal
    head = (
        "{% if not messages or messages[0]['role'] != 'system' %}"
        "{% set messages = [{'role': 'system', 'content': " + literal + "}] + messages %}{% endif %}"
    )
    return _SYSTEM_MARK + head + _SYSTEM_MARK + template


@dataclass
class Rendered:
    input_ids: list[int]
    labels: list[int]
    full_length: int  # tokens before truncation
    target_tokens: int  # assistant tokens before truncation
    target_kept: int  # assistant tokens after truncation


def _render(tokenizer: Any, messages: Sequence[dict[str, Any]], gen: bool, tools: Any = None) -> str:
    extra = {"tools": list(tools)} if tools else {}
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=gen, **extra)


_TOOL_FORMAT_OF: dict[tuple[str, str | None], str] = {}  # (chat template, tool_format) -> the format used


def with_tools(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    tool_format: str | None = None,
    default_system: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(turns, tools for the template): a conversation with tools or tool turns either as given with
    its tools (the template writes them) or written as text in ``tool_format`` (cockpit.data.tools)."""
    if not tools and not tools_mod.has_tool_turns(messages):
        return list(messages), None
    key = (str(getattr(tokenizer, "chat_template", "")), tool_format)
    if key not in _TOOL_FORMAT_OF:
        _TOOL_FORMAT_OF[key] = tools_mod.choose_tool_format(tokenizer, tool_format)
    fmt = _TOOL_FORMAT_OF[key]
    if fmt == tools_mod.NATIVE:
        return list(messages), list(tools or []) or None
    hint = tools_mod.template_tool_hint(tokenizer)
    return tools_mod.as_text_turns(messages, tools, fmt, default_system, hint[1] if hint else None), None


def trainable_spans(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    *,
    train_on_prompt: bool = False,
    mask_history: bool = False,
    tools: Sequence[dict[str, Any]] | None = None,
    tool_format: str | None = None,
    default_system: str | None = None,
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the character spans trained within it: the assistant replies
    (``mask_history``: the last one only); ``train_on_prompt``: the prompt text too (everything
    but the replies ``mask_history`` leaves out), as LLaMA-Factory's keys of those names do. A
    sample's ``tools`` are written into the prompt (:func:`with_tools`); its function calls are
    assistant replies, its observations prompt."""
    full, _replies, spans = _spans(
        tokenizer, messages, train_on_prompt, mask_history, tools, tool_format, default_system
    )
    return full, spans


def _spans(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    train_on_prompt: bool,
    mask_history: bool,
    tools: Sequence[dict[str, Any]] | None,
    tool_format: str | None,
    default_system: str | None,
) -> tuple[str, list[tuple[int, int]], list[tuple[int, int]]]:
    """(rendered text, the assistant replies' character spans, the trained spans): see trainable_spans."""
    messages, tools = with_tools(tokenizer, messages, tools, tool_format, default_system)
    full, replies = _reply_spans(tokenizer, messages, tools)
    trained = replies[-1:] if mask_history else replies
    if not train_on_prompt:
        return full, replies, trained
    masked = [s for s in replies if s not in trained]
    spans, pos = [], 0
    for a, b in masked:
        if a > pos:
            spans.append((pos, a))
        pos = b
    if pos < len(full):
        spans.append((pos, len(full)))
    return full, replies, spans


def _reply_spans(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any = None
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the character spans of the assistant replies within it."""
    full = _render(tokenizer, messages, False, tools)
    spans: list[tuple[int, int]] = []
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        prefix = _render(tokenizer, messages[:i], True, tools)
        upto = _render(tokenizer, messages[: i + 1], False, tools)
        if not (upto.startswith(prefix) and full.startswith(upto)):
            spans = []  # template renders history differently: train the last turn only
            break
        spans.append((len(prefix), len(upto)))
    if not spans:
        prefix = _render(tokenizer, messages[:-1], True, tools)
        if not full.startswith(prefix):
            raise ValueError("the chat template renders the prompt inconsistently; cannot find the reply")
        spans = [(len(prefix), len(full))]
    return full, spans


def render_sample(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    cutoff_len: int,
    *,
    train_on_prompt: bool = False,
    mask_history: bool = False,
    tools: Sequence[dict[str, Any]] | None = None,
    tool_format: str | None = None,
    default_system: str | None = None,
) -> Rendered:
    text, replies, spans = _spans(
        tokenizer, messages, train_on_prompt, mask_history, tools, tool_format, default_system
    )
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = enc["input_ids"]
    labels = [IGNORE_INDEX] * len(ids)
    k = 0
    for t, (start, end) in enumerate(enc["offset_mapping"]):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k < len(spans) and spans[k][0] <= start < spans[k][1] and end > start:
            labels[t] = ids[t]
    target = sum(1 for x in labels if x != IGNORE_INDEX)
    keep: Sequence[int] = range(len(ids))
    if len(ids) > cutoff_len:
        starts = [start for start, _ in enc["offset_mapping"]]
        keep = truncated_positions(starts, replies, cutoff_len, mask_history)
    ids_c, labels_c = [ids[t] for t in keep], [labels[t] for t in keep]
    kept = sum(1 for x in labels_c if x != IGNORE_INDEX)
    return Rendered(ids_c, labels_c, len(ids), target, kept)


def infer_seqlen(source_len: int, target_len: int, cutoff_len: int) -> tuple[int, int]:
    """LLaMA-Factory's split of a turn's token budget between its prompt (source) and reply (target)."""
    if target_len * 2 < cutoff_len:
        max_target_len = cutoff_len
    elif source_len * 2 < cutoff_len:
        max_target_len = cutoff_len - source_len
    else:
        max_target_len = int(cutoff_len * (target_len / (source_len + target_len)))
    new_target_len = min(max_target_len, target_len)
    new_source_len = min(max(cutoff_len - new_target_len, 0), source_len)
    return new_source_len, new_target_len


def truncated_positions(
    starts: Sequence[int], replies: Sequence[tuple[int, int]], cutoff_len: int, mask_history: bool
) -> list[int]:
    """The token positions kept at ``cutoff_len`` as LLaMA-Factory's supervised processor keeps them:
    each (prompt, reply) turn in order (``mask_history``: last turn first) gets what is left of the
    budget, split by :func:`infer_seqlen`; a turn's prompt and reply are cut at their ends. ``starts``:
    each token's first character; ``replies``: the replies' character spans."""

    def first_at(pos: int) -> int:
        return next((t for t, s in enumerate(starts) if s >= pos), len(starts))

    turns, prev = [], 0
    for a, b in replies:
        ta, tb = first_at(a), first_at(b)
        turns.append((range(prev, ta), range(ta, tb)))
        prev = tb
    if turns and prev < len(starts):  # text after the last reply belongs to it
        turns[-1] = (turns[-1][0], range(turns[-1][1].start, len(starts)))
    kept: list[list[int]] = []
    total = 0
    for source, target in reversed(turns) if mask_history else turns:
        if total >= cutoff_len:
            break
        sl, tl = infer_seqlen(len(source), len(target), cutoff_len - total)
        kept.append([*source[:sl], *target[:tl]])
        total += sl + tl
    if mask_history:
        kept.reverse()
    return [t for part in kept for t in part]


def render_prompt_ids(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any = None) -> list[int]:
    """Token ids of a prompt ready for generation (probes, chat, predictions); ``tools``: the list a
    template that writes tools itself gets (:func:`with_tools`)."""
    text = _render(tokenizer, messages, True, tools)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
