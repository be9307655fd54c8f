"""``cockpit`` command line. Every action of the TUI has a headless form here.

This module and everything it imports at module level must not import torch, transformers,
peft or textual: each command imports what it needs inside ``run``. Each command module
exports ``add_arguments(parser)`` and ``run(args) -> int`` (exit code: 0 ok, 1 failed,
2 invalid input).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> (module, one-line help). Add one line per command.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("cockpit.commands.train", "start a run from a YAML config (detached supervisor)"),
    "check": ("cockpit.commands.check", "validate a config and its data, print the truncation report"),
    "runs": ("cockpit.commands.runs", "list the runs in the runs dir"),
    "queue": (
        "cockpit.commands.queue",
        "queue runs (add CONFIG, rm ID, move ID N): each starts when the previous ends",
    ),
    "sweep": (
        "cockpit.commands.sweep",
        "search a config's keys with Optuna: trials as runs, weak ones pruned, the best as a preset",
    ),
    "compare": (
        "cockpit.commands.compare",
        "two or more runs side by side: loss curves, config keys that differ, summaries",
    ),
    "rm": ("cockpit.commands.rm", "delete ended runs: their run dirs (an outside output_dir only when asked)"),
    "prune": (
        "cockpit.commands.prune",
        "delete the runs that failed, were lost (or ended as --state says), older than N days",
    ),
    "attach": ("cockpit.commands.attach", "replay a run's event log, then follow it live"),
    "stop": ("cockpit.commands.stop", "ask a run to save and stop (or --kill)"),
    "save": ("cockpit.commands.save", "ask a run to save a checkpoint now"),
    "resume": ("cockpit.commands.resume", "continue a stopped or failed run from its last good checkpoint"),
    "export": ("cockpit.commands.export", "export a run's adapter, or merge it into the base model"),
    "serve": (
        "cockpit.commands.serve",
        "hand a run to vLLM: hot-load its adapter into a running server, or print/start the server",
    ),
    "chat": ("cockpit.commands.chat", "the same prompt to base and tuned model, side by side, streamed"),
    "preview": (
        "cockpit.commands.preview",
        "show the exact launch: torchrun command, every rank's env, NUMA binding, other nodes",
    ),
    "plan": ("cockpit.commands.plan", "estimate per-device memory before launch; say whether it fits"),
    "tune": (
        "cockpit.commands.tune",
        "find the micro-batch that fits and runs fastest by real trial steps; write a tuned config",
    ),
    "doctor": ("cockpit.commands.doctor", "check the machine: ROCm, torch, RCCL, DeepSpeed, bitsandbytes, NUMA"),
    "web": ("cockpit.commands.web", "serve the cockpit to a browser (textual-serve), on 127.0.0.1 unless --public"),
    "metrics": (
        "cockpit.commands.metrics",
        "export runs' metrics and GPU telemetry for Prometheus, on 127.0.0.1 unless --public",
    ),
}


# Commands that read a run config: they also take LLaMA-Factory's flag form (--key value ...).
CONFIG_FLAG_COMMANDS = ("train", "check", "plan")


class CockpitArgumentParser(argparse.ArgumentParser):
    """argparse exits 2 on bad usage, which is our 'invalid input' code; keep it."""


def wants_ui(argv: list[str]) -> bool:
    """No command and no help/version: the TUI (``cockpit CONFIG.yaml``: the TUI with that config in
    Setup). Then the parser is built without the commands' subparsers, whose modules (YAML, the
    config schema, ...) the UI's first frame would wait for."""
    i, configs = 0, 0
    while i < len(argv):
        a = argv[i]
        if a == "--runs-dir":
            i += 2
            continue
        if a.startswith("--runs-dir="):
            i += 1
            continue
        if a in COMMANDS or not a.endswith((".yaml", ".yml")) or configs:
            return False
        configs += 1
        i += 1
    return True


