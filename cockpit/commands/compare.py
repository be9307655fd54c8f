"""``cockpit compare RUN RUN [...] [--json]``: loss curves, the config keys that differ and the
summaries of two or more runs side by side (``cockpit/compare.py``; the TUI's compare screen
draws the same data). No torch."""

from __future__ import annotations

import argparse
import json
import shutil

from cockpit.commands.common import EXIT_OK, add_runs_dir, print_input_error, runs_dir
from cockpit.errors import InputError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="two or more runs: id, unique prefix/suffix, or run dir")
    add_runs_dir(p)
    p.add_argument("--json", action="store_true", help="curves per step (and tokens seen), config diff, summaries")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except InputError as err:
        return print_input_error(err)


def _run(args: argparse.Namespace) -> int:
    from cockpit.compare import compare, resolve_all, text_report

    if len(args.runs) < 2:
        raise InputError("compare needs two or more runs")
    try:
        runs = resolve_all(args.runs, runs_dir(args))
    except LookupError as exc:
        raise InputError(str(exc)) from None
    if len({r.path.resolve() for r in runs}) < len(runs):
        raise InputError("the same run is named twice: " + " ".join(args.runs))
    data = compare(runs)
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        print(text_report(data, shutil.get_terminal_size((100, 24)).columns))
    return EXIT_OK
