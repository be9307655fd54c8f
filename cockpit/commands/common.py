"""Shared argument and error handling for the command modules. No torch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cockpit.errors import InputError
from cockpit.rundir import RunDir, default_runs_dir, resolve_run

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a YAML run config (LLaMA-Factory keys)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key (repeatable)")


def add_runs_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", default=None, help="where runs live (default: $COCKPIT_RUNS_DIR or ~/.local/share/cockpit/runs)")


def runs_dir(args: argparse.Namespace) -> Path:
    return Path(args.runs_dir).expanduser() if getattr(args, "runs_dir", None) else default_runs_dir()


def print_input_error(err: InputError) -> int:
    print("cockpit: invalid input:", file=sys.stderr)
    for p in err.problems:
        print(f"  {p}", file=sys.stderr)
    return EXIT_INPUT


def load_config_or_exit(args: argparse.Namespace):
    from cockpit.config import load_config

    return load_config(args.config, args.overrides)


def find_run(args: argparse.Namespace) -> RunDir:
    try:
        return resolve_run(args.run, runs_dir(args))
    except LookupError as exc:
        raise InputError(str(exc)) from None
