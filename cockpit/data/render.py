"""Conversations -> token ids and labels through a chat template; loss on assistant tokens only.

A named template (the config's ``template``) is LLaMA-Factory 0.9.5's of that name and renders token
for token as LLaMA-Factory does (cockpit.data.lf_render, the templates' data in
cockpit.data.lf_templates); the tokenizer's chat template then carries the template's settings in a
header and its Jinja, for ``apply_chat_template`` and a served model. Without one, the tokenizer's own
Jinja stays its chat template (as LLaMA-Factory leaves it) and is parsed into LLaMA-Factory's slots as
LLaMA-Factory's ``parse_template`` parses it; those slots render, token for token as LLaMA-Factory does.
Only a Jinja LLaMA-Factory cannot parse (one that refuses a system message) renders itself: each
assistant turn's span is found by rendering the conversation up to that turn twice (with the
generation prompt, and with the turn); the text in between (the reply and its end-of-turn marker) is
trained, everything else is masked with -100. Token/character alignment uses the fast tokenizer's
offsets, so it works for any template and any script (Chinese included).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from cockpit.data import lf_render
from cockpit.data import tools as tools_mod
from cockpit.data.lf_templates import LF_MULTIMODAL_TEMPLATES, LF_TEMPLATES
from cockpit.data.media import IMAGE_TEMPLATES

IGNORE_INDEX = lf_render.IGNORE_INDEX
infer_seqlen = lf_render.infer_seqlen  # LLaMA-Factory's split of a turn's budget

_LF_MARK = "{#- cockpit lf-template "  # + the settings as JSON + " -#}": a template made from LLaMA-Factory's


def _lf_header(name: str, default_system: str | None, enable_thinking: bool) -> str:
    settings = {"name": name, "default_system": default_system, "enable_thinking": enable_thinking}
    return _LF_MARK + json.dumps(settings, sort_keys=True).replace("#", "\\u0023") + " -#}"


_LF_OF: dict[str, lf_render.LfTemplate | None] = {}


def lf_template_of(tokenizer: Any) -> lf_render.LfTemplate | None:
    """The LLaMA-Factory template (with its settings) the tokenizer's chat template was made from by
    :func:`apply_template_choice`, or None (the tokenizer's own template)."""
    template = str(getattr(tokenizer, "chat_template", "") or "")
    if not template.startswith(_LF_MARK):
        return None
    header = template[: template.index(" -#}") + 4]
    if header not in _LF_OF:
        settings = json.loads(header[len(_LF_MARK) : -4])
        _LF_OF[header] = lf_render.lf_template(
            settings["name"], settings["default_system"], settings["enable_thinking"]
        )
    return _LF_OF[header]


_OWN_OF: dict[tuple[str, str, str, int], tuple[lf_render.LfTemplate | None, str | None]] = {}


def _own_settings(template: str) -> tuple[str, str | None, bool]:
    """(the tokenizer's own Jinja, the default system and enable_thinking Cockpit wrapped around it)."""
    thinking = not template.startswith(_THINKING_MARK)
    system = None
    for mark in (_THINKING_MARK, _SYSTEM_MARK):  # outermost first
        if template.startswith(mark):
            head, template = template.split(mark, 2)[1:]
            if mark == _SYSTEM_MARK:
                system = json.loads(head.split("'content': ", 1)[1].rsplit("}] + messages", 1)[0])
    return template, system, thinking


def own_template(tokenizer: Any) -> tuple[lf_render.LfTemplate | None, str | None]:
    """(the tokenizer's own chat template parsed into LLaMA-Factory's slots as LLaMA-Factory parses it when
    the config sets no template, None), or (None, why LLaMA-Factory cannot parse it): then its Jinja
    renders. (None, None) for a template Cockpit made from a named one, or none at all."""
    template = str(getattr(tokenizer, "chat_template", "") or "")
    if not template or template.startswith(_LF_MARK):
        return None, None
    key = (template, str(getattr(tokenizer, "name_or_path", "")), str(tokenizer.bos_token), len(tokenizer))
    if key not in _OWN_OF:
        jinja, system, thinking = _own_settings(template)
        try:
            _OWN_OF[key] = (lf_render.parse_template(tokenizer, jinja, system, thinking), None)
        except Exception as exc:  # noqa: BLE001 - the Jinja's own error (e.g. no system role): it renders itself
            _OWN_OF[key] = (None, f"{type(exc).__name__}: {exc}")
    return _OWN_OF[key]


def template_in_use(tokenizer: Any) -> lf_render.LfTemplate | None:
    """The LLaMA-Factory template the tokenizer renders with: a named one (:func:`lf_template_of`) or its
    own Jinja parsed as LLaMA-Factory parses it; None when that Jinja renders itself (unparsable)."""
    return lf_template_of(tokenizer) or own_template(tokenizer)[0]


def template_description(tokenizer: Any) -> str:
    """Which template renders the data, for the data report."""
    named = lf_template_of(tokenizer)
    if named is not None:
        return f"{named.name} (LLaMA-Factory 0.9.5's, token for token)"
    parsed, why = own_template(tokenizer)
    if parsed is not None:
        return "the tokenizer's own (parsed into LLaMA-Factory's slots as LLaMA-Factory does without a template key)"
    return f"the tokenizer's own, rendered by its Jinja (LLaMA-Factory cannot parse it: {why})"


def lf_chat_template(name: str, default_system: str | None = None, enable_thinking: bool = True) -> str:
    """The chat template Cockpit gives a tokenizer for LLaMA-Factory's template ``name``: a header with the
    settings (what render_sample reads to render as LLaMA-Factory does) and the template as Jinja."""
    template = lf_render.lf_template(name, default_system, enable_thinking)
    return _lf_header(name, default_system, enable_thinking) + lf_render.chat_template(template)


NAMED_TEMPLATES = {name: lf_chat_template(name) for name in LF_TEMPLATES}
TEMPLATE_ALIASES = {"qwen2": "qwen", "qwen2_5": "qwen"}


def template_default_system(template: str | None, default_system: str | None) -> str | None:
    """The system prompt of a conversation without one: the config's ``default_system``, else the
    named template's own (LLaMA-Factory's ``default_system`` of that template)."""
    if default_system is not None or not template:
        return default_system
    name = TEMPLATE_ALIASES.get(template, template)
    data = lf_render.template_data(name)
    return (data.get("default_system") or None) if data else None


def template_names() -> list[str]:
    return [*NAMED_TEMPLATES, *TEMPLATE_ALIASES]


def apply_template_choice(
    tokenizer: Any, template: str | None, default_system: str | None = None, enable_thinking: bool = True
) -> None:
    """Set the tokenizer's chat template from the config's ``template`` key (ValueError if unknown).

    A named template is LLaMA-Factory 0.9.5's of that name (``default`` included), rendered token for
    token as LLaMA-Factory renders it (cockpit.data.lf_render); the tokenizer gets its stop words as
    special tokens and its eos as LLaMA-Factory sets them. Unset: the tokenizer's own template.
    ``default_system``: the system message of every conversation that has none; ``enable_thinking``
    false: reasoning templates write the empty thought into the prompt and drop the replies' thoughts
    (the tokenizer's own template renders with ``enable_thinking = false``). Both are baked into the
    template, so training, probes, chat and the saved tokenizer (a served model) render alike."""
    if getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = unwrapped(tokenizer.chat_template)  # a template Cockpit saved before
    if template:
        name = TEMPLATE_ALIASES.get(template, template)
        if name in LF_MULTIMODAL_TEMPLATES and name not in IMAGE_TEMPLATES:
            raise ValueError(
                f"template {template!r} is one of LLaMA-Factory's multimodal templates (its "
                f"{LF_MULTIMODAL_TEMPLATES[name]} plugin, for images / video / audio): Cockpit trains images with "
                f"{', '.join(sorted(IMAGE_TEMPLATES))} only so far (issue 63); for text, use the text template of the "
                "model family or leave template unset (the tokenizer's own)"
            )
        if name not in LF_TEMPLATES and name not in IMAGE_TEMPLATES:
            raise ValueError(f"unknown template {template!r}; known: {', '.join(template_names())}")
        lf = lf_render.lf_template(name, default_system, enable_thinking)
        lf_render.fix_tokenizer(tokenizer, lf)
        tokenizer.chat_template = lf_chat_template(name, default_system, enable_thinking)
        return
    if lf_template_of(tokenizer) is not None:  # a tokenizer Cockpit saved with a named template: kept
        return
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat template of its own; set template to one of " + ", ".join(template_names())
        )
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
    lf = template_in_use(tokenizer)
    if lf is not None:  # calls written as the template's function slot writes them; tools and observations as they are
        lf = lf_render.with_tool_format(lf, tool_format)
        turns = [
            {"role": "assistant", "content": lf_render.function_text(lf, m)} if m.get("tool_calls") else dict(m)
            for m in messages
        ]
        return turns, None if tools is None else list(tools)  # [] kept: LLaMA-Factory's empty system slot
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
    lf = _lf_for(tokenizer, tool_format, default_system)
    if lf is not None:
        enc = lf_render.encode_sample(
            tokenizer, lf, messages, 10**12, tools=tools, train_on_prompt=train_on_prompt, mask_history=mask_history
        )
        return _text_and_spans(tokenizer, enc.input_ids, enc.labels)
    full, _replies, spans = _spans(
        tokenizer, messages, train_on_prompt, mask_history, tools, tool_format, default_system
    )
    return full, spans