def build_parser(with_commands: bool = True) -> argparse.ArgumentParser:
    parser = CockpitArgumentParser(
        prog="cockpit",
        description="Terminal training cockpit for fine-tuning LLMs. With no command: the TUI.",
    )
    from cockpit import __version__

    parser.add_argument("--version", action="version", version=f"cockpit {__version__}")
    parser.add_argument(
        "--runs-dir",
        dest="ui_runs_dir",
        default=None,
        metavar="DIR",
        help="the runs dir of the TUI and of every command that reads or starts runs, before or after the "
        "command (default: $COCKPIT_RUNS_DIR or ~/.local/share/cockpit/runs)",
    )
    if not with_commands:
        parser.add_argument(
            "config", nargs="?", default=None, metavar="CONFIG.yaml", help="open this config in Setup (the TUI)"
        )
        parser.set_defaults(command=None)
        return parser
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(module)
        mod.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def quiet_libraries() -> None:
    """No download/convert progress bars from HF libraries in our output or the ranks' logs."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def command_index(argv: list[str]) -> int | None:
    """Where the command name is in argv (after the global --runs-dir), or None."""
    i = 0
    while i < len(argv):
        if argv[i] == "--runs-dir":
            i += 2
        elif argv[i].startswith("--runs-dir="):
            i += 1
        else:
            return i if argv[i] in COMMANDS else None
    return None


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The parsed command line. For train/check/plan, LLaMA-Factory's config flags are taken out
    first (``args.config_flags``); the command's own options and the YAML path go to argparse."""
    from cockpit.errors import InputError

    parser = build_parser(with_commands=not wants_ui(argv))
    at = command_index(argv)
    flags: list = []
    if at is not None and argv[at] in CONFIG_FLAG_COMMANDS:
        from cockpit.config.flags import own_options, split_config_flags

        own = argparse.ArgumentParser(add_help=True)
        importlib.import_module(COMMANDS[argv[at]][0]).add_arguments(own)
        try:
            tail, flags = split_config_flags(argv[at + 1 :], own_options(own))
        except InputError as err:
            parser.exit(2, f"cockpit {argv[at]}: invalid input:\n" + "".join(f"  {p}\n" for p in err.problems))
        argv = [*argv[: at + 1], *tail]
    args = parser.parse_args(argv)
    args.config_flags = flags
    global_runs_dir(parser, args)
    return args


def global_runs_dir(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``cockpit --runs-dir DIR COMMAND``: DIR is the command's ``--runs-dir`` (the same DIR at both
    places is fine, two different ones are refused); a command that reads no runs dir refuses it
    (exit 2) rather than ignoring it."""
    given = getattr(args, "ui_runs_dir", None)
    if not args.command or given is None:
        return
    if not hasattr(args, "runs_dir"):
        parser.exit(2, f"cockpit: --runs-dir does nothing for `cockpit {args.command}` (it reads no runs dir)\n")
    same = os.path.abspath(os.path.expanduser(given))
    if args.runs_dir is not None and os.path.abspath(os.path.expanduser(args.runs_dir)) != same:
        parser.exit(
            2, f"cockpit: two runs dirs given: --runs-dir {given} and {args.command} --runs-dir {args.runs_dir}\n"
        )
    args.runs_dir = given


def main(argv: list[str] | None = None) -> int:
    """The ``cockpit`` command. Output piped into a reader that stops early (``cockpit compare A B |
    head``) ends quietly, as Python's docs on SIGPIPE recommend: stdout goes to devnull (so the flush
    at exit does not fail again) and the exit code is 1."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # stdout without a file descriptor (captured)
            pass
        return 1
    return code


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_libraries()
    args = parse_args(argv)
    if not args.command:
        try:
            mod = importlib.import_module("cockpit.ui.app")
        except ModuleNotFoundError:
            build_parser(with_commands=False).print_help()
            return 0
        return int(mod.run_app(args) or 0)
    mod = importlib.import_module(args._module)
    try:
        return int(mod.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
