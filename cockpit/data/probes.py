"""The probes file: prompts with expected substrings, answered before and after training.

File format: JSON array or JSON lines of ``{"prompt": str, "expect": str | [str, ...]}``;
a probe passes when every expected substring appears in the greedy answer (case-insensitive).
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
            problems.append(Problem("expected {\"prompt\": str, \"expect\": str | [str]}", file=str(path), line=line))
            continue
        expect = rec.get("expect")
        if isinstance(expect, str):
            expect = [expect]
        if not (isinstance(expect, list) and expect and all(isinstance(e, str) and e for e in expect)):
            problems.append(Problem("'expect' must be a non-empty string or list of strings", file=str(path), line=line))
            continue
        probes.append({"prompt": rec["prompt"], "expect": expect})
    if problems:
        raise InputError(problems)
    return probes


def passes(answer: str, expect: list[str]) -> bool:
    low = answer.lower()
    return all(e.lower() in low for e in expect)
