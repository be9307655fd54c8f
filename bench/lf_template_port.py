"""Writes cockpit/data/lf_templates.py: LLaMA-Factory 0.9.5's text chat templates as plain data (issue 31).

    python bench/lf_template_port.py      # re-runs itself in the side venv of bench/lf_venv.py
    python bench/lf_template_port.py --dry-run   # what it would write and run; no LLaMA-Factory

Reads ``llamafactory.data.template.TEMPLATES`` (the templates without a multimodal plugin) and writes
each one's slots, default system, stop words, thought / tool-call words, eos handling and template
class as a Python literal; fields equal to ``register_template``'s defaults are left out (the loader,
cockpit.data.lf_render, fills them in the same way). Slot elements: a string (``{{content}}`` /
``{{idx}}`` substituted), ``{"token": ...}`` (a special token by its id), ``{"special": "bos_token"}``
or ``{"special": "eos_token"}`` (the tokenizer's).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "cockpit" / "data" / "lf_templates.py"

OPEN = "LF_TEMPLATES: dict[str, dict[str, Any]] = {\n"


def _header() -> str:
    """The data module's docstring and imports, kept from the file written before (else a bare one)."""
    if OUT.exists():
        text = OUT.read_text(encoding="utf-8")
        if OPEN in text:
            return text[: text.index(OPEN)]
    return '"""LLaMA-Factory\'s text chat templates, as data (bench/lf_template_port.py)."""\n\nfrom typing import Any\n\n# fmt: off\n'


def _based(data: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each template as the earlier one it shares most fields with (``like``) plus what differs, when
    it keeps every field of that one (LLaMA-Factory's "copied from" templates)."""
    out: dict[str, dict[str, Any]] = {}
    seen: list[str] = []
    for name, d in data.items():
        best, shared = None, 1
        for other in seen:
            o = data[other]
            same = sum(1 for k, v in o.items() if d.get(k) == v)
            if set(o) <= set(d) and same > shared:
                best, shared = other, same
        if best is None:
            out[name] = d
        else:
            out[name] = {"like": best, **{k: v for k, v in d.items() if data[best].get(k) != v}}
        seen.append(name)
    return out


def _slots(slots: list[Any]) -> list[Any]:
    out: list[Any] = []
    for s in slots:
        if isinstance(s, str):
            out.append(s)
        elif isinstance(s, dict):
            out.append({"token": s["token"]})
        elif isinstance(s, set):
            (name,) = tuple(s)
            out.append({"special": name})
        else:
            raise TypeError(s)
    return out


def port() -> dict[str, dict[str, Any]]:
    from llamafactory.data import template as T

    kinds = {"Template": "plain", "Llama2Template": "llama2", "ReasoningTemplate": "reasoning"}
    kinds["Glm47ReasoningTemplate"] = "glm47_reasoning"
    out: dict[str, dict[str, Any]] = {}
    for name, t in T.TEMPLATES.items():
        if type(t.mm_plugin).__name__ != "BasePlugin":
            continue
        d: dict[str, Any] = {}
        eos_default = ["{{content}}"] if t.efficient_eos else ["{{content}}", {"special": "eos_token"}]
        user, assistant = _slots(t.format_user.slots), _slots(t.format_assistant.slots)
        if user != ["{{content}}"]:
            d["user"] = user
        if assistant != eos_default:
            d["assistant"] = assistant
        system = _slots(t.format_system.slots)
        if system != ["{{content}}"]:
            d["system"] = system
        observation = _slots(t.format_observation.slots)
        if observation != user:
            d["observation"] = observation
        function = _slots(t.format_function.slots)
        if function != assistant:
            d["function"] = function
        if t.format_function.tool_format != "default":
            d["function_format"] = t.format_function.tool_format
        if type(t.format_tools).__name__ == "ToolFormatter":
            if t.format_tools.tool_format != "default":
                d["tool_format"] = t.format_tools.tool_format
        else:  # a string formatter: the tools' JSON as given in its slots
            d["tools_slots"] = _slots(t.format_tools.slots)
        prefix = _slots(t.format_prefix.slots)
        if prefix:
            d["prefix"] = prefix
        for key in ("default_system",):
            if getattr(t, key):
                d[key] = getattr(t, key)
        if t.stop_words:
            d["stop_words"] = list(t.stop_words)
        if tuple(t.thought_words) != ("<think>\n", "\n</think>\n\n"):
            d["thought_words"] = list(t.thought_words)
        if tuple(t.tool_call_words) != ("<tool_call>", "</tool_call>"):
            d["tool_call_words"] = list(t.tool_call_words)
        for key in ("efficient_eos", "replace_eos"):
            if getattr(t, key):
                d[key] = True
        kind = kinds[type(t).__name__]
        if kind != "plain":
            d["kind"] = kind
        out[name] = d
    return out


def multimodal() -> dict[str, str]:
    from llamafactory.data import template as T

    plugins = {n: type(t.mm_plugin).__name__ for n, t in T.TEMPLATES.items()}
    return {n: p.removesuffix("Plugin").lower() for n, p in plugins.items() if p != "BasePlugin"}


def main() -> int:
    dry = sys.argv[1:] == ["--dry-run"]
    if sys.argv[1:] and not dry:
        raise SystemExit(f"usage: python {sys.argv[0]} [--dry-run]")
    try:
        if dry:
            raise ImportError("--dry-run: LLaMA-Factory is not imported")
        import llamafactory  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "bench"))
        import lf_venv

        if dry:  # the module's kept header, what would be written, the side venv's command
            print(f"would write {OUT.relative_to(ROOT)}; its header kept ({len(_header().splitlines())} lines)")
        return lf_venv.rerun_in_side_venv(__file__, [], dry_run=dry)
    data = port()
    lines = [_header(), OPEN]
    for name, d in _based(data).items():
        lines.append(f"    {name!r}: {{\n")
        for key, value in d.items():
            lines.append(f"        {key!r}: {value!r},\n")
        lines.append("    },\n")
    lines.append("}\n")
    lines.append("# LLaMA-Factory's multimodal templates (name: its multimodal plugin): refused, Cockpit trains text\n")
    lines.append("LF_MULTIMODAL_TEMPLATES: dict[str, str] = {\n")
    for name, plugin in multimodal().items():
        lines.append(f"    {name!r}: {plugin!r},\n")
    lines.append("}\n# fmt: on\n")
    OUT.write_text("".join(lines), encoding="utf-8")
    print(f"{len(data)} templates -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
