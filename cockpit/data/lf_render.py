"""A conversation -> token ids exactly as LLaMA-Factory 0.9.5's named templates render it (issue 31).

The templates are data (cockpit.data.lf_templates). Rendering follows LLaMA-Factory's
``Template.encode_multiturn``: every message becomes its template slot's elements (the first also
gets the prefix and the system slot, with the tools' text appended to the system prompt); each
string element is tokenized on its own (so token boundaries fall where LLaMA-Factory's do), special
tokens by id, bos/eos as the tokenizer's. The messages pair up as (prompt, reply) turns, truncated
at ``cutoff_len`` by LLaMA-Factory's ``infer_seqlen`` split and masked as its supervised processor
masks them (``train_on_prompt``, ``mask_history``, ``efficient_eos``). Reasoning templates write
the empty thought into a reply that has none (trained; in the prompt with ``enable_thinking``
false) and drop thoughts with ``enable_thinking`` false. No torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cockpit.data import lf_tools
from cockpit.data.lf_templates import LF_TEMPLATES
from cockpit.data.media import IMAGE_TEMPLATES
from cockpit.data.mm_plugins import IMAGE_TEXT_TEMPLATES

IGNORE_INDEX = -100
Slot = Any  # str | {"token": str} | {"special": "bos_token" | "eos_token"}
_CONTENT = ["{{content}}"]
_EOS = {"special": "eos_token"}


@dataclass(frozen=True)
class LfTemplate:
    """One LLaMA-Factory template (``register_template``'s arguments, defaults filled in)."""

    name: str
    user: tuple[Slot, ...]
    assistant: tuple[Slot, ...]
    system: tuple[Slot, ...]
    observation: tuple[Slot, ...]
    function: tuple[Slot, ...]
    function_format: str
    tool_format: str
    tools_slots: tuple[Slot, ...] | None
    prefix: tuple[Slot, ...]
    default_system: str
    stop_words: tuple[str, ...]
    thought_words: tuple[str, str]
    tool_call_words: tuple[str, str]
    efficient_eos: bool
    replace_eos: bool
    kind: str  # plain | llama2 (system fused into the first user turn) | reasoning | glm47_reasoning
    enable_thinking: bool = True

    @property
    def reasoning(self) -> bool:
        return self.kind in ("reasoning", "glm47_reasoning")

    def empty_thought(self) -> str:
        if self.kind == "glm47_reasoning":
            return self.thought_words[1]
        return self.thought_words[0] + self.thought_words[1]

    def remove_thought(self, content: str) -> str:
        open_, close = map(re.escape, self.thought_words)
        return re.sub(f"{open_}(.*?){close}", "", content, flags=re.DOTALL).lstrip("\n")

    def has_thought(self, content: str) -> bool:
        return self.thought_words[0].strip() in content or self.thought_words[1].strip() in content


def template_data(name: str) -> dict[str, Any] | None:
    """LLaMA-Factory's data of template ``name`` (None if none): a text template's, or an image template's
    text slots (llava: vicuna's; qwen2_vl: its own, cockpit.data.mm_plugins.IMAGE_TEXT_TEMPLATES)."""
    key = IMAGE_TEMPLATES.get(name, name)
    return LF_TEMPLATES.get(key) or IMAGE_TEXT_TEMPLATES.get(key)


def _fields(name: str) -> dict[str, Any]:
    d = template_data(name)
    if d is None:
        raise KeyError(name)
    return {**_fields(d["like"]), **d} if "like" in d else d


def lf_template(name: str, default_system: str | None = None, enable_thinking: bool = True) -> LfTemplate:
    """LLaMA-Factory's template ``name`` (KeyError if it has none of that name), with the config's
    ``default_system`` and ``enable_thinking`` (reasoning templates) as LLaMA-Factory applies them."""
    d = _fields(name)
    eos_default = _CONTENT if d.get("efficient_eos") else [*_CONTENT, _EOS]
    user = d.get("user", _CONTENT)
    assistant = d.get("assistant", eos_default)
    tools_slots = d.get("tools_slots")
    return LfTemplate(
        name=name,
        user=tuple(user),
        assistant=tuple(assistant),
        system=tuple(d.get("system", _CONTENT)),
        observation=tuple(d.get("observation", user)),
        function=tuple(d.get("function", assistant)),
        function_format=d.get("function_format", "default"),
        tool_format=d.get("tool_format", "default"),
        tools_slots=tuple(tools_slots) if tools_slots is not None else None,
        prefix=tuple(d.get("prefix", ())),
        default_system=d.get("default_system", "") if default_system is None else default_system,
        stop_words=tuple(d.get("stop_words", ())),
        thought_words=tuple(d.get("thought_words", ("<think>\n", "\n</think>\n\n"))),  # type: ignore[arg-type]
        tool_call_words=tuple(d.get("tool_call_words", ("<tool_call>", "</tool_call>"))),  # type: ignore[arg-type]
        efficient_eos=bool(d.get("efficient_eos")),
        replace_eos=bool(d.get("replace_eos")),
        kind=d.get("kind", "plain"),
        enable_thinking=enable_thinking,
    )


OWN = "the tokenizer's own"  # the name of a template parsed from the tokenizer's Jinja (template unset)


def _find_diff(short: str, long: str) -> str:
    """LLaMA-Factory's ``find_diff``: the characters of ``long`` a greedy walk along ``short`` skips."""
    i = j = 0
    diff = ""
    while i < len(short) and j < len(long):
        if short[i] == long[j]:
            i += 1
        else:
            diff += long[j]
        j += 1
    return diff


def parse_template(
    tokenizer: Any, chat_template: str | None = None, default_system: str | None = None, enable_thinking: bool = True
) -> LfTemplate:
    """The tokenizer's own chat template (``chat_template``, else its current one) as LLaMA-Factory 0.9.5's
    ``parse_template`` reads it when the config sets no template: the slots its Jinja writes around a
    placeholder system, user and assistant message (the default system prompt it inserts found as the
    difference), no stop words, LLaMA-Factory's ``default`` tool format, a reasoning template when the
    reply slot shows ``<think>``. Raises what the Jinja raises (a template that refuses a system message)."""

    def render(messages: list[dict[str, str]], gen: bool) -> str:
        kwargs = {"chat_template": chat_template} if chat_template else {}
        return str(tokenizer.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False, **kwargs))

    content = "{{content}}"
    prefix = tokenizer.decode(tokenizer.encode(""))
    system_slot = render([{"role": "system", "content": content}], False)[len(prefix) :]
    empty_system = render([{"role": "system", "content": ""}, {"role": "user", "content": content}], True)
    user_slot_empty_system = empty_system[len(prefix) :]
    user_slot = render([{"role": "user", "content": content}], True)[len(prefix) :]
    pair = [{"role": "user", "content": content}, {"role": "assistant", "content": content}]
    assistant_slot = render(pair, False)[len(prefix) + len(user_slot) :]
    reasoning = "<think>" in assistant_slot
    assistant_slot = assistant_slot.replace("<think>", "").replace("</think>", "").lstrip("\n")
    if len(user_slot) > len(user_slot_empty_system):
        parsed_system = _find_diff(user_slot_empty_system, user_slot)
        user_slot = user_slot[len(system_slot.replace(content, parsed_system, 1)) :]
    else:
        parsed_system = ""
    return LfTemplate(
        name=OWN,
        user=(user_slot,),
        assistant=(assistant_slot,),
        system=(system_slot,),
        observation=(user_slot,),
        function=(assistant_slot,),
        function_format="default",
        tool_format="default",
        tools_slots=None,
        prefix=(prefix,) if prefix else (),
        default_system=parsed_system if default_system is None else default_system,
        stop_words=(),
        thought_words=("<think>\n", "\n</think>\n\n"),
        tool_call_words=("<tool_call>", "</tool_call>"),
        efficient_eos=False,
        replace_eos=False,
        kind="reasoning" if reasoning else "plain",
        enable_thinking=enable_thinking,
    )


