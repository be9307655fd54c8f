"""``cockpit stop RUN [--kill] [--wait]``: ask a run to save and stop gracefully (or kill it)."""

from __future__ import annotations

import argparse
import time

from cockpit.commands.common import EXIT_FAILED, EXIT_OK, add_runs_dir, find_run, print_input_error
from cockpit.errors import InputError
from cockpit.store.rundir import TERMINAL_STATES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run")
    add_runs_dir(p)
    p.add_argument("--kill", action="store_true", help="terminate the ranks now (no checkpoint)")
    p.add_argument("--wait", type=float, default=0, metavar="S", help="wait up to S seconds for the run to end")
    p.add_argument(
        "--kill-after",
        type=float,
        default=None,
        metavar="S",
        help="stop; if the run has not ended after S seconds, kill the ranks, and after S more its supervisor's session",
    )


def run(args: argparse.Namespace) -> int:
    try:
        run_dir = find_run(args)
    except InputError as err:
        return print_input_error(err)
    from cockpit.run.liveness import reconcile
    from cockpit.slurm.queue import effective_status, job_id

    status = reconcile(run_dir, status=effective_status(run_dir, fresh=True))  # the scheduler's word, then liveness
    state = status.get("state")
    if state in TERMINAL_STATES:
        print(f"run {run_dir.run_id} already {state}")
        return EXIT_OK
    if job_id(status):
        return stop_slurm(run_dir, status, args)
    if args.kill_after is not None and not args.kill:
        from cockpit.run.control import stop_escalating

        how = stop_escalating(run_dir, "cockpit stop --kill-after", args.kill_after, args.kill_after)
        ended = not how.startswith("not ended")
        print(f"run {run_dir.run_id}: {how}" + (f" ({reconcile(run_dir).get('state')})" if ended else ""))
        return EXIT_OK if ended else EXIT_FAILED
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


def stop_slurm(run_dir, status: dict, args: argparse.Namespace) -> int:
    """A Slurm run: a job still in the queue (or --kill) is cancelled with scancel; a running one
    is asked to save and stop like any run, and cancelled when it has not ended after --wait S."""
    from cockpit.slurm.queue import cancel, effective_status, job_id

    job = job_id(status)
    if args.kill or status.get("state") in ("queued", "submitting"):
        why = "cockpit stop --kill" if args.kill else "cockpit stop before the job started"
        ok, said = cancel(run_dir, job, why)
        print(f"scancel {job} ({why})" + (f": {said}" if said else "") if ok else f"scancel {job} failed: {said}")
        if not ok:
            return EXIT_FAILED
    else:
        run_dir.request("stop", "cockpit stop")
        print(f"stop requested for {run_dir.run_id} (Slurm job {job}): the ranks save a checkpoint and exit")
    deadline = time.time() + args.wait
    while time.time() < deadline:
        state = effective_status(run_dir).get("state")
        if state in TERMINAL_STATES:
            print(f"run {run_dir.run_id}: {state}")
            return EXIT_OK
        time.sleep(0.5)
    if args.wait and not args.kill:
        ok, said = cancel(run_dir, job, f"cockpit stop: not ended within {args.wait:g} s")
        print(f"the run did not stop within {args.wait:g} s: scancel {job}" + (f" ({said})" if said else ""))
        return EXIT_FAILED
    return EXIT_OK if not args.wait else EXIT_FAILED
