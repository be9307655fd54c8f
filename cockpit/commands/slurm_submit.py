"""The ``--slurm`` part of ``cockpit train``: its options and the submission. No torch.

``cockpit train CONFIG --slurm [--partition P] [--time T] [--account A] [--qos Q] [--nodes N]
[--cpus-per-task C] [--no-exclusive] [--sbatch-arg=--constraint=mi300x ...]``: the run exists at
once in state ``queued`` with the job id; sbatch's refusal is printed verbatim (exit 2).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import TYPE_CHECKING

from cockpit.errors import InputError

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Slurm (with --slurm: submit the run as a batch job instead of starting it here)")
    g.add_argument(
        "--slurm", action="store_true", help="write the job script into a new run dir and submit it with sbatch"
    )
    g.add_argument("--partition", default=None, help="sbatch --partition")
    g.add_argument("--time", default=None, help="sbatch --time (e.g. 4:00:00)")
    g.add_argument("--account", default=None, help="sbatch --account")
    g.add_argument("--qos", default=None, help="sbatch --qos")
    g.add_argument("--nodes", type=int, default=None, help="nodes (the config's nnodes)")
    g.add_argument("--cpus-per-task", type=int, default=None, help="sbatch --cpus-per-task (one task per node)")
    g.add_argument(
        "--no-exclusive", dest="exclusive", action="store_false", help="share the nodes (no sbatch --exclusive)"
    )
    g.add_argument(
        "--sbatch-arg",
        dest="sbatch_args",
        action="append",
        default=[],
        metavar="OPT",
        help="any other sbatch option, e.g. --sbatch-arg=--constraint=mi300x (repeatable)",
    )


def overrides(args: argparse.Namespace) -> list[str]:
    """Config overrides the Slurm options imply: ``--nodes N`` is ``nnodes=N``; several nodes
    without a ``master_port`` get one fixed now (every node's rendezvous uses it)."""
    if not getattr(args, "slurm", False):
        return []
    out = [f"nnodes={args.nodes}"] if args.nodes is not None else []
    given = _given(args)
    nnodes = args.nodes if args.nodes is not None else given.get("nnodes", 1)
    try:
        several, port = int(nnodes) > 1, int(given.get("master_port") or 0)
    except (TypeError, ValueError):
        return out  # the config's validation says what is wrong
    if several and not port:
        out.append(f"master_port={random.randint(20000, 39999)}")
    return out


def _given(args: argparse.Namespace) -> dict:
    """nnodes / master_port as the config file and --set give them (before validation)."""
    import yaml

    try:
        with open(args.config, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh) or {}
    except (OSError, ValueError, yaml.YAMLError):
        raw = {}
    raw = raw if isinstance(raw, dict) else {}
    for item in args.overrides:
        key, _, value = item.partition("=")
        raw[key.strip()] = value.strip()
    return raw


def submit(args: argparse.Namespace, cfg: RunConfig, runs_dir) -> int:
    from cockpit.commands.common import EXIT_INPUT, EXIT_OK, print_input_error
    from cockpit.run.slurm_submit import SubmitRefused
    from cockpit.run.slurm_submit import submit as do_submit
    from cockpit.slurm.script import SlurmOptions

    opts = SlurmOptions(
        partition=args.partition,
        time=args.time,
        account=args.account,
        qos=args.qos,
        cpus_per_task=args.cpus_per_task,
        exclusive=args.exclusive,
        extra=tuple(args.sbatch_args),
    )
    try:
        run, job = do_submit(cfg, opts, config_path=args.config, runs_dir=runs_dir)
    except InputError as err:
        return print_input_error(err)
    except SubmitRefused as exc:
        print(f"cockpit: sbatch refused the job:\n{exc}", file=sys.stderr)
        return EXIT_INPUT
    if getattr(args, "json", False):
        print(json.dumps({"run_id": run.run_id, "run_dir": str(run.path), "job_id": job}))
    else:
        print(
            f"run {run.run_id} queued as Slurm job {job}\nrun dir: {run.path}\njob script: {run.path / 'slurm' / 'job.sh'}\n"
            f"queue: cockpit runs · follow it: cockpit attach {run.run_id} · cancel: cockpit stop {run.run_id}"
        )
    return EXIT_OK
