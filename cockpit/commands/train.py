"""``cockpit train CONFIG [--set k=v ...] [--detach] [--runs-dir DIR]``.

Validates config and data (exit 2 on bad input), creates a new run dir and starts a detached
supervisor. Without --detach it follows the run here; Ctrl-C asks whether to stop it or
leave it running. Exit: 0 finished, 1 failed, 2 invalid input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from cockpit.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    add_config_args,
    add_runs_dir,
    config_from_args,
    print_input_error,
    runs_dir,
)
from cockpit.errors import InputError

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_args(p, flag_form=True)
    add_runs_dir(p)
    p.add_argument("--detach", action="store_true", help="start the run and return (print the run dir)")
    p.add_argument("--json", action="store_true", help="with --detach: print {run_id, run_dir} as JSON")
    p.add_argument("--skip-check", action="store_true", help="do not load the tokenizer and data before launch")
    p.add_argument(
        "--progress",
        action="store_true",
        help="say each stage of the launch on stderr as it begins ('stage: ...'; the cockpit's F8 shows them)",
    )
    p.add_argument(
        "--notify-command",
        default=None,
        metavar="CMD",
        help="a shell command the run's supervisor runs, with the event as JSON on stdin, when the run finishes, "
        "fails, hangs or hits a memory-pressure alert (default: $COCKPIT_NOTIFY_COMMAND)",
    )
    add_slurm_arguments(p)


def add_slurm_arguments(p: argparse.ArgumentParser) -> None:
    from cockpit.commands.slurm_submit import add_arguments

    add_arguments(p)


def run(args: argparse.Namespace) -> int:
    from cockpit.run.launch import start_run
    from cockpit.run.shared_output import refuse_shared_output

    quiet = args.json
    held = False
    loaded = None
    try:
        stage(args, "checking the config" + ("" if args.skip_check else " and every data row"))
        cfg = config_from_args(slurm_args(args))
        refuse_shared_output(cfg, runs_dir(args), args.config)  # another run (or queue entry) writes its output_dir
        if args.skip_check:
            from cockpit.preflight.checks import static_checks

            static_checks(cfg)
        elif getattr(args, "slurm", False) or int(cfg.nnodes or 1) > 1:
            report_check(check_full(cfg, quiet, gpus=job_gpus(args, cfg)), quiet)
        else:  # the tokenizer part of the check overlaps the ranks' start-up (cockpit.run.gate)
            from cockpit.preflight.checks import check_rows

            loaded = check_rows(cfg)  # static checks, every bad row: before any run dir exists
            held = True
    except InputError as err:
        return print_input_error(err, args)
    if getattr(args, "notify_command", None):  # the supervisor (or the Slurm job) inherits it
        from cockpit.run.notify import ENV_COMMAND

        os.environ[ENV_COMMAND] = args.notify_command
    if getattr(args, "slurm", False):
        from cockpit.commands.slurm_submit import submit

        return submit(args, cfg, runs_dir(args))
    stage(args, "creating the run dir and starting its supervisor")
    run = start_run(cfg, config_path=args.config, runs_dir=runs_dir(args), held=held)
    if held:
        stage(args, f"run {run.run_id} started: its ranks load the model while the tokenizer checks the data")
        failed = check_held(run, cfg, loaded, args)
        if failed is not None:
            return failed
        stage(args, "check passed: the run trains")
    if args.detach:
        if args.json:
            print(json.dumps({"run_id": run.run_id, "run_dir": str(run.path)}))
        else:
            print(f"run {run.run_id} started (detached)\nrun dir: {run.path}\nfollow it: cockpit attach {run.run_id}")
        return EXIT_OK
    return follow_interactively(run)


def stage(args: argparse.Namespace, what: str) -> None:
    """``--progress``: a stage of the launch, on stderr as it begins."""
    if getattr(args, "progress", False):
        print(f"stage: {what}", file=sys.stderr, flush=True)


def check_full(cfg: RunConfig, quiet: bool, loaded=None, gpus: int | None = None):
    from cockpit.preflight.checks import check_run

    return check_run(cfg, log=(lambda *_: None) if quiet else print, loaded=loaded, gpus=gpus)


def job_gpus(args: argparse.Namespace, cfg: RunConfig) -> int | None:
    """A Slurm job's GPUs as the gate counts them (its nodes, not this login node): 1 when its
    script asks for GPUs, else 0; None (this machine's) for a run started here."""
    if not getattr(args, "slurm", False):
        return None
    from cockpit.slurm.script import cluster_has_gpus, needs_gpus

    return 1 if needs_gpus(cfg.use_cpu, cluster_has_gpus()) else 0


def report_check(result, quiet: bool) -> None:
    if quiet:
        return
    for line in result.report.lines():
        print(line)
    for w in result.warnings:
        print(f"warning: {w}")


def check_held(run, cfg: RunConfig, loaded, args: argparse.Namespace) -> int | None:
    """The tokenizer part of the check while the held run starts: release it when the check
    passes (None); cancel it (its run dir removed) and return the exit code when it fails."""
    from cockpit.run import gate

    try:
        report_check(check_full(cfg, args.json, loaded), args.json)
    except InputError as err:
        if not gate.cancel(run, f"invalid input: {err}"):
            print(f"cockpit: the cancelled run did not end in time; its run dir is left at {run.path}", file=sys.stderr)
        return print_input_error(err, args)
    except BaseException:
        gate.cancel(run, "the data check was interrupted")
        raise
    gate.release(run)
    return None


def slurm_args(args: argparse.Namespace) -> argparse.Namespace:
    """--slurm --nodes N: the config's nnodes (cockpit.commands.slurm_submit)."""
    from cockpit.commands.slurm_submit import overrides

    extra = overrides(args)
    return argparse.Namespace(**{**vars(args), "overrides": [*args.overrides, *extra]}) if extra else args


def follow_interactively(run) -> int:
    from cockpit.run.follow import Follower

    print(f"run dir: {run.path}")
    follower = Follower(run)
    while True:
        try:
            state = follower.follow()
            return EXIT_OK if state in ("finished", "stopped") else EXIT_FAILED
        except KeyboardInterrupt:
            answer = ask_stop()
            if answer == "stop":
                run.request("stop", "Ctrl-C in cockpit train")
                print("\nstop requested: the run saves a checkpoint and stops; following until it does ...")
            elif answer == "leave":
                print(f"\nthe run keeps going. Follow it again: cockpit attach {run.run_id}")
                return EXIT_OK


def ask_stop() -> str:
    if not sys.stdin.isatty():
        return "leave"
    try:
        reply = input("\n[s]top the run (save and exit), [l]eave it running, [c]ontinue following? ").strip().lower()
    except (EOFError, KeyboardInterrupt):
        return "leave"
    return {"s": "stop", "l": "leave"}.get(reply[:1], "continue")
