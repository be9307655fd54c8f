"""LLaMA-Factory 0.9.5's tool formats (its ``tool_utils``): the system-prompt text that lists a
sample's tools and the text of an assistant's function calls, per ``tool_format`` (issue 31).

The prompts' wording is LLaMA-Factory's (https://github.com/hiyouga/LLaMA-Factory,
src/llamafactory/data/tool_utils.py, Apache-2.0). ``default`` and ``qwen`` are
cockpit.data.tools'; a call is ``(name, arguments as JSON text)``. No torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from cockpit.data import tools as tools_mod

Call = tuple[str, str]  # (function name, its arguments as JSON text)

GLM4_TOOL_PROMPT = (
    "你是一个名为 ChatGLM 的人工智能助手。你是基于智谱 AI 公司训练的语言模型 GLM-4 模型开发的，"
    "你的任务是针对用户的问题和要求提供适当的答复和支持。\n\n# 可用工具{tool_text}"
)
GLM4_MOE_TOOL_PROMPT = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tool_text}"
    "\n</tools>\n\nFor each function call, output the function name and arguments within the following XML format:"
    "\n<tool_call>{{function-name}}"
    "\n<arg_key>{{arg-key-1}}</arg_key>"
    "\n<arg_value>{{arg-value-1}}</arg_value>"
    "\n<arg_key>{{arg-key-2}}</arg_key>"
    "\n<arg_value>{{arg-value-2}}</arg_value>"
    "\n...\n</tool_call>\n"
)
LLAMA3_TOOL_PROMPT = (
    "Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n"
    "You have access to the following functions. To call a function, please respond with JSON for a function call. "
    'Respond in the format {{"name": function name, "parameters": dictionary of argument name and its value}}. '
    "Do not use variables.\n\n{tool_text}"
)
MINIMAX_M1_TOOL_PROMPT = (
    "You are provided with these tools:\n<tools>\n{tool_text}</tools>\n\n"
    "If you need to call tools, please respond with <tool_calls></tool_calls> XML tags, and provide tool-name and "
    "json-object of arguments, following the format below:\n<tool_calls>\n"
    '{{"name": <tool-name-1>, "arguments": <args-json-object-1>}}\n...\n</tool_calls>'
)
MINIMAX_M2_TOOL_PROMPT = (
    "\n\n# Tools\n\nYou may call one or more tools to assist with the user query.\n"
    "Here are the tools available in JSONSchema format:\n\n<tools>\n{tool_text}</tools>\n\n"
    "When making tool calls, use XML format to invoke tools and pass parameters:\n"
    '\n<minimax:tool_call>\n<invoke name="tool-name-1">\n<parameter name="param-key-1">param-value-1</parameter>\n'
    '<parameter name="param-key-2">param-value-2</parameter>\n...\n</invoke>\n</minimax:tool_call>'
)
SEED_TOOL_PROMPT = (
    "system\nYou are Doubao, a helpful AI assistant. You may call one or more functions to assist with the user query."
    "Tool List:\nYou are authorized to use the following tools (described in JSON Schema format). Before performing "
    "any task, you must decide how to call them based on the descriptions and parameters of these tools.{tool_text}\n"
    "工具调用请遵循如下格式:\n<seed:tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>value_1"
    "</parameter>\n<parameter=example_parameter_2>This is the value for the second parameter\nthat can span\nmultiple "
    "lines</parameter>\n</function>\n</seed:tool_call>\n"
)
LING_TOOL_PROMPT = tools_mod.QWEN_TOOL_PROMPT[2:]  # Qwen's without its leading blank line
LFM2_TOOL_PROMPT = "List of tools: <|tool_list_start|>{tool_text}<|tool_list_end|>"


def _dumps(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _wrapped(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    return tool if tool.get("type") == "function" else {"type": "function", "function": tool}


def _bare(tool: Mapping[str, Any]) -> Any:
    return tool.get("function", "") if tool.get("type") == "function" else tool


def _joined_wrapped(tools: Sequence[Mapping[str, Any]]) -> str:
    return "".join("\n" + _dumps(_wrapped(t)) for t in tools)


def today() -> str:
    """The date Llama 3's tool prompt carries (LLaMA-Factory's: the day of rendering)."""
    return datetime.now().strftime("%d %b %Y")


def tool_prompt(fmt: str, tools: Sequence[Mapping[str, Any]]) -> str:
    """The system-prompt section listing ``tools`` in LLaMA-Factory's tool format ``fmt``."""
    if fmt in ("default", "qwen"):
        return tools_mod.tool_text(fmt, tools)
    if fmt == "glm4":
        text = "".join(
            f"\n\n## {_bare(t)['name']}\n\n{_dumps(_bare(t), indent=4)}\n在调用上述函数时，请使用 Json 格式表示调用的参数。"
            for t in tools
        )
        return GLM4_TOOL_PROMPT.format(tool_text=text)
    if fmt == "glm4_moe":
        return GLM4_MOE_TOOL_PROMPT.format(tool_text=_joined_wrapped(tools))
    if fmt == "ling":
        return LING_TOOL_PROMPT.format(tool_text=_joined_wrapped(tools)) + "\ndetailed thinking off"
    if fmt == "llama3":
        text = "".join(_dumps(_wrapped(t), indent=4) + "\n\n" for t in tools)
        return LLAMA3_TOOL_PROMPT.format(date=today(), tool_text=text)
    if fmt == "minimax1":
        return MINIMAX_M1_TOOL_PROMPT.format(tool_text="".join(_dumps(_bare(t)) + "\n" for t in tools))
    if fmt == "minimax2":
        text = "".join("<tool>" + _dumps(_bare(t)) + "</tool>\n" for t in tools)
        return MINIMAX_M2_TOOL_PROMPT.format(tool_text=text)
    if fmt == "mistral":
        return "[AVAILABLE_TOOLS] " + _dumps([_wrapped(t) for t in tools]) + "[/AVAILABLE_TOOLS]"
    if fmt == "seed_oss":
        return SEED_TOOL_PROMPT.format(tool_text="\n" + _dumps(list(tools)))
    if fmt == "lfm2":
        bare = [t.get("function", t) if t.get("type") == "function" else t for t in tools]
        return LFM2_TOOL_PROMPT.format(tool_text=_dumps(bare))
    raise ValueError(f"unknown tool_format {fmt!r}; known: {', '.join(TOOL_FORMATS)}")


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else _dumps(value)


