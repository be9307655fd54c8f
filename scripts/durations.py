"""The suite's test times, read from the JUnit XML files pytest writes (scripts/test.sh writes one per part
into .cache/test-times/): the N slowest tests, and with --table FILE a markdown table of every test's time,
slowest first, with the date and the totals (docs/test-durations.md is made with it).

    python scripts/durations.py [--top N] [--table FILE] XML [XML ...]

Stdlib only; a missing or unreadable file is skipped with a line saying so (the suite's exit status is
test.sh's business, not this script's).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def read_times(path: Path) -> list[tuple[float, str, str]]:
    """(seconds, test id, outcome) for each test case in one JUnit XML file."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = tag
        out.append((float(case.get("time") or 0.0), name, outcome))
    return out


def table(rows: list[tuple[float, str, str]], wall: str) -> str:
    total = sum(t for t, _, _ in rows)
    lines = [
        f"# Test durations ({datetime.date.today().isoformat()})",
        "",
        f"{len(rows)} tests, {total:.0f} s of test time in all{wall}. Made by `python scripts/durations.py --table`",
        "from the JUnit XML that `scripts/test.sh` writes; slowest first.",
    ]
    tests = ["| s | share | outcome | test |", "|---:|---:|---|---|"]
    tests += [f"| {t:.1f} | {t / total:.1%} | {o} | `{n}` |" for t, n, o in rows if total]
    return "\n".join(lines) + "\n" + file_table(rows) + "\n".join(tests) + "\n"


def by_file(rows: list[tuple[float, str, str]]) -> list[tuple[float, int, str]]:
    """(seconds, tests, module) per test module, slowest first: where a file's many small tests add up."""
    spent: dict[str, float] = {}
    count: dict[str, int] = {}
    for t, name, _ in rows:
        module = name.split("::", 1)[0]
        spent[module] = spent.get(module, 0.0) + t
        count[module] = count.get(module, 0) + 1
    return sorted(((spent[m], count[m], m) for m in spent), reverse=True)


def file_table(rows: list[tuple[float, str, str]], top: int = 30) -> str:
    total = sum(t for t, _, _ in rows) or 1.0
    lines = ["", f"## The {top} slowest test modules", "", "| s | share | tests | module |", "|---:|---:|---:|---|"]
    lines += [f"| {t:.1f} | {t / total:.1%} | {n} | `{m}` |" for t, n, m in by_file(rows)[:top]]
    return "\n".join(lines) + "\n\n## Every test\n\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("xml", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--table", type=Path, default=None, help="write every test's time as a markdown table here")
    p.add_argument("--wall", default="", help="the suite's wall time, for the table's heading")
    args = p.parse_args(argv)
    rows: list[tuple[float, str, str]] = []
    for path in args.xml:
        try:
            rows += read_times(path)
        except (OSError, ET.ParseError) as exc:
            print(f"[durations] {path}: not read ({exc})", file=sys.stderr)
    rows.sort(reverse=True)
    print(f"[test] the {min(args.top, len(rows))} slowest of {len(rows)} tests:")
    for t, name, outcome in rows[: args.top]:
        print(f"[test]   {t:7.1f} s  {name}" + ("" if outcome == "passed" else f" ({outcome})"))
    if args.table:
        args.table.write_text(table(rows, f", {args.wall} s of wall time" if args.wall else ""), encoding="utf-8")
        print(f"[durations] table written to {args.table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
