"""``cockpit stop RUN [--kill] [--wait]``: ask a run to save and stop gracefully (or kill it)."""

from __future__ import annotations

import argparse
import time

from cockpit.commands.common import EXIT_FAILED, EXIT_OK, add_runs_dir, find_run, print_input_error
from cockpit.errors import InputError
from cockpit.rundir import TERMINAL_STATES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run")
    add_runs_dir(p)
    p.add_argument("--kill", action="store_true", help="terminate the ranks now (no checkpoint)")
    p.add_argument("--wait", type=float, default=0, metavar="S", help="wait up to S seconds for the run to end")


def run(args: argparse.Namespace) -> int:
    try:
        run_dir = find_run(args)
    except InputError as err:
        return print_input_error(err)
    from cockpit.liveness import reconcile

    state = reconcile(run_dir).get("state")
    if state in TERMINAL_STATES:
        print(f"run {run_dir.run_id} already {state}")
        return EXIT_OK
    run_dir.request("kill" if args.kill else "stop", "cockpit stop")
    print(f"{'kill' if args.kill else 'stop'} requested for {run_dir.run_id}")
    deadline = time.time() + args.wait
    while time.time() < deadline:
        state = reconcile(run_dir).get("state")
        if state in TERMINAL_STATES:
            print(f"run {run_dir.run_id}: {state}")
            return EXIT_OK
        time.sleep(0.2)
    return EXIT_OK if not args.wait else EXIT_FAILED