def with_tool_format(template: LfTemplate, tool_format: str | None) -> LfTemplate:
    """The template with the config's ``tool_format`` (LLaMA-Factory: its function slot becomes the
    plain reply slot and both the call and tool-list formats ``tool_format``)."""
    if not tool_format:
        return template
    function = tuple(_CONTENT if template.efficient_eos else [*_CONTENT, _EOS])
    return replace(template, function=function, function_format=tool_format, tool_format=tool_format, tools_slots=None)


def fix_tokenizer(tokenizer: Any, template: LfTemplate) -> None:
    """LLaMA-Factory's ``fix_special_tokens``: the first stop word becomes the eos (``replace_eos``), an
    eos and a pad token where the tokenizer has none, the stop words added as special tokens."""
    stop_words = list(template.stop_words)
    if template.replace_eos:
        if not stop_words:
            raise ValueError("Stop words are required to replace the EOS token.")
        if tokenizer.eos_token != stop_words[0]:
            tokenizer.add_special_tokens({"eos_token": stop_words[0]})
        stop_words = stop_words[1:]
    if tokenizer.eos_token_id is None:
        tokenizer.add_special_tokens({"eos_token": "<|endoftext|>"})
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if stop_words:
        try:
            tokenizer.add_special_tokens(
                {"additional_special_tokens": stop_words}, replace_additional_special_tokens=False
            )
        except TypeError:
            tokenizer.add_special_tokens({"additional_special_tokens": stop_words})


