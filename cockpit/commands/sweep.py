"""``cockpit sweep SPEC.yaml [--detach] | --resume NAME | status NAME [--json] | best NAME [--save-preset PATH]``.

A sweep: trials of one base config over a search space, run as ordinary detached runs named
``<name>-t<N>``, ``parallel`` at once, weak ones pruned at an evaluation (``cockpit.sweep``). Before
any trial starts, every corner config of the space passes ``cockpit check`` (refused: exit 2, with
the key and value that break it) and the planner's largest trial must fit. The driver runs here
until the budget is spent; killed, ``--resume NAME`` goes on with no trial lost or run twice.
Exit: 0 done, 1 no trial completed, 2 invalid input.
"""

from __future__ import annotations

import argparse
import json
import sys

from cockpit.commands.common import EXIT_FAILED, EXIT_INPUT, EXIT_OK, add_runs_dir, print_input_error, runs_dir
from cockpit.errors import InputError

ACTIONS = ("status", "best")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "words",
        nargs="*",
        metavar="SPEC.yaml | status NAME | best NAME",
        help="a sweep spec to start, or status / best of the sweep NAME",
    )
    p.add_argument("--resume", metavar="NAME", default=None, help="go on with the sweep NAME after its driver ended")
    p.add_argument("--json", action="store_true", help="status / best: as JSON")
    p.add_argument("--save-preset", metavar="PATH", default=None, help="best: write the best trial's config here")
    p.add_argument(
        "--detach",
        action="store_true",
        help="check, create the sweep, then run its driver in its own session (log: <runs>/sweeps/NAME/driver.log)",
    )
    p.add_argument("--skip-check", action="store_true", help="start without checking the space's corner configs")
    p.add_argument("--poll", type=float, default=None, help=argparse.SUPPRESS)  # tests: the driver's turn
    add_runs_dir(p)


def run(args: argparse.Namespace) -> int:
    words = list(args.words)
    try:
        if words and words[0] in ACTIONS:
            if len(words) != 2:
                raise InputError(f"cockpit sweep {words[0]} NAME")
            return show_status(args, words[1]) if words[0] == "status" else show_best(args, words[1])
        if args.resume:
            if words:
                raise InputError("--resume NAME takes no spec")
            return drive(args, None, args.resume)
        if len(words) != 1:
            raise InputError("cockpit sweep SPEC.yaml (or --resume NAME, status NAME, best NAME)")
        return drive(args, words[0], None)
    except InputError as err:
        return print_input_error(err, args)
    except LookupError as err:
        print(f"cockpit sweep: {err.args[0]}", file=sys.stderr)
        return EXIT_INPUT


def drive(args: argparse.Namespace, spec_path: str | None, resume: str | None) -> int:
    from cockpit.sweep.driver import POLL_S, Driver, main_log, open_study, read_sweep_spec, sweep_dir
    from cockpit.sweep.spec import read_spec

    runs = runs_dir(args)
    if resume:
        spec = read_sweep_spec(runs, resume)
        from cockpit.sweep.spec import require_launcher

        require_launcher(spec)  # a Slurm sweep resumed where there is no sbatch
        driver = Driver(runs, spec, log=main_log, poll_s=args.poll or POLL_S)
        study = open_study(runs, spec)
        main_log(f"sweep {spec.name}: resumed ({len(study.trials)} of {spec.budget()} trials asked)")
    else:
        assert spec_path is not None
        spec = read_spec(spec_path)
        if (sweep_dir(runs, spec.name) / "optuna.db").exists():
            raise InputError(
                f"a sweep {spec.name!r} exists in {runs}: cockpit sweep --resume {spec.name}, or give another name"
            )
        if not args.skip_check:
            from cockpit.sweep.driver import check_space

            check_space(spec, log=main_log)
        driver = Driver(runs, spec, log=main_log, poll_s=args.poll or POLL_S)
        study = driver.create()
        main_log(
            f"sweep {spec.name}: {trials_line(spec)}, {spec.parallel} at once, {spec.sampler} / {spec.pruner}; {sweep_dir(runs, spec.name)}"
        )
        if args.detach:
            pid = detach(runs, spec.name, args.poll)
            log = sweep_dir(runs, spec.name) / "driver.log"
            print(f"driver {pid} detached; log: {log}\nfollow it: cockpit sweep status {spec.name}")
            return EXIT_OK
    driver.run(study)
    from cockpit.sweep.driver import status

    st = status(runs, spec.name)
    print_table(st)
    return EXIT_OK if st["best"] else EXIT_FAILED


