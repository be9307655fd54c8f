"""Dataset files -> normalized conversations, with every bad row reported as ``file:line: reason``.

Formats (LLaMA-Factory's): alpaca (``instruction``, ``input``, ``output``, optional ``system``,
``history``) and sharegpt (``conversations`` of ``from``/``value`` with a tag mapping), as a
JSON array or JSON lines; UTF-8 with or without BOM, CRLF, blank lines.

A normalized sample is ``{"messages": [{"role": "system"|"user"|"assistant"|"tool",
"content": str}, ...], "source": "file:line"}``; a sharegpt ``function_call`` turn is an assistant
turn with HF's ``tool_calls``, an ``observation`` a ``tool`` turn, and the ``tools`` column the
sample's ``tools`` (function schemas; :mod:`cockpit.data.tools`). No torch imports.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cockpit.data.media import row_images
from cockpit.data.tools import parse_function_call, parse_tools
from cockpit.errors import Problem

ALPACA_COLUMNS = {
    "prompt": "instruction",
    "query": "input",
    "response": "output",
    "system": "system",
    "history": "history",
    "tools": "tools",
}
SHAREGPT_COLUMNS = {"messages": "conversations", "system": "system", "tools": "tools"}
SHAREGPT_TAGS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}


@dataclass
class DatasetSpec:
    """One dataset: a file and how to read it (a dataset_info.json entry, or a bare path)."""

    name: str
    path: Path
    formatting: str = "auto"  # alpaca | sharegpt | auto (detected from the first good row)
    columns: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    info_file: str | None = None
    info_line: int | None = None
    ranking: bool = False  # chosen / rejected pairs (stage dpo / rm); read by cockpit/data/pairs.py
    media_dir: Path | None = None  # where relative image paths are looked up first (cockpit.data.media)
    base_dir: Path | None = None  # where a relative image path not under media_dir is read (the config's folder)


@dataclass
class LoadResult:
    samples: list[dict[str, Any]]
    problems: list[Problem]
    formats: dict[str, str]  # dataset name -> detected format
    rows: int = 0


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def read_records(path: Path) -> tuple[list[tuple[int, Any]], list[Problem]]:
    """(line, record) pairs from a JSON array or JSON lines file, and problems by line."""
    name = str(path)
    if not path.exists():
        return [], [Problem("no such file", file=name)]
    if path.is_dir():
        return [], [Problem("is a directory, expected a .json or .jsonl file", file=name)]
    raw = path.read_bytes()
    problems: list[Problem] = []
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        # Report each line that is not UTF-8, keep the others.
        text_lines = []
        for i, bline in enumerate(raw.split(b"\n"), 1):
            try:
                text_lines.append(bline.decode("utf-8-sig" if i == 1 else "utf-8"))
            except UnicodeDecodeError as exc:
                problems.append(
                    Problem(f"not UTF-8 (byte 0x{bline[exc.start]:02x} at column {exc.start + 1})", file=name, line=i)
                )
                text_lines.append("")
        text = "\n".join(text_lines)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    stripped = text.lstrip()
    if not stripped:
        return [], problems + [Problem("empty file", file=name, line=1)]
    records: list[tuple[int, Any]] = []
    if stripped[0] == "[":
        dec = json.JSONDecoder()
        pos = text.index("[") + 1
        n = len(text)
        while True:
            while pos < n and text[pos] in " \t\n,":
                pos += 1
            if pos >= n:
                problems.append(Problem("unterminated JSON array (missing ']')", file=name, line=_line_of(text, n)))
                break
            if text[pos] == "]":
                break
            try:
                obj, end = dec.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                problems.append(Problem(f"invalid JSON: {exc.msg}", file=name, line=exc.lineno))
                break  # cannot resynchronise reliably inside an array
            records.append((_line_of(text, pos), obj))
            pos = end
    else:
        for i, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                records.append((i, json.loads(line)))
            except json.JSONDecodeError as exc:
                problems.append(Problem(f"invalid JSON: {exc.msg} (column {exc.colno})", file=name, line=i))
    return records, problems


def detect_format(record: Any) -> str | None:
    if not isinstance(record, dict):
        return None
    if "conversations" in record or "messages" in record:
        return "sharegpt"
    if "instruction" in record or "output" in record:
        return "alpaca"
    return None


def _as_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def alpaca_to_messages(rec: Any, columns: Mapping[str, str]) -> tuple[list[dict[str, str]] | None, str | None]:
    cols = {**ALPACA_COLUMNS, **columns}
    if not isinstance(rec, dict):
        return None, f"expected a JSON object, got {type(rec).__name__}"
    prompt_key, query_key, resp_key = cols["prompt"], cols["query"], cols["response"]
    for key, required in ((prompt_key, True), (resp_key, True), (query_key, False), (cols["system"], False)):
        if key not in rec or rec[key] is None:
            if required:
                return None, f"missing field {key!r}"
            continue
        if not isinstance(rec[key], str):
            return None, f"field {key!r} must be a string, got {type(rec[key]).__name__}"
    instruction, query, output = rec[prompt_key], rec.get(query_key) or "", rec[resp_key]
    if not (instruction.strip() or query.strip()):
        return None, f"empty {prompt_key!r}"
    if not output.strip():
        return None, f"empty {resp_key!r}"
    messages: list[dict[str, str]] = []
    system = rec.get(cols["system"])
    if system:
        messages.append({"role": "system", "content": system})
    history = rec.get(cols["history"])
    if history is not None:
        if not isinstance(history, list):
            return None, f"field {cols['history']!r} must be a list of [prompt, response] pairs"
        for j, turn in enumerate(history):
            if not (isinstance(turn, (list, tuple)) and len(turn) == 2 and all(isinstance(x, str) for x in turn)):
                return None, f"{cols['history']}[{j}] must be a [prompt, response] pair of strings"
            messages += [{"role": "user", "content": turn[0]}, {"role": "assistant", "content": turn[1]}]
    content = instruction if not query else (f"{instruction}\n{query}" if instruction else query)
    messages += [{"role": "user", "content": content}, {"role": "assistant", "content": output}]
    return messages, None


def sharegpt_to_messages(
    rec: Any, columns: Mapping[str, str], tags: Mapping[str, str]
) -> tuple[list[dict[str, Any]] | None, str | None]:
    cols = {**SHAREGPT_COLUMNS, **columns}
    t = {**SHAREGPT_TAGS, **tags}
    if not isinstance(rec, dict):
        return None, f"expected a JSON object, got {type(rec).__name__}"
    conv = rec.get(cols["messages"])
    if conv is None and cols["messages"] == "conversations" and "messages" in rec:
        conv = rec["messages"]
        t = {
            **t,
            "role_tag": "role",
            "content_tag": "content",
            "user_tag": "user",
            "assistant_tag": "assistant",
            "system_tag": "system",
            "observation_tag": "tool",
        }
    if conv is None:
        return None, f"missing field {cols['messages']!r}"
    if not isinstance(conv, list) or not conv:
        return None, f"field {cols['messages']!r} must be a non-empty list of turns"
    role_map = {
        t["user_tag"]: "user",
        t["assistant_tag"]: "assistant",
        t["observation_tag"]: "tool",
        t["function_tag"]: "assistant",
        t["system_tag"]: "system",
    }
    messages: list[dict[str, Any]] = []
    system = rec.get(cols["system"])
    if system is not None and not isinstance(system, str):
        return None, f"field {cols['system']!r} must be a string"
    if system:
        messages.append({"role": "system", "content": system})
    for j, turn in enumerate(conv):
        if not isinstance(turn, dict):
            return None, f"{cols['messages']}[{j}] must be an object with {t['role_tag']!r} and {t['content_tag']!r}"
        role, content = turn.get(t["role_tag"]), turn.get(t["content_tag"])
        if role not in role_map:
            known = ", ".join(repr(k) for k in role_map)
            return None, f"{cols['messages']}[{j}]: unknown role {role!r} (expected one of {known})"
        if not isinstance(content, str):
            return None, f"{cols['messages']}[{j}]: {t['content_tag']!r} must be a string"
        mapped = role_map[role]
        if role == t["function_tag"] and role != t["assistant_tag"]:
            calls, err = parse_function_call(content)
            if err:
                return None, f"{cols['messages']}[{j}]: {err}"
            messages.append({"role": "assistant", "content": "", "tool_calls": calls})
            continue
        if mapped == "system":
            if j != 0:
                return None, f"{cols['messages']}[{j}]: a system turn must come first"
            messages.append({"role": "system", "content": content})
            continue
        messages.append({"role": mapped, "content": content})
    turns = [m for m in messages if m["role"] != "system"]
    if not turns or turns[-1]["role"] != "assistant":
        return None, "the conversation must end with an assistant turn"
    if not (turns[-1]["content"].strip() or turns[-1].get("tool_calls")):
        return None, "empty final assistant turn"
    if turns[0]["role"] != "user":
        return None, "the conversation must start with a user turn"
    for a, b in zip(turns, turns[1:]):
        if a["role"] == b["role"] == "assistant" or a["role"] == b["role"] == "user":
            return None, "user and assistant turns must alternate"
    return messages, None


def record_to_conversation(
    rec: Any, fmt: str, columns: Mapping[str, str], tags: Mapping[str, str]
) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None, str | None]:
    """One row of format ``fmt`` -> (messages, tools, error): the sample training, ``check`` and the golden
    template tests render. The ``tools`` column is read in both formats, as LLaMA-Factory's alpaca and
    sharegpt converters read it (:func:`cockpit.data.tools.parse_tools`: ``[]`` for a ``"[]"`` string)."""
    if fmt == "sharegpt":
        messages, err = sharegpt_to_messages(rec, columns, tags)
        key = {**SHAREGPT_COLUMNS, **columns}["tools"]
    else:
        messages, err = alpaca_to_messages(rec, columns)
        key = {**ALPACA_COLUMNS, **columns}["tools"]
    if err or not isinstance(rec, dict):
        return None, None, err
    tools, err = parse_tools(rec.get(key))
    return (None, None, err) if err else (messages, tools, None)


def load_dataset_file(spec: DatasetSpec, max_samples: int | None = None) -> LoadResult:
    records, problems = read_records(spec.path)
    fmt = spec.formatting
    if fmt == "auto":
        fmt = next((f for f in (detect_format(r) for _, r in records) if f), "alpaca")
    samples: list[dict[str, Any]] = []
    name = str(spec.path)
    media = spec.media_dir or spec.path.parent
    base = spec.base_dir or Path.cwd()
    for line, rec in records:
        messages, tools, err = record_to_conversation(rec, fmt, spec.columns, spec.tags)
        images: list[dict[str, Any]] = []
        if not err and messages is not None:
            images, err = row_images(rec, messages, spec.columns, media, base)
        if err:
            problems.append(Problem(err, file=name, line=line))
            continue
        sample = {"messages": messages, "source": f"{name}:{line}", "dataset": spec.name}
        if images:  # [{"path", "size"}]: the model's template must take images (cockpit.data.collect)
            sample["images"] = images
        if tools is not None:  # [] too: tools given, none listed (LLaMA-Factory writes the empty system slot)
            sample["tools"] = tools
        samples.append(sample)
    if max_samples is not None:
        samples = samples[:max_samples]
    if not samples and not problems:
        problems.append(Problem("no samples", file=name))
    return LoadResult(samples, problems, {spec.name: fmt}, rows=len(records))