def _lf_for(tokenizer: Any, tool_format: str | None, default_system: str | None) -> lf_render.LfTemplate | None:
    """The tokenizer's LLaMA-Factory template (named, or its own parsed) with a call's ``tool_format`` /
    ``default_system``, or None (its own Jinja renders)."""
    lf = template_in_use(tokenizer)
    if lf is None:
        return None
    if default_system is not None and default_system != lf.default_system:
        lf = replace(lf, default_system=default_system)
    return lf_render.with_tool_format(lf, tool_format)


def _text_and_spans(tokenizer: Any, ids: Sequence[int], labels: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """The text of ``ids`` and the character spans of its trained runs (each run decoded as a whole)."""
    text, spans, start = "", [], 0
    for t in range(1, len(ids) + 1):
        if t == len(ids) or (labels[t] == IGNORE_INDEX) != (labels[start] == IGNORE_INDEX):
            piece = tokenizer.decode(list(ids[start:t]))
            if labels[start] != IGNORE_INDEX:
                spans.append((len(text), len(text) + len(piece)))
            text += piece
            start = t
    return text, spans


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
    """A sample's token ids and labels (``cutoff_len``: LLaMA-Factory's truncation). A template made from
    LLaMA-Factory's renders as LLaMA-Factory does (cockpit.data.lf_render); the tokenizer's own template
    renders the text, whose assistant replies are trained."""
    lf = _lf_for(tokenizer, tool_format, default_system)
    if lf is not None:
        enc = lf_render.encode_sample(
            tokenizer, lf, messages, cutoff_len, tools=tools, train_on_prompt=train_on_prompt, mask_history=mask_history
        )
        kept = sum(1 for x in enc.labels if x != IGNORE_INDEX)
        return Rendered(enc.input_ids, enc.labels, enc.full_length, enc.target_tokens, kept)
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
    lf = template_in_use(tokenizer)
    if lf is not None:
        return lf_render.encode_prompt(tokenizer, lf, messages, tools)
    text = _render(tokenizer, messages, True, tools)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
