"""``cockpit resume RUN [--set k=v ...] [--stop [--wait S]] [--detach]``: continue a stopped,
failed or lost run from its last good checkpoint, as a new attempt of the same run (same run dir, event
log appended; step numbers, learning-rate schedule and data order continue from the checkpoint).

``--set key=value`` changes the config for the new attempt (typed and checked by the schema;
``env`` entries are added to the config's env, not replacing it). Keys that decide the shape of
the checkpoint (model, method, adapter shape, strategy, ranks) cannot change. The change is
recorded: the previous ``config.yaml`` is kept as ``config.attempt<N>.yaml``, ``status.json``
gets ``config_changes``, and the attempt's ``state`` event carries them.

``--stop``: the run is still going: ask it to save and stop at the next step boundary, wait
(``--wait``, default 600 s) until it has, then resume. This is the Live screen's memory-pressure
key (half micro-batch, double accumulation; or the allocator's ``expandable_segments``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from cockpit.commands.common import EXIT_OK, add_runs_dir, find_run, print_input_error
from cockpit.errors import InputError, Problem
from cockpit.redact import redact_env, secret_values, unredacted
from cockpit.store.events import EventWriter
from cockpit.store.rundir import TERMINAL_STATES, RunDir, atomic_write_text

# what a checkpoint's shape depends on: changing one of these is a new run, not a resume
FIXED_ON_RESUME = frozenset(
    {
        "model_name_or_path",
        "adapter_name_or_path",
        "stage",
        "finetuning_type",
        "lora_rank",
        "lora_alpha",
        "lora_target",
        "quantization_bit",
        "freeze_trainable_layers",
        "nproc_per_node",
        "nnodes",
        "node_rank",
        "deepspeed",
        "zero_stage",
        "fsdp",
        "output_dir",
        "resume_from_checkpoint",
        "dataset",
        "dataset_dir",
        "template",
        "cutoff_len",
        "seed",
    }
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run")
    add_runs_dir(p)
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a config key for the new attempt (repeatable; env entries are merged)",
    )
    p.add_argument("--stop", action="store_true", help="the run is still going: stop it at a checkpoint first")
    p.add_argument(
        "--wait", type=float, default=600.0, metavar="S", help="with --stop: how long to wait for the stop (s)"
    )
    p.add_argument("--detach", action="store_true")
    p.add_argument("--json", action="store_true")


def changed_config(saved: Mapping[str, Any], overrides: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(new config, {key: new value}) with ``--set`` items applied and validated by the schema."""
    from cockpit.config.load import parse_overrides, validate

    wanted = parse_overrides(overrides)
    fixed = sorted(set(wanted) & FIXED_ON_RESUME)
    if fixed:
        raise InputError(
            f"--set {', '.join(fixed)}: cannot change on resume (the checkpoint depends on it); start a new run"
        )
    raw = dict(saved)
    if isinstance(wanted.get("env"), dict):
        wanted["env"] = {**(saved.get("env") or {}), **wanted["env"]}
    raw.update(wanted)
    try:
        new = validate(raw, file="--set", check_paths=False)
    except InputError as err:
        for p in err.problems:
            p.file = "--set"
        raise InputError(err.problems) from None
    resolved = new.keys_only()
    changes = {k: resolved[k] for k in wanted if resolved.get(k) != saved.get(k)}
    return new.keys_only(), changes


def paused_s(status: dict) -> float | None:
    """The seconds the run has sat ended between its attempts, this pause (since ``ended``) included."""
    before = float(status.get("paused_s") or 0.0)
    if not status.get("ended"):
        return before or None
    return round(before + max(0.0, time.time() - float(status["ended"])), 3)


def stop_first(run_dir: RunDir, wait_s: float) -> None:
    """Ask a running run to save and stop; wait until it has (InputError when it does not)."""
    from cockpit.run.liveness import reconcile

    if reconcile(run_dir).get("state") in TERMINAL_STATES:
        return
    run_dir.request("stop", "cockpit resume --stop")
    deadline = time.time() + wait_s
    while time.time() < deadline:
        if reconcile(run_dir).get("state") in TERMINAL_STATES:
            return
        time.sleep(0.2)
    raise InputError(f"run {run_dir.run_id} did not stop within {wait_s:g} s (it may be hung: `cockpit stop --kill`)")


