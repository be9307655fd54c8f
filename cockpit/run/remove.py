"""Deleting runs (``cockpit rm`` and ``cockpit prune``): which runs may go, what each frees, the deletion.

A run is deleted only in a terminal state (finished, failed, stopped, lost, cancelled), checked
with the scheduler's word and the liveness check (:func:`cockpit.run.liveness.reconcile`) when the
plan is made and again just before its folder goes. The run dir goes whole: checkpoints, adapter,
merged / export folders, logs. An ``output_dir`` outside the run dir is the user's folder: it is
kept and said so, unless the caller asks for it (``with_output_dir``), and even then not when it
holds the working dir, the runs dir or the home folder, or another kept run writes there.
No torch, no textual.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cockpit.store.rundir import TERMINAL_STATES, RunDir


@dataclass
class Removal:
    """One run to delete (or refused): what it frees, and what happens to an outside output_dir."""

    run: RunDir
    state: str | None
    bytes: int = 0
    parts: dict[str, int] = field(default_factory=dict)  # top-level folders of the run dir, and "files"
    output_dir: Path | None = None  # only an output_dir outside the run dir
    output_bytes: int | None = None
    delete_output: bool = False
    output_note: str | None = None  # why the outside output_dir is kept
    refused: str | None = None  # why the run is not deleted
    deleted: bool = False  # the run dir is gone
    output_deleted: bool = False  # the outside output_dir is gone
    error: str | None = None  # why the run dir could not be deleted
    output_error: str | None = None  # why the outside output_dir could not be deleted (the run dir went)

    def frees(self) -> int:
        """Bytes deleting it frees: the run dir, and the outside output_dir when that goes too."""
        return self.bytes + ((self.output_bytes or 0) if self.delete_output else 0)

    def freed(self) -> int:
        """Bytes the deletion did free: the run dir when it went, the output_dir when it went."""
        return (self.bytes if self.deleted else 0) + ((self.output_bytes or 0) if self.output_deleted else 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run.run_id,
            "run_dir": str(self.run.path),
            "state": self.state,
            "bytes": self.bytes,
            "parts": self.parts,
            "output_dir": str(self.output_dir) if self.output_dir else None,
            "output_dir_bytes": self.output_bytes,
            "output_dir_deleted": self.output_deleted,
            "output_dir_note": self.output_note,
            "output_dir_error": self.output_error,
            "refused": self.refused,
            "deleted": self.deleted,
            "error": self.error,
        }


def disk_usage(path: Path) -> int:
    """Bytes on disk under ``path`` (allocated blocks, each hard-linked file once, links not followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [path]
    while stack:
        p = stack.pop()
        try:
            st = p.lstat()
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        total += st.st_blocks * 512
        if p.is_dir() and not p.is_symlink():
            try:
                stack.extend(p.iterdir())
            except OSError:
                pass
    return total


def parts_of(run_dir: Path) -> dict[str, int]:
    """Bytes per top-level folder of the run dir (``merged``, ``checkpoints``, ...); its files as ``files``."""
    parts: dict[str, int] = {}
    for entry in sorted(run_dir.iterdir()):
        key = entry.name if entry.is_dir() and not entry.is_symlink() else "files"
        parts[key] = parts.get(key, 0) + disk_usage(entry)
    return parts


def current_statuses(runs: list[RunDir]) -> dict[str, dict[str, Any]]:
    """Each run's state as every reader sees it: the scheduler's word, then the liveness check."""
    from cockpit.run.liveness import reconcile
    from cockpit.slurm.queue import effective_statuses

    statuses = effective_statuses(runs, fresh=True)
    return {r.run_id: reconcile(r, status=statuses[r.run_id]) for r in runs}


def refusal(state: str | None, run_id: str) -> str | None:
    if state in TERMINAL_STATES:
        return None
    return f"{state or 'unknown state'}: stop it first (cockpit stop {run_id} --wait 60)"


def outside_output_dir(run: RunDir, status: dict[str, Any]) -> Path | None:
    """The run's output_dir when it is outside its run dir (an inside one goes with the run dir)."""
    out = status.get("output_dir")
    if not out:
        return None
    out_path = Path(out).expanduser().resolve()
    return None if out_path.is_relative_to(run.path.resolve()) else out_path


def output_dir_guard(out: Path, runs_dir: Path, kept_outputs: Iterable[Path]) -> str | None:
    """Why an outside output_dir must stay even when asked for, or None."""
    for what, p in (("the working dir", Path.cwd()), ("the runs dir", runs_dir), ("the home folder", Path.home())):
        p = p.expanduser().resolve()
        if p == out or p.is_relative_to(out):
            return f"it holds {what} ({p}); delete it yourself"
    for other in kept_outputs:
        if other == out or other.is_relative_to(out) or out.is_relative_to(other):
            return f"a run that stays writes to {other}"
    return None


def plan(
    runs: list[RunDir],
    statuses: dict[str, dict[str, Any]],
    *,
    runs_dir: Path,
    with_output_dir: bool,
    others: Iterable[RunDir] = (),
) -> list[Removal]:
    """What deleting ``runs`` does; ``others``: the runs that stay (their output_dirs are kept)."""
    kept_outputs = [o for r in others if (o := outside_output_dir(r, r.read_status())) is not None]
    out: list[Removal] = []
    for run in runs:
        status = statuses[run.run_id]
        item = Removal(run=run, state=status.get("state"), refused=refusal(status.get("state"), run.run_id))
        item.parts = parts_of(run.path)
        item.bytes = sum(item.parts.values())
        item.output_dir = outside_output_dir(run, status)
        if item.output_dir is not None and item.output_dir.exists():
            item.output_bytes = disk_usage(item.output_dir)
            if not item.output_dir.is_dir():  # a file of the user's: never offered, never deleted
                item.output_note = "not a folder (not the run's output); never deleted here"
                out.append(item)
                continue
            guard = output_dir_guard(item.output_dir, runs_dir, kept_outputs)
            item.delete_output = with_output_dir and guard is None
            if not item.delete_output:
                item.output_note = guard if with_output_dir else "outside the run dir; --with-output-dir deletes it too"
        out.append(item)
    return out


def delete(item: Removal) -> None:
    """Delete one planned run (its state checked again first); sets ``deleted`` / ``refused`` / ``error``."""
    state = current_statuses([item.run])[item.run.run_id].get("state")
    item.refused = refusal(state, item.run.run_id)
    if item.refused:
        return
    try:
        item.run.status_path.unlink(missing_ok=True)  # a half-deleted folder is no longer listed as a run
        shutil.rmtree(item.run.path)
    except OSError as exc:
        item.error = f"{exc.strerror or exc}: {exc.filename or item.run.path}"
        return
    item.deleted = True
    out = item.output_dir
    if not item.delete_output or out is None:
        return
    if out.is_symlink() or not out.is_dir():  # it changed since the plan: never a user's file
        item.output_error = f"not a folder now: {out}; kept"
        return
    try:
        shutil.rmtree(out)
    except OSError as exc:
        item.output_error = f"{exc.strerror or exc}: {exc.filename or out}"
        return
    item.output_deleted = True


def age_days(status: dict[str, Any], run: RunDir, now: float | None = None) -> float:
    """Days since the run ended (else since its last status update, its start, its folder's mtime)."""
    when = status.get("ended") or status.get("updated") or status.get("started") or run.path.stat().st_mtime
    return ((time.time() if now is None else now) - float(when)) / 86400


def select(
    runs: list[RunDir],
    statuses: dict[str, dict[str, Any]],
    states: Iterable[str],
    older_than_days: float | None,
    now: float | None = None,
) -> list[RunDir]:
    """The terminal runs in one of ``states`` that ended ``older_than_days`` ago or more."""
    wanted = set(states) & TERMINAL_STATES
    return [
        r
        for r in runs
        if statuses[r.run_id].get("state") in wanted
        and (older_than_days is None or age_days(statuses[r.run_id], r, now) >= older_than_days)
    ]


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
