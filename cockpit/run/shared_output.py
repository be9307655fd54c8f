"""One output folder, one writer: a run whose ``output_dir`` another run of the runs dir writes (or
will write) is refused before any run dir exists, naming that run.

Two runs in one folder overwrite each other's checkpoints and adapter (a queued run and a run
started by hand, both with LLaMA-Factory's ``output_dir: saves/smol/lora/sft`` and
``overwrite_output_dir: true``): the adapter left there is the last one's, whatever the first run's
summary says. ``cockpit check``, ``cockpit train`` (``--slurm`` too) and ``cockpit queue add`` ask
:func:`refuse_shared_output` with the config's resolved ``output_dir`` (made absolute where the command
runs, :func:`cockpit.config.load`), against:

- every run of the runs dir still active or waiting (starting, running, stopping; a Slurm run
  queued), by status.json ``output_dir`` (a run without one writes its run dir), the scheduler's
  word and the liveness check applied first, as every reader does;
- every queue entry not started yet, by the ``output_dir`` ``cockpit queue add`` recorded.

A later run in the folder of an *ended* run is the user's choice (``overwrite_output_dir``); the
ended run's readers then say its adapter is no longer its own (:mod:`cockpit.store.output_mark`).
No torch, no textual.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.errors import InputError, Problem
from cockpit.store.output_mark import read_mark
from cockpit.store.rundir import TERMINAL_STATES, RunDir, list_runs

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def _same(a: str | Path, b: str | Path) -> bool:
    return os.path.realpath(os.path.expanduser(str(a))) == os.path.realpath(os.path.expanduser(str(b)))


def active_writers(runs_dir: Path, output_dir: str | Path, skip: str | None = None) -> list[str]:
    """Who else writes ``output_dir``: one phrase per active (or Slurm-queued) run (but ``skip``) and
    per queue entry not started yet, with what to do about it."""
    from cockpit.run.queue import read_queue
    from cockpit.run.remove import current_statuses

    runs = [
        r
        for r in list_runs(runs_dir)
        if r.run_id != skip
        and (st := r.read_status()).get("state") not in TERMINAL_STATES
        and _same(st.get("output_dir") or r.path, output_dir)
    ]
    found = [
        f"run {run_id} ({st.get('state')}; stop it first: cockpit stop {run_id})"
        for run_id, st in current_statuses(runs).items()
        if st.get("state") not in TERMINAL_STATES
    ]
    for e in read_queue(Path(runs_dir))["entries"]:
        if e.get("state") in ("queued", "launching") and e.get("output_dir") and _same(e["output_dir"], output_dir):
            found.append(f"queue entry {e['id']} ({e['config']}; take it out: cockpit queue rm {e['id']})")
    return found


def shared_output_problem(cfg: RunConfig, runs_dir: Path, config_path: str | None = None) -> Problem | None:
    """The problem of a config whose ``output_dir`` another run writes (at its line of
    ``config_path``); None when it has its own."""
    if not cfg.output_dir:
        return None  # the run's own run dir
    others = active_writers(runs_dir, cfg.output_dir)
    if not others:
        return None
    return Problem(
        f"{cfg.output_dir} is also the output_dir of {', '.join(others)}: two runs in one folder overwrite "
        "each other's checkpoints and adapter; choose another output_dir",
        key="output_dir",
        **_where(config_path, cfg.output_dir),
    )


def _where(config_path: str | None, output_dir: str) -> dict[str, Any]:
    """The config file and the line of its ``output_dir``, when that is where the value came from
    (not ``--set`` or a LLaMA-Factory flag)."""
    if not config_path:
        return {}
    from cockpit.config.load import read_yaml

    try:
        raw, lines = read_yaml(config_path)
    except InputError:
        return {}
    value = raw.get("output_dir")
    if not value or "output_dir" not in lines or not _same(Path.cwd() / Path(str(value)).expanduser(), output_dir):
        return {}
    return {"file": str(config_path), "line": lines["output_dir"]}


def refuse_shared_output(cfg: RunConfig, runs_dir: Path, config_path: str | None = None) -> None:
    """Raise InputError (key ``output_dir``) when another run writes the config's ``output_dir``."""
    if problem := shared_output_problem(cfg, runs_dir, config_path):
        raise InputError(problem)


def resume_refusal(run: RunDir, output_dir: str | None) -> str | None:
    """Why ``run`` may not resume in its ``output_dir``: another run writes it now, or has written
    there since (the folder's mark names it: its checkpoints are not all this run's); None when it may."""
    if not output_dir:
        return None
    others = active_writers(run.path.parent, output_dir, skip=run.run_id)
    if others:
        return f"its output_dir {output_dir} is also the output_dir of {', '.join(others)}"
    other = read_mark(Path(output_dir)).get("run_id")
    if other and other != run.run_id:
        return (
            f"run {other} has written into its output_dir {output_dir} since: the checkpoints there are not "
            f"all {run.run_id}'s; train it again instead"
        )
    return None
