"""``cockpit rm RUN [RUN ...] [--yes] [--dry-run] [--with-output-dir] [--json]``: delete runs.

Each RUN (a path, an id, or a unique id prefix/suffix) must have ended (finished, failed,
stopped, lost, cancelled); an active or queued run is refused, and then nothing is deleted:
stop it first (``cockpit stop RUN --wait 60``). The run dir goes whole, merged / export folders
under it included. An ``output_dir`` outside the run dir is kept and said so, unless
``--with-output-dir`` (never one that holds the working dir, the runs dir or the home folder, or
that a remaining run writes to, and never a file: only a folder). The counts say what went: a run
whose run dir went is deleted even when its output_dir could not be (``output_dir_error``, exit 1). On a terminal it asks first; ``--yes`` does not ask; without a
terminal (a script, the UI) ``--yes`` or ``--dry-run`` is required.

``--json`` prints one object (the UI's Runs screen calls ``cockpit rm RUN --yes --json``)::

    {"dry_run": bool, "deleted": bool,          # deleted: every planned run was deleted
     "freed_bytes": int,                        # bytes on disk freed (run dirs, deleted output_dirs)
     "error": str | null,                       # why nothing was done (a refused run, no --yes, ...)
     "runs": [{"run_id": str, "run_dir": str, "state": str, "bytes": int,
               "parts": {"checkpoints": int, "merged": int, "files": int, ...},   # top-level folders
               "output_dir": str | null,        # only an output_dir outside the run dir
               "output_dir_bytes": int | null, "output_dir_deleted": bool,
               "output_dir_note": str | null,   # why it is kept
               "output_dir_error": str | null,  # why deleting it failed (the run dir went)
               "refused": str | null,           # why this run is not deleted (active: stop it first)
               "deleted": bool, "error": str | null}]}

Exit: 0 deleted (or a dry run), 1 a deletion failed or the question was answered no,
2 invalid input (an unknown or active run, no terminal and no --yes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cockpit.commands.common import EXIT_FAILED, EXIT_INPUT, EXIT_OK, add_runs_dir, print_input_error, runs_dir
from cockpit.errors import InputError
from cockpit.store.rundir import RunDir


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="+", help="run ids (or unique prefixes/suffixes, or run dir paths)")
    add_removal_arguments(p)


def add_removal_arguments(p: argparse.ArgumentParser) -> None:
    """The options rm and prune share."""
    add_runs_dir(p)
    p.add_argument("--yes", "-y", action="store_true", help="delete without asking")
    p.add_argument("--dry-run", action="store_true", help="say what would be deleted and freed; delete nothing")
    p.add_argument(
        "--with-output-dir",
        action="store_true",
        help="also delete a run's output_dir when it is outside the run dir (kept by default)",
    )
    p.add_argument("--json", action="store_true", help="print the outcome as one JSON object (see cockpit rm's doc)")


def run(args: argparse.Namespace) -> int:
    from cockpit.run.remove import current_statuses
    from cockpit.store.rundir import list_runs, resolve_run

    root = runs_dir(args)
    try:
        runs: list[RunDir] = []
        for ref in args.run:
            try:
                found = resolve_run(ref, root)
            except LookupError as exc:
                raise InputError(str(exc)) from None
            if found.path not in [r.path for r in runs]:
                runs.append(found)
    except InputError as err:
        if args.json:
            print(json.dumps(outcome(args, [], error=str(err.problems[0]))))
        return print_input_error(err)
    named = {r.path.resolve() for r in runs}
    others = [r for r in list_runs(root) if r.path.resolve() not in named]
    return carry_out(args, runs, current_statuses(runs), root, others, refuse_all=True)


def carry_out(
    args: argparse.Namespace,
    runs: list[RunDir],
    statuses: dict,
    root: Path,
    others: list[RunDir],
    *,
    refuse_all: bool,
) -> int:
    """Plan, show, confirm, delete. ``refuse_all``: one refused run deletes nothing (rm, where the
    user named each run); else the refused ones are skipped."""
    from cockpit.run.remove import delete, plan

    items = plan(runs, statuses, runs_dir=root, with_output_dir=args.with_output_dir, others=others)
    refused = [i for i in items if i.refused]
    todo = [i for i in items if not i.refused]
    if not args.json:
        show(items)
    error = None
    if refused and refuse_all:
        error = "; ".join(f"{i.run.run_id} is {i.refused}" for i in refused)
    elif not todo:
        error = None if not items else "no run can be deleted"
    if error or not todo or args.dry_run:
        return finish(args, items, error, EXIT_INPUT if error else EXIT_OK)
    answer = confirm(args, todo)
    if answer is not None:
        return finish(args, items, answer[1], answer[0])
    for item in todo:
        delete(item)
    failed = [i for i in todo if not i.deleted or i.output_error]
    return finish(args, items, None, EXIT_FAILED if failed else EXIT_OK)


def confirm(args: argparse.Namespace, todo: list) -> tuple[int, str] | None:
    """None to go on; else (exit code, why not)."""
    from cockpit.run.remove import fmt_bytes

    if args.yes:
        return None
    if args.json or not sys.stdin.isatty():
        return EXIT_INPUT, "not a terminal: pass --yes to delete without asking (or --dry-run)"
    frees = sum(i.frees() for i in todo)
    try:
        reply = input(f"delete {len(todo)} run{'s' if len(todo) > 1 else ''}, freeing {fmt_bytes(frees)}? [y/N] ")
    except (EOFError, KeyboardInterrupt):
        reply = ""
    if reply.strip().lower() in ("y", "yes"):
        return None
    return EXIT_FAILED, "not confirmed: nothing deleted"


def show(items: list) -> None:
    """One line per run (state, size, its largest parts), its outside output_dir, refusals."""
    from cockpit.run.remove import fmt_bytes

    for i in items:
        big = sorted(((n, b) for n, b in i.parts.items() if b >= 1 << 20), key=lambda nb: -nb[1])
        said = f" ({', '.join(f'{n} {fmt_bytes(b)}' for n, b in big)})" if big else ""
        print(f"{i.run.run_id}  {i.state or '?'}  {fmt_bytes(i.bytes)}{said}")
        if i.output_dir is not None and i.output_bytes is not None:
            fate = "deleted too" if i.delete_output else f"kept: {i.output_note}"
            print(f"    output_dir {i.output_dir}: {fmt_bytes(i.output_bytes)}, {fate}")
        if i.refused:
            print(f"    refused: {i.refused}")


def finish(args: argparse.Namespace, items: list, error: str | None, code: int) -> int:
    from cockpit.run.remove import fmt_bytes

    freed = sum(i.freed() for i in items)
    if args.json:
        print(json.dumps(outcome(args, items, error=error)))
        return code
    for i in items:
        if i.error:
            print(f"cockpit: could not delete {i.run.run_id}: {i.error}", file=sys.stderr)
        if i.output_error:
            print(f"cockpit: deleted {i.run.run_id}, not its output_dir: {i.output_error}", file=sys.stderr)
    if error:
        print(f"cockpit: {error}", file=sys.stderr)
    elif args.dry_run:
        would = [i for i in items if not i.refused]
        frees = sum(i.frees() for i in would)
        print(f"dry run: would delete {len(would)} run(s), freeing {fmt_bytes(frees)}; nothing deleted")
    elif items:
        print(f"deleted {sum(1 for i in items if i.deleted)} run(s), freed {fmt_bytes(freed)}")
    return code


def outcome(args: argparse.Namespace, items: list, *, error: str | None) -> dict:
    todo = [i for i in items if not i.refused or i.deleted]
    return {
        "dry_run": bool(args.dry_run),
        "deleted": bool(todo) and all(i.deleted for i in todo) and not error,
        "freed_bytes": sum(i.freed() for i in items),
        "error": error,
        "runs": [i.to_json() for i in items],
    }
