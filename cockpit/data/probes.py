"""The probes file: prompts with expected substrings, answered before and after training.

File format: JSON array or JSON lines of ``{"prompt": str, "expect": str | [str, ...], "set": str,
"image": str}``; a probe passes when every expected substring appears in the greedy answer (case-insensitive).
``image`` (optional; a vision-language model's probe): an image file, relative to the probes file, that the
model is asked about with the prompt (``<image>`` in the prompt marks where; the llava template's form).
``set`` (optional) groups probes: the demo asks ``identity`` probes (what training should teach)
and ``control`` probes (general questions the base model already answers: what it must not forget);
results and ``summary.json`` then also count each set (``score``).
Pure Python (no torch): the UI and the chat command score answers with ``passes``; the training
ranks answer the probes with ``cockpit.train.probes.run_probes``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cockpit.data.formats import read_records
from cockpit.errors import InputError, Problem


def load_probes(path: str | Path) -> list[dict[str, Any]]:
    records, problems = read_records(Path(path))
    probes = []
    for line, rec in records:
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or not rec["prompt"].strip():
            problems.append(Problem('expected {"prompt": str, "expect": str | [str]}', file=str(path), line=line))
            continue
        expect = rec.get("expect")
        if isinstance(expect, str):
            expect = [expect]
        if not (isinstance(expect, list) and expect and all(isinstance(e, str) and e for e in expect)):
            problems.append(
                Problem("'expect' must be a non-empty string or list of strings", file=str(path), line=line)
            )
            continue
        group = rec.get("set")
        if group is not None and not (isinstance(group, str) and group.strip()):
            problems.append(Problem("'set' must be a non-empty string", file=str(path), line=line))
            continue
        image = _probe_image(rec.get("image"), Path(path)) if "image" in rec else None
        if isinstance(image, str):
            problems.append(Problem(image, file=str(path), line=line, key="image"))
            continue
        probes.append(
            {"prompt": rec["prompt"], "expect": expect, **({"set": group.strip()} if group else {}), **(image or {})}
        )
    if problems:
        raise InputError(problems)
    return probes


def _probe_image(value: Any, probes_file: Path) -> dict[str, Any] | str:
    """An image probe's image (relative to the probes file) as the result fields ``image`` (its file name),
    ``image_size`` ([width, height]) and ``image_path`` (absolute); or why it cannot be read."""
    from PIL import Image

    if not isinstance(value, str) or not value.strip():
        return "'image' must be a path to an image file (relative to the probes file)"
    path = (probes_file.parent / Path(value).expanduser()).resolve()
    if not path.is_file():
        return f"no such image {value!r} ({path})"
    try:
        with Image.open(path) as image:
            image.load()
            size = list(image.size)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        return f"cannot decode image {value!r} ({path}): {type(exc).__name__}: {exc}"
    return {"image": path.name, "image_size": size, "image_path": str(path)}


def passes(answer: str, expect: list[str]) -> bool:
    low = answer.lower()
    return all(e.lower() in low for e in expect)


def _count(results: list[dict[str, Any]]) -> dict[str, Any]:
    passed = sum(1 for r in results if r.get("ok"))
    return {"passed": passed, "total": len(results), "rate": passed / len(results) if results else 0.0}


def score(results: list[dict[str, Any]]) -> dict[str, Any]:
    """passed / total / rate over every probe, and per ``set`` (``sets``) when probes name one."""
    out = _count(results)
    names = list(dict.fromkeys(r["set"] for r in results if r.get("set")))
    if names:
        out["sets"] = {name: _count([r for r in results if r.get("set") == name]) for name in names}
    return out


def probe_summary(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The counts ``summary.json`` keeps of a ``run_probes`` result (no answers)."""
    if not result:
        return None
    return {k: result[k] for k in ("passed", "total", "rate", "sets") if k in result}
