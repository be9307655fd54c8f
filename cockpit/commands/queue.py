"""``cockpit queue [add CONFIG [--set k=v ...] | rm ID | move ID N] [--json]``: the run queue.

``add`` checks the config as ``cockpit check`` does (a config that fails is refused, exit 2, with the
same problems) and starts the queue runner (``cockpit.run.queue``) when none is alive; queued runs
start in order, each when the GPUs it needs are free (one at a time on a host without GPUs); the
listing's GPUS column says which GPUs a started entry holds, or how many a queued one waits for. Every form adopts a queue whose runner
died. Exit: 0 ok, 2 invalid input (a bad config, an unknown entry, a Slurm run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from cockpit.commands.common import EXIT_INPUT, EXIT_OK, add_config_args, add_runs_dir, print_input_error, runs_dir
from cockpit.errors import InputError


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_runs_dir(p)
    p.add_argument("--json", action="store_true", help="print the queue (or the added entry) as JSON")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    add = sub.add_parser("add", help="check a config and queue it")
    add_config_args(add)
    add.add_argument("--slurm", action="store_true", help=argparse.SUPPRESS)  # refused: Slurm queues those
    rm = sub.add_parser("rm", help="take a queued entry out")
    rm.add_argument("id")
    move = sub.add_parser("move", help="put a queued entry at position N (1: next to start)")
    move.add_argument("id")
    move.add_argument("position", type=int)
    for s in (add, rm, move):  # given after the action too; SUPPRESS keeps one given before it
        s.add_argument("--runs-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        s.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from cockpit.run.queue import ensure_runner

    runs = runs_dir(args)
    action = getattr(args, "action", None)
    try:
        return {"add": add, "rm": remove, "move": move}.get(action or "", show)(args)
    except InputError as err:
        return print_input_error(err, args)
    except LookupError as err:
        print(f"cockpit queue: {err.args[0]}", file=sys.stderr)
        return EXIT_INPUT
    finally:
        ensure_runner(runs)  # adopt: a queue whose runner died starts again


def add(args: argparse.Namespace) -> int:
    from cockpit.commands.common import config_from_args
    from cockpit.preflight.checks import check_run
    from cockpit.run.queue import SLURM_REFUSAL, add_entry, queue_refusal
    from cockpit.run.shared_output import refuse_shared_output

    if args.slurm:
        raise InputError(SLURM_REFUSAL)
    cfg = config_from_args(args)
    if why := queue_refusal(cfg):
        raise InputError(why)
    refuse_shared_output(cfg, runs_dir(args), args.config)  # another run (or entry) writes its output_dir
    check_run(cfg, log=lambda *_: None)
    entry = add_entry(runs_dir(args), args.config, list(args.overrides), os.getcwd(), output_dir=cfg.output_dir)
    if args.json:
        print(json.dumps(entry))
    else:
        print(f"queued {entry['id']} at position {entry['position'] or 'next (starting)'}: {entry['config']}")
    return EXIT_OK


def remove(args: argparse.Namespace) -> int:
    from cockpit.run.queue import remove_entry

    entry = remove_entry(runs_dir(args), args.id)
    print(f"removed {entry['id']}: {entry['config']}")
    return EXIT_OK


def move(args: argparse.Namespace) -> int:
    from cockpit.run.queue import move_entry

    try:
        pos = move_entry(runs_dir(args), args.id, args.position)
    except ValueError as err:
        raise InputError(str(err)) from None
    print(f"moved {args.id}: " + ", ".join(f"{i} {n}" for i, n in pos.items() if n))
    return EXIT_OK


def show(args: argparse.Namespace) -> int:
    from cockpit.commands.runs import command_text
    from cockpit.run.queue import gpus_text, listing, runner_alive

    runs = runs_dir(args)
    rows = listing(runs)
    if args.json:
        print(json.dumps(rows, indent=1))
        return EXIT_OK
    if not rows:
        print(f"the queue of {runs} is empty")
        return EXIT_OK
    print(f"{'ID':8} {'POS':>4} {'STATE':10} {'GPUS':14} {'RUN':44} CONFIG")
    for r in rows:
        gpus = gpus_text(r) or "-"
        print(
            f"{r['id']:8} {r['position'] or '-':>4} {r['run_state']:10} {gpus:14} {r['run_id'] or '-':44} {command_text(r)}"
        )
    if not runner_alive(runs):
        print("(no queue runner alive: starting one)")
    return EXIT_OK
