"""``cockpit attach RUN``: replay the run's event log, then follow it live until it ends."""

from __future__ import annotations

import argparse

from cockpit.commands.common import EXIT_OK, add_runs_dir, find_run, print_input_error
from cockpit.errors import InputError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run id (or a unique prefix/suffix), run dir, or 'last'")
    add_runs_dir(p)
    p.add_argument("--no-follow", action="store_true", help="replay only, do not wait for the end")


def run(args: argparse.Namespace) -> int:
    from cockpit.commands.train import follow_interactively
    from cockpit.run.follow import Follower

    try:
        run_dir = find_run(args)
    except InputError as err:
        return print_input_error(err)
    from cockpit.run.liveness import reconcile

    status = reconcile(run_dir)  # adopts the ranks of a run whose supervisor died
    if args.no_follow:
        f = Follower(run_dir, show_progress=False)
        f.pump()
        print(
            f"run {run_dir.run_id}: {status.get('state')}"
            + (f" ({status['reason']})" if status.get("reason") and status.get("state") == "lost" else "")
        )
        return EXIT_OK
    return follow_interactively(run_dir)