def trials_line(spec) -> str:
    """The budget as the driver asks it: a grid smaller than ``trials`` runs each of its points once."""
    if spec.budget() < spec.trials:
        return f"{spec.budget()} trials (the grid's {spec.grid_points()} points; trials: {spec.trials})"
    return f"{spec.trials} trials"


def detach(runs, name: str, poll: float | None) -> int:
    """The driver as ``cockpit sweep --resume NAME`` in its own session (setsid: no SIGHUP when the
    terminal drops), its output in the sweep dir's driver.log; its pid."""
    import subprocess

    from cockpit.sweep.driver import sweep_dir

    # -P: the installed cockpit, whatever the working folder holds (a cockpit/ folder: the clone's parent)
    argv = [sys.executable, "-P", "-m", "cockpit.cli", "sweep", "--resume", name, "--runs-dir", str(runs)]
    with open(sweep_dir(runs, name) / "driver.log", "ab", buffering=0) as log:
        proc = subprocess.Popen(
            [*argv, *(["--poll", str(poll)] if poll else [])],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    return proc.pid


def show_status(args: argparse.Namespace, name: str) -> int:
    from cockpit.sweep.driver import status

    st = status(runs_dir(args), name)
    if args.json:
        print(json.dumps(st, indent=1, default=str))
    else:
        print_table(st)
    return EXIT_OK


def print_table(st: dict) -> None:
    keys = sorted({k for t in st["trials"] for k in t["params"]})
    print(
        f"sweep {st['name']}: {st['objective']} ({st['direction']}), {len(st['trials'])}/{st['trials_budget']} trials"
    )
    head = f"{'#':>3} {'STATE':9} {'STEPS':>5} {st['objective'][:12]:>12} " + " ".join(f"{k[:14]:>14}" for k in keys)
    print(head + "  RUN")
    for t in st["trials"]:
        obj = "-" if t["objective"] is None else f"{t['objective']:.4g}"
        vals = " ".join(f"{_cell(t['params'].get(k)):>14}" for k in keys)
        print(
            f"{t['number']:>3} {t['state']:9} {t['steps'] if t['steps'] is not None else '-':>5} {obj:>12} {vals}  {t['run_id'] or '-'}"
        )
    b = st["best"]
    if b:
        print(
            f"best: trial {b['number']}, {st['objective']} {b['value']:.4g} ("
            + ", ".join(f"{k}={_cell(v)}" for k, v in b["params"].items())
            + ")"
        )
        if b.get("tie"):
            print(f"  {b['tie']}")
    else:
        print("best: none yet (no trial completed)")
    imp = st.get("importance")
    if imp:
        print("importance: " + ", ".join(f"{k} {v:.2f}" for k, v in imp["params"].items()))


def _cell(v) -> str:
    from cockpit.cells import value_text

    return value_text(v)


def show_best(args: argparse.Namespace, name: str) -> int:
    from cockpit.sweep.driver import best_preset

    best, tie, text = best_preset(runs_dir(args), name)
    if args.save_preset:
        from pathlib import Path

        Path(args.save_preset).expanduser().write_text(text, encoding="utf-8")
    if args.json:
        print(
            json.dumps(
                {
                    "number": best.number,
                    "value": best.value,
                    "params": best.params,
                    "preset": args.save_preset,
                    "tie": tie,
                }
            )
        )
    elif args.save_preset:
        print(f"trial {best.number} ({best.value:.4g}) saved as {args.save_preset}" + (f"; {tie}" if tie else ""))
    else:
        print(text, end="")
    return EXIT_OK