def _fill(slots: Sequence[Slot], **values: str) -> list[Slot]:
    out: list[Slot] = []
    for slot in slots:
        if isinstance(slot, str):
            for key, value in values.items():
                slot = slot.replace("{{" + key + "}}", value, 1)
        out.append(slot)
    return out


def _ids(tokenizer: Any, elements: Sequence[Slot]) -> list[int]:
    ids: list[int] = []
    for elem in elements:
        if isinstance(elem, str):
            if elem:
                ids += tokenizer.encode(elem, add_special_tokens=False)
        elif "token" in elem:
            ids.append(tokenizer.convert_tokens_to_ids(elem["token"]))
        else:
            special = getattr(tokenizer, elem["special"] + "_id", None)
            if special is not None:
                ids.append(special)
    return ids


def _calls(message: Mapping[str, Any]) -> list[lf_tools.Call]:
    out = []
    for call in message["tool_calls"]:
        fn = call.get("function", call)
        args = fn.get("arguments")
        if isinstance(args, str):
            args = json.loads(args)
        out.append((fn["name"], json.dumps(args, ensure_ascii=False)))
    return out


def function_text(template: LfTemplate, message: Mapping[str, Any]) -> str:
    """An assistant's function calls as LLaMA-Factory's ``FunctionFormatter`` writes them: a thought
    (in the thought words) or text around the calls kept before them."""
    text = lf_tools.calls_text(template.function_format, _calls(message))
    content = message.get("content") or ""
    if not content:
        return text
    open_, close = map(re.escape, template.thought_words)
    thought = re.search(f"{open_}(.*?){close}", content, flags=re.DOTALL)
    return (thought.group(0) if thought else content) + text


def _tools_text(template: LfTemplate, tools: Sequence[Mapping[str, Any]] | None) -> str:
    """The tool list's text in the system slot (LLaMA-Factory's ``format_tools``): none without tools; an
    empty list (a ``"[]"`` column) gives a ToolFormatter's ``""`` but a string slot's text around ``[]``."""
    if tools is None:
        return ""
    if template.tools_slots is not None:  # a string slot: the tools' JSON as given
        filled = _fill(template.tools_slots, content=json.dumps(list(tools), ensure_ascii=False))
        return str(filled[0])
    return lf_tools.tool_prompt(template.tool_format, tools) if tools else ""


def split_system(messages: Sequence[Mapping[str, Any]]) -> tuple[str | None, list[Mapping[str, Any]]]:
    """(the conversation's system prompt or None, its other messages)."""
    if messages and messages[0]["role"] == "system":
        return str(messages[0]["content"]), list(messages[1:])
    return None, list(messages)


