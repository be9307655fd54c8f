"""``cockpit save RUN``: ask a running run to write a checkpoint at its next step."""

from __future__ import annotations

import argparse

from cockpit.commands.common import EXIT_OK, add_runs_dir, find_run, print_input_error
from cockpit.errors import InputError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run")
    add_runs_dir(p)


def run(args: argparse.Namespace) -> int:
    try:
        run_dir = find_run(args)
    except InputError as err:
        return print_input_error(err)
    run_dir.request("save", "cockpit save")
    print(f"save requested for {run_dir.run_id}")
    return EXIT_OK
