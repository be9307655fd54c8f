"""``cockpit doctor [CONFIG [--set K=V]] [--json] [--gpu-smoke] [--needs TAGS]``: check the machine.

With CONFIG, the machine is checked for that config: its needs (GPUs, ROCm, DeepSpeed, bitsandbytes,
trackers, ...: :func:`cockpit.doctor.relevance.config_tags`, added to ``--needs``) make a missing piece
fail, and the field guide's config rules (docs/rocm.md) judge its keys.
Human output: one line per check with its status, the fix under warnings and failures.
``--json``: the list documented in :mod:`cockpit.doctor` (the Doctor screen runs this in a
subprocess). Exit 0 when nothing fails, 1 when a check fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator

MARKS = {"pass": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
COLORS = {"pass": "32", "warn": "33", "fail": "31;1", "skip": "2"}


def _tags(value: str) -> list[str]:
    from cockpit.doctor.model import TAGS

    tags = [t.strip() for t in value.split(",") if t.strip()]
    unknown = [t for t in tags if t not in TAGS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown tag(s) {', '.join(unknown)}; known: {', '.join(sorted(TAGS))}")
    return tags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", nargs="?", default=None, help="a run config: check this machine for what it needs (optional)"
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the checks as a JSON list (stable schema, see cockpit.doctor)"
    )
    parser.add_argument(
        "--gpu-smoke",
        action="store_true",
        help="also run a matmul on each GPU and an all-reduce across them (CPU-only torch: CPU matmul + 2-process gloo all-reduce)",
    )
    parser.add_argument(
        "--needs",
        type=_tags,
        default=[],
        metavar="TAGS",
        help="comma-separated tags the planned run needs (e.g. multi_gpu,deepspeed,qlora): missing pieces for them fail instead of warn",
    )


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """While checks run, anything printed (by torch, amdsmi, C libraries) goes to stderr,
    so that stdout carries the JSON alone."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        saved = -1
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)


def render(checks: list, color: bool = False) -> str:
    width = max((len(c.title) for c in checks), default=10)
    lines = []
    for c in checks:
        mark = f"{MARKS[c.status]:<4}"
        if color:
            mark = f"\033[{COLORS[c.status]}m{mark}\033[0m"
        seen = c.seen.replace("\n", "\n" + " " * (10 + width))  # a check of several rows (extras)
        lines.append(f"  {mark}  {c.title:<{width}}  {seen}")
        if c.fix and c.status in ("warn", "fail"):
            for i, fix_line in enumerate(c.fix.splitlines()):
                lines.append(f"  {'':4}  {'':<{width}}  {'fix: ' if i == 0 else '     '}{fix_line}")
    return "\n".join(lines)


def config_needs(args: argparse.Namespace) -> tuple[dict | None, list[str]]:
    """(the config's schema keys, --needs with the config's tags) for ``cockpit doctor CONFIG``."""
    if not getattr(args, "config", None):
        return None, list(args.needs)
    from cockpit.commands.common import config_from_args
    from cockpit.doctor.relevance import config_tags

    keys = config_from_args(args).keys_only()
    return keys, sorted(set(args.needs) | config_tags(keys))


def run(args: argparse.Namespace) -> int:
    from cockpit.commands.common import print_input_error
    from cockpit.doctor import exit_code, run_checks, summary
    from cockpit.errors import InputError

    try:
        keys, needs = config_needs(args)
    except InputError as err:
        return print_input_error(err, args)
    if args.json:
        with _stdout_to_stderr():
            checks = run_checks(gpu_smoke=args.gpu_smoke, needs=needs, keys=keys)
        print(json.dumps([c.to_dict() for c in checks], indent=2, default=str))
        return exit_code(checks)
    checks = run_checks(gpu_smoke=args.gpu_smoke, needs=needs, keys=keys)
    if keys is not None:
        print(f"checking this machine for {args.config} (what it needs fails where it is missing)")
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    print(render(checks, color=color))
    n = summary(checks)
    print(f"\n{n['pass']} ok, {n['warn']} warning(s), {n['fail']} failed, {n['skip']} skipped")
    return exit_code(checks)