def run(args: argparse.Namespace) -> int:
    from cockpit.config.run_config import RunConfig
    from cockpit.run.launch import outside_queue_gpus, record_supervisor, spawn_supervisor
    from cockpit.run.liveness import reconcile
    from cockpit.run.shared_output import resume_refusal
    from cockpit.train.arguments import artefact_dirs
    from cockpit.train.outcome import last_checkpoint

    try:
        run_dir = find_run(args)
        saved = yaml.safe_load(run_dir.config_path.read_text(encoding="utf-8"))
        new_raw, changes = changed_config(saved, args.overrides) if args.overrides else (saved, {})
        if args.stop:
            stop_first(run_dir, args.wait)
        status = reconcile(run_dir)  # a run whose supervisor died is lost (or adopted) first
        if status.get("state") not in TERMINAL_STATES - {"finished"}:
            raise InputError(
                f"run {run_dir.run_id} is {status.get('state')}; only a stopped, failed or lost run can be resumed"
            )
        if why := resume_refusal(run_dir, saved.get("output_dir")):  # another run writes (or wrote) there
            raise InputError(Problem(why, key="output_dir"))
        ckpt = last_checkpoint(artefact_dirs(run_dir, RunConfig.from_resolved(saved))["checkpoints"])
        if ckpt is None:
            raise InputError(f"run {run_dir.run_id} has no complete checkpoint to resume from")
    except InputError as err:
        return print_input_error(err)
    attempt = int(status.get("attempt") or 1) + 1
    if changes:
        atomic_write_text(
            run_dir.path / f"config.attempt{attempt - 1}.yaml", run_dir.config_path.read_text(encoding="utf-8")
        )
    new_raw["resume_from_checkpoint"] = ckpt
    # Secrets are written down nowhere: config.yaml, the state event, status.json and stdout get
    # them redacted; the supervisor gets the --set values through its environment.
    secrets = secret_values(new_raw.get("env"))
    written = {**new_raw, "env": redact_env(new_raw.get("env"))} if new_raw.get("env") else new_raw
    atomic_write_text(run_dir.config_path, yaml.safe_dump(written, sort_keys=False, allow_unicode=True))
    changes = {k: (redact_env(v) if k == "env" else v) for k, v in changes.items()}
    said = f" with {', '.join(f'{k}={v}' for k, v in changes.items())}" if changes else ""
    EventWriter(run_dir.events_path).emit(
        "state",
        state="starting",
        reason=f"resume attempt {attempt} from {Path(ckpt).name}{said}",
        config_changes=changes,
    )
    offset = run_dir.events_path.stat().st_size  # the new attempt's events start here
    run_dir.update_status(
        state="starting",
        reason=None,
        attempt=attempt,
        resumed_from=ckpt,
        paused_s=paused_s(status),  # the time it sat ended counts in no TIME (store.rundir.running_s)
        ended=None,
        log_tail=[],
        config_changes=changes or None,
        supervisor_pid=None,
        supervisor_start=None,
        procs=[],
        pids=[],
        rank_pids={},
        events_offset=offset,
        exit_code=None,
        gpus=outside_queue_gpus(
            RunConfig.from_resolved(new_raw)
        ),  # resumed outside the queue: the GPUs it takes (None: all)
    )
    for f in ("stop", "kill", "save"):
        (run_dir.control_dir / f).unlink(missing_ok=True)
    # Secrets were redacted from config.yaml: from --set, else from this environment again.
    record_supervisor(run_dir, spawn_supervisor(run_dir, {**unredacted(new_raw.get("env")), **secrets}))
    if args.detach:
        print(
            json.dumps(
                {
                    "run_id": run_dir.run_id,
                    "run_dir": str(run_dir.path),
                    "attempt": attempt,
                    "checkpoint": ckpt,
                    "config_changes": changes,
                }
            )
            if args.json
            else f"run {run_dir.run_id}: attempt {attempt} from {ckpt}{said}"
        )
        return EXIT_OK
    from cockpit.commands.train import follow_interactively

    return follow_interactively(run_dir)