def encode_messages(
    tokenizer: Any,
    template: LfTemplate,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[list[int]]:
    """Each message's token ids (LLaMA-Factory's ``Template._encode``); ``messages`` may start with a system one.
    ``tools``: None (no tools column, or an empty one) or a list, ``[]`` included: as LLaMA-Factory's
    ``if system or tools`` on the column's string, a ``"[]"`` writes the system slot even when it is empty."""
    system, turns = split_system(messages)
    system = system or template.default_system
    encoded = []
    for i, message in enumerate(turns):
        elements: list[Slot] = []
        system_text = ""
        if i == 0:
            elements += template.prefix
            if system or tools is not None:
                system_elems = _fill(template.system, content=system + _tools_text(template, tools))
                if template.kind == "llama2":
                    system_text = str(system_elems[0])
                else:
                    elements += system_elems
        role, content = message["role"], message.get("content") or ""
        if message.get("tool_calls"):
            elements += _fill(template.function, content=function_text(template, message))
        elif role == "user":
            elements += _fill(template.user, content=system_text + content, idx=str(i // 2))
        elif role == "assistant":
            elements += _fill(template.assistant, content=content)
        elif role == "tool":
            elements += _fill(template.observation, content=content)
        else:
            raise ValueError(f"unexpected role {role!r}")
        encoded.append(_ids(tokenizer, elements))
    return encoded


def encode_pairs(
    tokenizer: Any,
    template: LfTemplate,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    discard_history_thought: bool = False,
) -> list[tuple[list[int], list[int]]]:
    """The (prompt ids, reply ids) turns (LLaMA-Factory's ``encode_multiturn``, reasoning included)."""
    system, given = split_system(messages)
    turns = [dict(m) for m in given]
    if template.reasoning:
        replies = range(1, len(turns), 2)
        for i in replies:
            if not template.enable_thinking or (discard_history_thought and i < len(turns) - 2):
                turns[i]["content"] = template.remove_thought(turns[i].get("content") or "")
    head = [{"role": "system", "content": system}] if system is not None else []
    encoded = encode_messages(tokenizer, template, head + turns, tools)
    if template.reasoning:
        thought = tokenizer.encode(template.empty_thought(), add_special_tokens=False)
        indices = [len(turns) - 2] if discard_history_thought else range(0, len(turns), 2)
        for i in indices:
            if not template.has_thought(turns[i + 1].get("content") or ""):
                if template.enable_thinking:
                    encoded[i + 1] = thought + encoded[i + 1]
                else:
                    encoded[i] = encoded[i] + thought
    return [(encoded[i], encoded[i + 1]) for i in range(0, len(encoded) - 1, 2)]


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


@dataclass
class Encoded:
    input_ids: list[int]
    labels: list[int]
    full_length: int  # tokens before truncation
    target_tokens: int  # trained tokens before truncation


def _labelled(
    pairs: Sequence[tuple[list[int], list[int]]],
    eos: int | None,
    efficient_eos: bool,
    cutoff_len: int,
    train_on_prompt: bool,
    mask_history: bool,
) -> tuple[list[int], list[int]]:
    """LLaMA-Factory's supervised processor on encoded turns: truncation and labels."""
    input_ids: list[int] = []
    labels: list[int] = []
    total = 1 if efficient_eos else 0
    ordered = list(reversed(pairs)) if mask_history else list(pairs)
    for turn, (source, target) in enumerate(ordered):
        if total >= cutoff_len:
            break
        sl, tl = infer_seqlen(len(source), len(target), cutoff_len - total)
        source, target = source[:sl], target[:tl]
        total += sl + tl
        if train_on_prompt:
            source_label = list(source)
        elif efficient_eos and turn != 0:
            source_label = [eos] + [IGNORE_INDEX] * (sl - 1)  # type: ignore[list-item]
        else:
            source_label = [IGNORE_INDEX] * sl
        target_label = [IGNORE_INDEX] * tl if mask_history and turn != 0 else list(target)
        if mask_history:
            input_ids = source + target + input_ids
            labels = source_label + target_label + labels
        else:
            input_ids += source + target
            labels += source_label + target_label
    if efficient_eos:
        input_ids.append(eos)  # type: ignore[arg-type]
        labels.append(eos)  # type: ignore[arg-type]
    return input_ids, labels


def encode_sample(
    tokenizer: Any,
    template: LfTemplate,
    messages: Sequence[Mapping[str, Any]],
    cutoff_len: int,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    train_on_prompt: bool = False,
    mask_history: bool = False,
) -> Encoded:
    """A training sample's input ids and labels as LLaMA-Factory's supervised processor makes them."""
    if train_on_prompt and template.efficient_eos:
        raise ValueError(f"template {template.name!r} does not support train_on_prompt (LLaMA-Factory refuses it)")
    pairs = encode_pairs(tokenizer, template, messages, tools, discard_history_thought=mask_history)
    eos = tokenizer.eos_token_id
    args = (eos, template.efficient_eos)
    full_ids, full_labels = _labelled(pairs, *args, 10**12, train_on_prompt, mask_history)
    input_ids, labels = _labelled(pairs, *args, cutoff_len, train_on_prompt, mask_history)
    target = sum(1 for x in full_labels if x != IGNORE_INDEX)
    return Encoded(input_ids, labels, len(full_ids), target)


def encode_prompt(
    tokenizer: Any,
    template: LfTemplate,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """The prompt's ids ready for generation (LLaMA-Factory's ``encode_oneturn`` with an empty reply:
    a reasoning template drops the history's thoughts and, thinking off, ends the prompt with the empty one)."""
    system, given = split_system(messages)
    turns = [dict(m) for m in given] + [{"role": "assistant", "content": ""}]
    if template.reasoning:
        for i in range(1, len(turns) - 2, 2):
            turns[i]["content"] = template.remove_thought(turns[i].get("content") or "")
    head = [{"role": "system", "content": system}] if system is not None else []
    encoded = encode_messages(tokenizer, template, head + turns, tools)
    prompt = [t for ids in encoded[:-1] for t in ids]
    if template.reasoning and not template.enable_thinking:
        prompt += tokenizer.encode(template.empty_thought(), add_special_tokens=False)
    return prompt


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a Jinja string literal


def _jinja_expr(slots: Sequence[Slot], content: str = "content") -> str:
    """The slots as a Jinja expression (``{{content}}`` -> the variable ``content``, ``{{idx}}`` -> the turn)."""
    items = []
    for slot in slots:
        if isinstance(slot, str):
            for j, piece in enumerate(slot.split("{{content}}")):
                if j:
                    items.append(content)
                for k, part in enumerate(piece.split("{{idx}}")):
                    if k:
                        items.append("((loop.index0 // 2) | string)")
                    if part:
                        items.append(_literal(part))
        elif "token" in slot:
            items.append(_literal(slot["token"]))
        elif slot["special"] in ("bos_token", "eos_token"):  # LF writes nothing for another special
            items.append(f"({slot['special']} or '')")
    return " + ".join(items) or "''"


def chat_template(template: LfTemplate) -> str:
    """A Jinja chat template that renders the text LLaMA-Factory's template gives (the saved tokenizer's,
    for ``apply_chat_template`` and a server such as vLLM): system (or the default), the turns, tool
    results in the observation slot, a reasoning template's empty thought."""
    thought = _literal(template.empty_thought())
    out = ""
    if template.prefix:
        out += "{{ " + _jinja_expr(template.prefix) + " }}"
    if template.default_system:
        out += "{% set system_message = " + _literal(template.default_system) + " %}"
    out += (
        "{% if messages and messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
        "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% endif %}"
    )
    system = _jinja_expr(template.system, "system_message")
    if template.kind != "llama2":
        out += "{% if system_message %}{{ " + system + " }}{% endif %}"
    out += "{% for message in loop_messages %}{% set content = message['content'] or '' %}"
    if template.kind == "llama2":
        out += "{% if loop.first and system_message %}{% set content = " + system + " + content %}{% endif %}"
    out += "{% if message['role'] == 'user' %}{{ " + _jinja_expr(template.user) + " }}"
    if template.reasoning and not template.enable_thinking:  # the empty thought ends the prompt of a reply
        out += "{% if loop.last == (add_generation_prompt is true) %}{{ " + thought + " }}{% endif %}"
    out += "{% elif message['role'] == 'tool' %}{{ " + _jinja_expr(template.observation) + " }}"
    out += "{% elif message['role'] == 'assistant' %}"
    if template.reasoning:  # training: every reply without a thought gets the empty one before it (thinking
        # off: the prompt has it); a generation prompt's history: no thoughts (LLaMA-Factory's encode_oneturn)
        open_, close = (_literal(w.strip()) for w in template.thought_words)
        drop = "{% set content = content.split(" + close + ", 1)[1].lstrip() %}"
        out += "{% if add_generation_prompt or " + str(not template.enable_thinking).lower() + " %}"
        out += "{% if " + close + " in content %}" + drop + "{% endif %}"
        out += (
            "{% elif " + open_ + " not in content and " + close + " not in content %}{{ " + thought + " }}{% endif %}"
        )
    out += "{{ " + _jinja_expr(template.assistant) + " }}"
    if template.efficient_eos:  # the eos LLaMA-Factory appends to a conversation (the next turn's slot ends the others)
        out += "{% if loop.last and not add_generation_prompt %}{{ eos_token or '' }}{% endif %}"
    out += "{% endif %}{% endfor %}"
    return out
