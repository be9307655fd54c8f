"""Shared argument and error handling for the command modules. No torch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cockpit.errors import EXIT_FAILED, EXIT_INPUT, EXIT_OK, InputError  # noqa: F401 (the commands import them from here)
from cockpit.store.rundir import RunDir, default_runs_dir, resolve_run

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

CONFIG_FLAGS_EPILOG = (
    "Config keys also as LLaMA-Factory's flags, with or without a YAML file: --model_name_or_path M "
    "--dataset D --learning_rate 1e-4 --do_train (a bare flag is true). Flags override the file; --set overrides both."
)


def add_config_args(p: argparse.ArgumentParser, *, flag_form: bool = False) -> None:
    """CONFIG and --set; with ``flag_form`` (train/check/plan, see cockpit.cli.CONFIG_FLAG_COMMANDS)
    CONFIG is optional: the keys may come as LLaMA-Factory flags instead."""
    if flag_form:
        p.add_argument(
            "config",
            nargs="?",
            default=None,
            help="a YAML run config (LLaMA-Factory keys); optional with --key value flags",
        )
        p.epilog = CONFIG_FLAGS_EPILOG
    else:
        p.add_argument("config", help="a YAML run config (LLaMA-Factory keys)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (repeatable)",
    )


def add_runs_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runs-dir", default=None, help="where runs live (default: $COCKPIT_RUNS_DIR or ~/.local/share/cockpit/runs)"
    )


def runs_dir(args: argparse.Namespace) -> Path:
    return Path(args.runs_dir).expanduser() if getattr(args, "runs_dir", None) else default_runs_dir()


def label_flag_problems(err: InputError, args: argparse.Namespace | None) -> InputError:
    """Problems about a key that a LLaMA-Factory flag set name the flag (``--fp16``)."""
    if args is not None and getattr(args, "config_flags", None):
        from cockpit.config.flags import name_flags

        name_flags(err.problems, args.config_flags, skip=parse_set_keys(args))
    return err


def print_input_error(err: InputError, args: argparse.Namespace | None = None) -> int:
    """Print the problems (naming the flags that set their keys); exit 2."""
    label_flag_problems(err, args)
    print("cockpit: invalid input:", file=sys.stderr)
    for p in err.problems:
        print(f"  {p}", file=sys.stderr)
    return EXIT_INPUT


def parse_set_keys(args: argparse.Namespace) -> list[str]:
    return [item.partition("=")[0].strip() for item in getattr(args, "overrides", None) or []]


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run config from the YAML file and/or the LLaMA-Factory flags and --set; its notes
    (an alias read as its key, ...) printed once."""
    from cockpit.config import load_config

    flags = getattr(args, "config_flags", None) or []
    if args.config is None and not flags:
        raise InputError("give a YAML config, or the config as flags (--model_name_or_path M --dataset D ...)")
    cfg = load_config(args.config, args.overrides, flags=flags)
    for note in cfg.notes:
        print(f"note: {note}", file=sys.stderr if getattr(args, "json", False) else sys.stdout)
    return cfg


def find_run(args: argparse.Namespace) -> RunDir:
    try:
        return resolve_run(args.run, runs_dir(args))
    except LookupError as exc:
        raise InputError(str(exc)) from None
