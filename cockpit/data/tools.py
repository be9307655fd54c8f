"""Tool calling in the data (LLaMA-Factory's sharegpt ``tools`` column, ``function_call`` and
``observation`` turns) and how it is written into the prompt (``tool_format``).

A sample's tools are JSON function schemas; a function call is an assistant turn with HF's
``tool_calls`` (``{"type": "function", "function": {"name", "arguments"}}``), an observation a
``tool`` turn. Rendering either hands them to the chat template (``apply_chat_template(...,
tools=...)``) when the template writes tools itself and ``tool_format`` is unset ("native"), or
writes them as text the way LLaMA-Factory's tool formats do, before the template renders plain
turns: ``default`` (a system-prompt section listing the tools, calls as ``Action:`` / ``Action
Input:`` lines, observations as user turns) and ``qwen`` (``<tools></tools>`` in the system prompt,
``<tool_call>`` JSON for calls, observations as ``<tool_response>`` in a user turn). Function
calls stay assistant turns (trained), observations user/tool turns (masked). No torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

NATIVE = "native"  # the chat template writes the tools itself
WRITTEN_FORMATS = ("default", "qwen")

DEFAULT_TOOL_PROMPT = (
    "You have access to the following tools:\n{tool_text}"
    "Use the following format if using a tool:\n"
    "```\n"
    "Action: tool name (one of [{tool_names}])\n"
    "Action Input: the input to the tool, in a JSON format representing the kwargs "
    '(e.g. ```{{"input": "hello world", "num_beams": 5}}```)\n'
    "```\n"
)
QWEN_TOOL_PROMPT = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tool_text}"
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, '
    '"arguments": <args-json-object>}}\n</tool_call>'
)


def parse_tools(value: Any) -> tuple[list[dict[str, Any]] | None, str | None]:
    """A sample's ``tools`` (a JSON string or a list of function schemas): (tools, error). As LLaMA-Factory
    reads the column: absent, null, ``""`` or an empty JSON list -> None (no tools: no system slot unless
    there is a system prompt); the string of an empty list (``"[]"``, as the rows without tools of its
    glaive_toolcall data have) -> ``[]``: tools given, none listed (its template then writes
    the system slot, empty, and no tool text; ``Template._encode``'s ``if system or tools``)."""
    if value in (None, "", []):
        return None, None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            return None, f"tools: invalid JSON ({exc.msg})"
        if value == []:
            return [], None
    tools = [value] if isinstance(value, dict) else value
    if not isinstance(tools, list) or not all(isinstance(t, dict) and function_of(t).get("name") for t in tools):
        return None, "tools: expected a list of function schemas, each with a 'name'"
    return tools or None, None


def function_of(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """The function schema of a tool given bare or wrapped as ``{"type": "function", "function": ...}``."""
    inner = tool.get("function") if tool.get("type") == "function" else tool
    return inner if isinstance(inner, Mapping) else {}


def parse_function_call(text: str) -> tuple[list[dict[str, Any]] | None, str | None]:
    """A ``function_call`` turn (JSON ``{"name", "arguments"}`` or a list of them) as HF ``tool_calls``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"function_call: invalid JSON ({exc.msg})"
    calls = [value] if isinstance(value, dict) else value
    if not isinstance(calls, list) or not calls:
        return None, 'function_call: expected {"name": ..., "arguments": ...} or a list of them'
    out = []
    for call in calls:
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and "arguments" in call):
            return None, 'function_call: each call needs "name" and "arguments"'
        args = call["arguments"]
        if isinstance(args, str):  # arguments given as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None, "function_call: arguments is a string that is not JSON"
        out.append({"type": "function", "function": {"name": call["name"], "arguments": args}})
    return out, None


def tool_text(fmt: str, tools: Sequence[Mapping[str, Any]]) -> str:
    """The system-prompt section that lists ``tools`` in format ``fmt`` (LLaMA-Factory's text)."""
    if fmt not in WRITTEN_FORMATS:  # LLaMA-Factory's other formats
        from cockpit.data import lf_tools

        return lf_tools.tool_prompt(fmt, tools)
    if fmt == "qwen":
        wrapped = [t if t.get("type") == "function" else {"type": "function", "function": t} for t in tools]
        return QWEN_TOOL_PROMPT.format(tool_text="".join("\n" + json.dumps(t, ensure_ascii=False) for t in wrapped))
    text, names = "", []
    for tool in map(function_of, tools):
        params = tool.get("parameters") or {}
        required = params.get("required") or []
        args = ""
        for name, param in (params.get("properties") or {}).items():
            enum = f", should be one of [{', '.join(map(str, param['enum']))}]" if param.get("enum") else ""
            items = f", where each item should be {param['items'].get('type', '')}" if param.get("items") else ""
            req = ", required" if name in required else ""
            args += f"  - {name} ({param.get('type', '')}{req}): {param.get('description', '')}{enum}{items}\n"
        text += f"> Tool Name: {tool['name']}\nTool Description: {tool.get('description', '')}\nTool Args:\n{args}\n"
        names.append(tool["name"])
    return DEFAULT_TOOL_PROMPT.format(tool_text=text, tool_names=", ".join(names))


def call_text(fmt: str, tool_calls: Sequence[Mapping[str, Any]]) -> str:
    """An assistant's tool calls written in format ``fmt``."""
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in tool_calls]
    if fmt not in WRITTEN_FORMATS:  # LLaMA-Factory's other formats
        from cockpit.data import lf_tools

        return lf_tools.calls_text(fmt, [(n, json.dumps(a, ensure_ascii=False)) for n, a in calls])
    if fmt == "qwen":
        return "\n".join(
            "<tool_call>\n" + json.dumps({"name": n, "arguments": a}, ensure_ascii=False) + "\n</tool_call>"
            for n, a in calls
        )
    return "\n".join(f"Action: {n}\nAction Input: {json.dumps(a, ensure_ascii=False)}" for n, a in calls)


def observation_text(fmt: str, content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>" if fmt == "qwen" else content


def as_text_turns(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    fmt: str,
    default_system: str | None,
    observation: str | None = None,
) -> list[dict[str, str]]:
    """The conversation as plain system/user/assistant turns with its tools written in ``fmt``: the
    tool list appended to the system message (``default_system`` when it has none), calls as the
    assistant's text, observations as user turns (wrapped as ``fmt`` wraps them). ``observation``: how
    the chat template writes them instead, as a LLaMA-Factory template's observation slot does: ``user`` or
    ``tool`` (a turn of that role, the text as is), ``qwen`` (a user turn in ``<tool_response>``)."""
    out: list[dict[str, str]] = []
    for msg in messages:
        if msg.get("tool_calls"):
            out.append({"role": "assistant", "content": call_text(fmt, msg["tool_calls"])})
        elif msg["role"] == "tool" and observation in ("user", "tool"):
            out.append({"role": observation, "content": msg["content"]})
        elif msg["role"] == "tool":
            out.append({"role": "user", "content": observation_text(observation or fmt, msg["content"])})
        else:
            out.append({"role": msg["role"], "content": msg["content"]})
    if tools:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + tool_text(fmt, tools)}
        else:
            out.insert(0, {"role": "system", "content": (default_system or "") + tool_text(fmt, tools)})
    return out


def has_tool_turns(messages: Sequence[Mapping[str, Any]]) -> bool:
    return any(m.get("tool_calls") or m["role"] == "tool" for m in messages)


def template_writes_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template puts ``tools`` into the prompt (tried on a probe tool)."""
    probe = {"type": "function", "function": {"name": "cockpit_probe_tool", "description": "", "parameters": {}}}
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tools=[probe], tokenize=False, add_generation_prompt=True
        )
    except Exception:  # noqa: BLE001 - a template that cannot take tools at all writes none
        return False
    return "cockpit_probe_tool" in text


TOOL_HINT = "{#- cockpit tools %s %s -#}"  # a LLaMA-Factory template's tool format and observation slot


def template_tool_hint(tokenizer: Any) -> tuple[str, str] | None:
    """(tool format, observation style) of a chat template Cockpit made from a LLaMA-Factory template."""
    import re

    found = re.search(r"\{#- cockpit tools (\w+) (\w+) -#\}", str(getattr(tokenizer, "chat_template", "") or ""))
    return (found.group(1), found.group(2)) if found else None


def choose_tool_format(tokenizer: Any, tool_format: str | None) -> str:
    """The format a run writes tools in: ``tool_format`` when set; else the chat template's own
    (``native``) when it writes tools; else ``qwen`` for a ChatML template (Qwen, SmolLM2), else
    ``default`` (LLaMA-Factory's choices for those templates)."""
    if tool_format:
        return tool_format
    hint = template_tool_hint(tokenizer)
    if hint:
        return hint[0]
    if template_writes_tools(tokenizer):
        return NATIVE
    return "qwen" if "<|im_start|>" in str(getattr(tokenizer, "chat_template", "") or "") else "default"