def _xml_calls(calls: Sequence[Call], head: str, param: Callable[[str, str], str], tail: str) -> str:
    out = []
    for name, arguments in calls:
        args = json.loads(arguments)
        out.append(head.format(name=name) + "".join(param(k, _value_text(v)) for k, v in args.items()) + tail)
    return "\n".join(out)


def calls_text(fmt: str, calls: Sequence[Call]) -> str:
    """An assistant's function calls written in LLaMA-Factory's tool format ``fmt``."""
    if fmt == "default":
        return "\n".join(f"Action: {name}\nAction Input: {arguments}" for name, arguments in calls)
    if fmt in ("qwen", "ling"):
        return "\n".join(
            "<tool_call>\n" + _dumps({"name": n, "arguments": json.loads(a)}) + "\n</tool_call>" for n, a in calls
        )
    if fmt == "glm4":
        if len(calls) > 1:
            raise ValueError("GLM-4 does not support parallel functions.")
        return f"{calls[0][0]}\n{calls[0][1]}"
    if fmt == "glm4_moe":
        return _xml_calls(
            calls, "\n<tool_call>{name}", lambda k, v: f"\n<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>", ""
        )
    if fmt == "seed_oss":
        return _xml_calls(
            calls,
            "\n<seed:tool_call>\n<function={name}",
            lambda k, v: f"\n<parameter={k}>{v}</parameter>",
            "\n</function>\n</seed:tool_call>",
        )
    if fmt == "minimax2":
        return _xml_calls(
            calls, '<invoke name="{name}">', lambda k, v: f'\n<parameter name="{k}">{v}</parameter>', "\n</invoke>"
        )
    if fmt == "minimax1":
        body = "\n".join(_dumps({"name": n, "arguments": json.loads(a)}) for n, a in calls)
        return "<tool_calls>\n" + body + "\n</tool_calls>"
    if fmt == "llama3":
        objs = [{"name": n, "parameters": json.loads(a)} for n, a in calls]
        return _dumps(objs[0] if len(objs) == 1 else objs)
    if fmt == "mistral":
        return _dumps([{"name": n, "arguments": json.loads(a)} for n, a in calls])
    if fmt == "lfm2":
        parts = []
        for name, arguments in calls:
            kwargs = [
                f'{k}="{v}"' if isinstance(v, str) else f"{k}={_dumps(v)}" for k, v in json.loads(arguments).items()
            ]
            parts.append(f"{name}({', '.join(kwargs)})")
        return f"<|tool_call_start|>[{', '.join(parts)}]<|tool_call_end|>"
    raise ValueError(f"unknown tool_format {fmt!r}; known: {', '.join(TOOL_FORMATS)}")


TOOL_FORMATS = (
    "default",
    "qwen",
    "glm4",
    "glm4_moe",
    "ling",
    "llama3",
    "minimax1",
    "minimax2",
    "mistral",
    "seed_oss",
    "lfm2",
)
