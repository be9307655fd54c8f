"""``cockpit prune [--state S ...] [--older-than DAYS] [--dry-run] [--yes] [--with-output-dir] [--json]``.

Deletes the runs of the runs dir that ended in one of the given states (default: failed, lost,
cancelled; a stopped run can still be resumed, a finished one holds a result: name them to prune
them) and, with ``--older-than``, ended more than DAYS ago. Active and queued runs are never
pruned. What is deleted, kept and asked is ``cockpit rm``'s (an outside ``output_dir`` stays
unless ``--with-output-dir``); ``--json`` prints the object documented in ``cockpit rm``.
Exit: 0 done (or nothing to prune, or a dry run), 1 a deletion failed or the answer was no,
2 invalid input.
"""

from __future__ import annotations

import argparse
import json

from cockpit.commands.common import EXIT_OK, runs_dir
from cockpit.commands.rm import add_removal_arguments, carry_out, outcome
from cockpit.store.rundir import TERMINAL_STATES

DEFAULT_STATES = ("failed", "lost", "cancelled")


def non_negative_days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of days, not {text!r}") from None
    if not days >= 0:
        raise argparse.ArgumentTypeError(f"a number of days >= 0, not {text!r}")
    return days


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state",
        action="append",
        choices=sorted(TERMINAL_STATES),
        default=None,
        metavar="STATE",
        help=f"prune runs that ended in STATE (repeatable; {', '.join(sorted(TERMINAL_STATES))}; "
        f"default: {' '.join(DEFAULT_STATES)})",
    )
    p.add_argument(
        "--older-than",
        type=non_negative_days,
        default=None,
        metavar="DAYS",
        help="only runs that ended DAYS ago or more",
    )
    add_removal_arguments(p)


def run(args: argparse.Namespace) -> int:
    from cockpit.run.remove import current_statuses, select
    from cockpit.store.rundir import list_runs

    root = runs_dir(args)
    runs = list_runs(root)
    statuses = current_statuses(runs)
    chosen = select(runs, statuses, args.state or DEFAULT_STATES, args.older_than)
    if not chosen:
        if args.json:
            print(json.dumps(outcome(args, [], error=None)))
        else:
            age = f", ended over {args.older_than:g} days ago" if args.older_than is not None else ""
            print(f"nothing to prune in {root} (state {' or '.join(args.state or DEFAULT_STATES)}{age})")
        return EXIT_OK
    picked = {r.run_id for r in chosen}
    others = [r for r in runs if r.run_id not in picked]
    return carry_out(args, chosen, statuses, root, others, refuse_all=False)
