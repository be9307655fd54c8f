"""The run directory: the only contract between the UI, the supervisor and the ranks.

Layout (see ARCHITECTURE.md)::

    <runs_dir>/<run_id>/            0700, never reused
        config.yaml                 resolved config (defaults filled, secrets redacted)
        events.jsonl                append-only event log (cockpit.store.events)
        status.json                 written atomically: state, pids, step, total_steps, ...
        summary.json                at the end
        logs/supervisor.log         the supervisor's own output
        logs/rank<N>.log            each rank's stdout+stderr (files, never pipes)
        control/                    requests to the run: 'stop', 'save' (files, 0600)
        checkpoints/ adapter/ loss.png   unless output_dir points elsewhere

No torch, no textual here.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# checkpoints are written under checkpoints/.staging/ and renamed into place when complete
CHECKPOINT_STAGING = ".staging"

TERMINAL_STATES = frozenset(
    {"finished", "failed", "stopped", "killed", "lost", "cancelled"}
)  # killed: by a kill request (no checkpoint at the end); cancelled: by the scheduler (cockpit.slurm)
ACTIVE_STATES = frozenset(
    {"starting", "running", "stopping"}
)  # queued (Slurm) waits on the scheduler: cockpit.slurm.queue

# status.json's read-modify-write lock: an flock on RUN_DIR/.status.lock, re-entrant within a
# process (flock locks belong to an open file description: a second open in the same process
# would wait for itself). path -> [fd, depth]
_held: dict[str, list[int]] = {}
_held_guard = threading.RLock()


def running_s(status: dict[str, Any], now: float) -> float | None:
    """How long the run has run (the TIME of ``cockpit runs`` and the Runs screen): from ``started`` to
    ``ended`` (now while it runs), the pauses between its attempts (``paused_s``, added by ``cockpit
    resume``) left out; None before it started."""
    started = status.get("started")
    if not started:
        return None
    return max(0.0, (status.get("ended") or now) - started - float(status.get("paused_s") or 0.0))


def default_runs_dir() -> Path:
    env = os.environ.get("COCKPIT_RUNS_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "cockpit" / "runs"


def cache_dir() -> Path:
    env = os.environ.get("COCKPIT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cockpit"


def atomic_write_text(path: Path, text: str, mode: int = 0o600) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


def _slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return slug[:40] or "run"


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def status_path(self) -> Path:
        return self.path / "status.json"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def control_dir(self) -> Path:
        return self.path / "control"

    def rank_log(self, rank: int) -> Path:
        return self.logs_dir / f"rank{rank}.log"

    @property
    def supervisor_log(self) -> Path:
        return self.logs_dir / "supervisor.log"

    # -- status -------------------------------------------------------------------------
    def read_status(self) -> dict[str, Any]:
        try:
            return json.loads(self.status_path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return {}

    @contextmanager
    def status_lock(self) -> Iterator[None]:
        """Hold the run's status lock (flock on ``.status.lock``; re-entrant in this process).

        The supervisor is status.json's writer while it lives; launch/resume (before a
        supervisor exists) and the liveness check (after it died) write under this lock too,
        so no read-modify-write loses another's fields."""
        import fcntl

        key = str(self.path / ".status.lock")
        with _held_guard:
            held = _held.get(key)
            if held is not None:
                held[1] += 1
            else:
                fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
                _held[key] = [fd, 1]
            try:
                yield
            finally:
                held = _held[key]
                held[1] -= 1
                if held[1] == 0:
                    del _held[key]
                    fcntl.flock(held[0], fcntl.LOCK_UN)
                    os.close(held[0])

    def update_status(self, **fields: Any) -> dict[str, Any]:
        with self.status_lock():
            status = self.read_status()
            status.update(fields)
            status["updated"] = round(time.time(), 3)
            atomic_write_json(self.status_path, status)
            return status

    def read_summary(self) -> dict[str, Any]:
        try:
            return json.loads(self.summary_path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return {}

    # -- control requests (files in control/, 0600) ----------------------------------------
    def request(self, what: str, detail: str = "") -> Path:
        if what not in {"stop", "save", "kill"}:
            raise ValueError(f"unknown request {what!r}")
        self.control_dir.mkdir(mode=0o700, exist_ok=True)
        target = self.control_dir / what
        atomic_write_text(target, json.dumps({"t": time.time(), "detail": detail}) + "\n", mode=0o600)
        if what == "stop":  # said at once in the event log (attach, Live); the supervisor shows it as "stopping"
            self.note_stop_requested(detail)
        return target

    def note_stop_requested(self, detail: str) -> None:
        """The ``stop_requested`` event: who asked (``by``); not written into a run dir without an event log."""
        from cockpit.store.events import EventWriter

        if not self.events_path.exists():
            return
        try:
            with EventWriter(self.events_path) as writer:
                writer.emit("stop_requested", by=detail or None)
        except OSError:
            pass  # a full disk: the control file still stops the run

    def pending(self, what: str) -> bool:
        return (self.control_dir / what).exists()

    def consume(self, what: str) -> bool:
        """Take a request once (rename it away); True when it was there."""
        src = self.control_dir / what
        try:
            os.replace(src, self.control_dir / f"{what}.done")
            return True
        except FileNotFoundError:
            return False

    # -- where artefacts go -----------------------------------------------------------------
    def output_dir(self) -> Path:
        status = self.read_status()
        out = status.get("output_dir")
        return Path(out) if out else self.path


def run_name(config_path: str | None, name: str | None, model_name_or_path: str | None) -> str:
    """A new run dir's name: the config's ``run_name`` (``name``), else the config file's stem, else the
    model's last path part."""
    if name:
        return str(name)
    if config_path:
        return Path(config_path).stem
    model = str(model_name_or_path or "run")
    return re.sub(r".*/", "", model)


def create_run_dir(runs_dir: str | os.PathLike[str], name: str = "run") -> RunDir:
    """Make a new, unique run dir (0700), named by its absolute path (the supervisor and the ranks
    run in it: a relative one would name a folder inside itself). Never reuses an existing one."""
    runs = Path(runs_dir).expanduser().resolve()
    runs.mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for _ in range(100):
        run_id = f"{stamp}-{_slug(name)}-{secrets.token_hex(2)}"
        path = runs / run_id
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
        for sub in ("logs", "control"):
            (path / sub).mkdir(mode=0o700)
        return RunDir(path)
    raise RuntimeError(f"could not create a unique run dir under {runs}")


def list_runs(runs_dir: str | os.PathLike[str]) -> list[RunDir]:
    runs = Path(runs_dir).expanduser()
    if not runs.is_dir():
        return []
    found = [RunDir(p) for p in runs.iterdir() if p.is_dir() and (p / "status.json").exists()]
    return sorted(found, key=lambda r: r.run_id)


def resolve_run(ref: str, runs_dir: str | os.PathLike[str] | None = None) -> RunDir:
    """A run by path, exact id, or unique id prefix/suffix; raises LookupError."""
    candidate = Path(ref).expanduser()
    if candidate.is_dir() and (candidate / "status.json").exists():
        return RunDir(candidate.resolve())
    runs = list_runs(runs_dir or default_runs_dir())
    exact = [r for r in runs if r.run_id == ref]
    if exact:
        return exact[0]
    matches = [r for r in runs if r.run_id.startswith(ref) or r.run_id.endswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if ref in {"last", "latest"} and runs:
        return max(runs, key=lambda r: r.path.stat().st_mtime)
    if not matches:
        raise LookupError(f"no run {ref!r} in {runs_dir or default_runs_dir()}")
    raise LookupError(f"{ref!r} matches several runs: " + ", ".join(r.run_id for r in matches))
