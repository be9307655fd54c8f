"""The detached owner of a run: ``python -m cockpit.run.supervisor RUN_DIR``.

Started by :func:`cockpit.run.launch.start_run` in its own session (``setsid``), so closing the
terminal, an SSH drop or killing tmux does not reach it. It:

- launches the ranks (1 process: the worker directly; several: ``torchrun``), each rank's
  stdout/stderr into ``logs/rank<N>.log`` (files, never pipes);
- follows the event log (steps for the hang watchdog, rank pids for telemetry);
- samples telemetry (``telemetry`` events, default 1 Hz) and the ranks' NCCL/RCCL output
  (``comm`` events);
- obeys ``control/kill`` (and SIGTERM): terminates the ranks' process group, no child left;
  ``stop``/``save`` are consumed by the ranks at step boundaries;
- writes the final state (finished / stopped / failed with the reason and the failing rank's
  last log lines) to ``status.json`` and the event log;
- runs the user's ``notify_command`` (``cockpit.run.notify``) when the run finishes or fails, hangs
  or hits a memory-pressure alert: in a thread, with a timeout, its failure logged, never the run's.

Imports neither torch nor textual.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import yaml

from cockpit.config.run_config import RunConfig
from cockpit.run import warm_start
from cockpit.run.notify import Notifier, configured_command, notification
from cockpit.run.runstate import attempt_outcome, final_state
from cockpit.run.watchdog import HangWatchdog
from cockpit.store.events import EventReader, EventWriter
from cockpit.store.node_grid import parse_ranges
from cockpit.store.rundir import ACTIVE_STATES, CHECKPOINT_STAGING, RunDir, atomic_write_json

POLL_S = 0.2
KILL_GRACE_S = 10.0


def rank_command(run: RunDir, cfg: RunConfig, python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The command that starts this node's ranks, and the env additions.

    Built by :func:`cockpit.strategy.launch.node_launch` (torchrun + c10d, NUMA wrapping), which
    ``cockpit preview`` shows; the plan is recorded in ``launch.json`` in the run dir.
    """
    from cockpit.strategy.launch import node_launch, write_record

    launch = node_launch(run.path, run.run_id, cfg, python=python)
    write_record(run.path, launch, cfg)
    return launch.command, dict(launch.env_add)


def tail_lines(path: Path, n: int = 20) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [ln for ln in data.splitlines() if ln.strip()][-n:]


def describe_exit(code: int) -> str:
    if code < 0:
        sig = -code
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        hint = " (killed: out of memory, or killed by hand)" if sig == signal.SIGKILL else ""
        return f"killed by signal {name}{hint}"
    return f"exited with code {code}"


def node_watchdog(cfg: RunConfig, start_t: float) -> HangWatchdog:
    """The hang watchdog for this run: the step floor, the longer load timeout, every node's heartbeat."""
    interval = float(cfg.telemetry_interval_s or 0)
    return HangWatchdog(
        floor_s=float(cfg.hang_timeout_s or 300.0),
        start_t=start_t,
        load_timeout_s=float(cfg.load_timeout_s or 1800.0),
        expected_nodes=int(cfg.nnodes or 1) if interval > 0 else 1,  # no heartbeats with telemetry off
        heartbeat_silent_s=max(10.0, 10 * interval),  # ten missed reports
    )


def observe_progress(watchdog: HangWatchdog, ev: dict[str, Any]) -> None:
    """A ``heartbeats`` (nodes alive, at their steps; a ``heartbeat`` of one node in older logs), ``train_end`` (training over),
    ``predict_progress`` (prediction samples generated) or ``progress`` after training (probes,
    held-out pairs) event: after training, the load timeout counts again from the last of them."""
    t = float(ev.get("t") or time.time())
    if ev.get("kind") == "progress":
        if ev.get("phase") == "after":
            watchdog.observe_train_end(t)
    elif ev.get("kind") in ("train_end", "predict_progress"):
        watchdog.observe_train_end(t)
    elif ev.get("kind") == "heartbeats":  # many nodes at once (cockpit/store/node_grid.py)
        hosts = ev.get("hosts") or {}
        for step, nodes in ev.get("steps") or []:
            for node in parse_ranges(nodes):
                watchdog.observe_heartbeat(node, t, host=hosts.get(str(node)), step=step)
    else:
        watchdog.observe_heartbeat(int(ev.get("node_rank") or 0), t, host=ev.get("host"), step=ev.get("step"))


def node_torch_devices(mem: Any, node_rank: int) -> list[dict[str, Any]]:
    """This node's devices from the ranks' ``step`` figures (torch's ``mem_get_info``), one per index."""
    found: dict[Any, dict[str, Any]] = {}
    for m in (mem or {}).values() if isinstance(mem, dict) else ():
        if isinstance(m, dict) and isinstance(m.get("device"), dict) and int(m.get("node_rank") or 0) == node_rank:
            found.setdefault(m["device"].get("index"), m["device"])
    return [found[k] for k in sorted(found, key=str)]


class Supervisor:
    def __init__(self, run: RunDir):
        self.run = run
        self.cfg = RunConfig.from_resolved(yaml.safe_load(run.config_path.read_text(encoding="utf-8")))
        self.events = EventWriter(run.events_path)
        # only this attempt's events: a resumed run's log still holds the previous attempt's end
        # (its run_stopped / run_failed), which must not decide how this attempt ends
        try:
            start = run.events_path.stat().st_size
        except FileNotFoundError:
            start = 0
        self.events_offset = start
        self.reader = EventReader(run.events_path, offset=start)
        self.proc: subprocess.Popen | warm_start.WarmProcess | None = None
        self.procs: dict[int, float | None] = {}  # pid -> start time: the launcher and every rank
        self.launcher_pid: int | None = None
        self.adopted = False
        self.rank_pids: dict[int, int] = {}
        self.killing = False
        self.kill_reason: str | None = None
        self.kill_requested = False  # control/kill (a user's act): the run ends "killed", not "failed"
        self.worker_failure: dict[str, Any] | None = None
        self.stopped_event: dict[str, Any] | None = None
        self.stop_said = False  # the run is "stopping" (a stop was asked): said once
        self.finished_event: dict[str, Any] | None = None
        self.last_step = 0
        self.status_changes: dict[str, Any] = {}
        self.disk_full: str | None = None
        self.watchdog = node_watchdog(self.cfg, time.time())
        self.torch_devices: list[dict[str, Any]] = []  # this node's devices as its ranks' torch reported them
        self.node_rank = int(self.cfg.node_rank or 0)  # until the ranks say their group rank
        self.sampler: Any = None  # a cockpit.telemetry.Sampler once started (imported then)
        self.comm = None
        self.alerts: deque[dict[str, Any]] = deque(maxlen=20)
        self.comm_parsers: dict[int, Any] = {}
        self.comm_offsets: dict[int, int] = {}
        self.comm_last: tuple | None = None
        self.comm_next_t = 0.0
        self.last_lines: dict[int, str] = {}
        self.last_lines_t = 0.0
        command, wait = configured_command(run.path)
        self.notifier = Notifier(command, wait, str(run.path), say)
        self.replaying = False  # adopt() replays this attempt's events: their alerts were told already

    # -- writes that survive a full disk ----------------------------------------------------------
    def emit(self, kind: str, **fields: Any) -> None:
        try:
            self.events.emit(kind, **fields)
        except OSError as exc:
            self._write_failed(exc)

    def status(self, **fields: Any) -> None:
        try:
            self.run.update_status(**fields)
        except OSError as exc:
            self._write_failed(exc)

    def _write_failed(self, exc: OSError) -> None:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT) and self.disk_full is None:
            self.disk_full = f"no space left on the run dir's disk ({self.run.path})"
            self.request_kill(f"disk full: {self.disk_full}")

    # -- lifecycle ------------------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        from cockpit.run.liveness import start_time

        return {
            "supervisor_pid": os.getpid(),
            "supervisor_start": start_time(os.getpid()),
            "supervisor_host": socket.gethostname(),
        }

    def start(self) -> None:
        from cockpit.comm.flight import flight_env
        from cockpit.run.liveness import start_time

        cmd, env_add = rank_command(self.run, self.cfg)
        env = dict(os.environ)
        env.update(env_add)
        env["PYTHONUNBUFFERED"] = "1"
        env["COCKPIT_RUN_DIR"] = str(self.run.path)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.update(flight_env(env, self.run.logs_dir))  # flight recorder dumps into logs/ (docs/rocm.md item 10)
        single = "torch.distributed.run" not in cmd
        launcher_log = self.run.logs_dir / ("rank0.log" if single else "launcher.log")
        self.proc = warm_start.start(cmd, env, str(self.run.path), str(launcher_log)) if single else None
        if self.proc is None:
            if warm_start.last_refusal:  # a server was named and could not start it
                say(f"rank started cold: {warm_start.last_refusal}")
            out = open(launcher_log, "ab", buffering=0)
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(self.run.path),
                start_new_session=True,  # its own process group: killpg reaches every rank
                close_fds=True,
            )
            out.close()
        else:
            say(f"rank started warm: pid {self.proc.pid}, forked by the warm start server (${warm_start.ENV_VAR})")
        self.launcher_pid = self.proc.pid
        self.procs[self.proc.pid] = start_time(self.proc.pid)
        self.emit(
            "run_started",
            run_id=self.run.run_id,
            attempt=int(self.run.read_status().get("attempt", 1)),
            model=self.cfg.model_name_or_path,
            dataset=self.cfg.dataset,
            method=self.cfg.finetuning_type,
            world_size=self.cfg.world_size,
            nproc_per_node=int(self.cfg.nproc_per_node),
            nnodes=int(self.cfg.nnodes),
            output_dir=self.cfg.output_dir,
            supervisor_pid=os.getpid(),
            command=cmd,
        )
        self.status(
            state="running",
            **self._identity(),
            launcher_pid=self.proc.pid,
            pids=[self.proc.pid],
            procs=self._procs_list(),
            events_offset=self.events_offset,
        )
        self.emit("state", state="running", reason=None)
        self.emit("activity", text="starting the ranks (importing torch and transformers)")  # until they speak
        if self.run.pending("stop"):  # asked before this attempt's log began (its event is not read)
            self.stopping({"by": self._request_detail("stop")}, self.status_changes)
        self._init_telemetry()

    def adopt(self) -> bool:
        """Take over ranks whose supervisor died: replay this attempt's events (rank pids, steps,
        final events), then watch them as if they were ours. False when there is nothing to adopt."""
        from cockpit.run.liveness import is_alive, supervisor_alive

        status = self.run.read_status()
        if status.get("state") not in ACTIVE_STATES:
            return False
        if status.get("supervisor_pid") != os.getpid() and supervisor_alive(status):
            return False
        self.adopted = True
        self.events_offset = int(status.get("events_offset") or 0)
        self.reader = EventReader(self.run.events_path, offset=self.events_offset)
        self.procs = {int(pid): started for pid, started in status.get("procs") or [] if is_alive(pid, started)}
        self.launcher_pid = status.get("launcher_pid")
        self.last_step = int(status.get("step") or 0)
        self.replaying = True
        try:
            self.follow_events()
        finally:
            self.replaying = False
        if not self.procs:
            return False
        gone = (
            (status.get("adopted_from") or [None])[-1]
            if status.get("supervisor_pid") == os.getpid()
            else status.get("supervisor_pid")
        )
        self.status(state="running", **self._identity())
        self.emit(
            "state", state="running", reason=f"adopted by supervisor pid {os.getpid()} (supervisor pid {gone} was gone)"
        )
        self._init_telemetry()
        if self.sampler is not None and self.rank_pids:
            self.sampler.set_pids(dict(self.rank_pids))
        return True

    def _procs_list(self) -> list[list[Any]]:
        return [[pid, started] for pid, started in sorted(self.procs.items())]

    def ranks_running(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        from cockpit.run.liveness import is_alive

        return any(is_alive(pid, started) for pid, started in self.procs.items())

    def _init_telemetry(self) -> None:
        interval = float(self.cfg.telemetry_interval_s or 0)
        if interval <= 0:
            return
        try:
            from cockpit.telemetry import Sampler

            self.sampler = Sampler({}, interval_s=interval, threaded=True)  # a hung driver call never blocks the loop
        except Exception as exc:  # telemetry must never take a run down
            say(f"telemetry disabled: {exc}")

    def request_kill(self, reason: str, requested: bool = False) -> None:
        if not self.killing:
            self.killing = True
            self.kill_reason = reason
            self.kill_requested = requested
            self.kill_deadline = time.time() + KILL_GRACE_S
            self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        from cockpit.run.liveness import is_alive

        group = self.proc.pid if self.proc is not None else self.launcher_pid
        if group and (self.proc is not None or is_alive(group, self.procs.get(int(group)))):
            try:
                os.killpg(int(group), sig)
            except (ProcessLookupError, PermissionError):
                pass
        for pid, started in list(self.procs.items()):  # ranks that left the group (should not happen)
            if self.proc is not None and pid == self.proc.pid:
                continue
            if is_alive(pid, started):  # never a reused pid
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    # -- the loop ---------------------------------------------------------------------------------
    def follow_events(self) -> None:
        """Fold the ranks' new events; status.json changes (the ranks never write it) are
        collected and written once per tick by :meth:`flush_status`."""
        from cockpit.run.liveness import start_time

        changes = self.status_changes
        for ev in self.reader.read_new():
            kind = ev.get("kind")
            if kind == "rank_started":
                pid = int(ev["pid"])
                self.rank_pids[int(ev["rank"])] = pid
                # the rendezvous' group rank (join order), which the ranks' events use, not the config's node_rank
                self.node_rank = int(ev.get("node_rank") or 0)
                if pid not in self.procs and not self.adopted:
                    self.procs[pid] = start_time(pid)
                changes.update(
                    pids=sorted(set(self.rank_pids.values()) | set(self.procs)),
                    rank_pids={str(k): v for k, v in self.rank_pids.items()},
                    procs=self._procs_list(),
                )
                if self.sampler is not None:
                    self.sampler.set_pids(dict(self.rank_pids))
            elif kind == "train_begin":
                changes.update(total_steps=ev.get("total_steps"), step=int(ev.get("start_step") or 0))
            elif kind == "step":
                self.last_step = int(ev.get("step") or 0)
                self.watchdog.observe_step(self.last_step, float(ev.get("t") or time.time()))
                changes.update(step=self.last_step, total_steps=ev.get("total_steps"), last_loss=ev.get("loss"))
                self.torch_devices = node_torch_devices(ev.get("mem"), self.node_rank) or self.torch_devices
            elif kind in ("heartbeats", "heartbeat", "train_end", "predict_progress", "progress"):
                observe_progress(self.watchdog, ev)
            elif kind == "alert":
                if not self.replaying:
                    self.notify(ev)
            elif kind == "stop_requested":
                self.stopping(ev, changes)
            elif kind == "run_failed":
                self.worker_failure = ev
            elif kind == "run_stopped":
                self.stopped_event = ev
                self.last_step = max(self.last_step, int(ev.get("step") or 0))
            elif kind == "run_finished":
                self.finished_event = ev
                self.last_step = max(
                    self.last_step, int(ev.get("steps") or 0)
                )  # the last step need not be a logging step
                changes.update(step=self.last_step)

    def _request_detail(self, what: str) -> str | None:
        """Who made a pending control request (its file's ``detail``), or None."""
        try:
            return json.loads((self.run.control_dir / what).read_text(encoding="utf-8")).get("detail") or None
        except (OSError, ValueError, AttributeError):
            return None

    def stopping(self, ev: dict[str, Any], changes: dict[str, Any]) -> None:
        """A stop was asked (``stop_requested``): the run is "stopping" at once (status.json, a ``state``
        event), while the ranks finish their step, save a checkpoint and end."""
        if self.stop_said or self.killing or self.stopped_event or self.finished_event or self.worker_failure:
            return
        self.stop_said = True
        by = f" ({ev['by']})" if ev.get("by") else ""
        reason = f"stop requested{by}: saving a checkpoint at the end of step {self.last_step + 1}, then ending"
        changes.update(state="stopping", reason=reason)
        if not self.replaying:
            self.emit("state", state="stopping", reason=reason)

    def notify(self, ev: dict[str, Any]) -> None:
        """The user's notify_command for an event that makes a notification (node 0's supervisor
        only: the run's own events and the whole run's hang watchdog are there)."""
        if self.node_rank == 0:
            self.notifier.send(notification(ev, self.run.run_id, self.run.path))

    def flush_status(self) -> None:
        if self.status_changes:
            changes, self.status_changes = self.status_changes, {}
            self.status(**changes)

    def tick(self) -> None:
        self.follow_events()
        self.flush_status()
        if self.run.pending("kill"):
            self.run.consume("kill")
            self.request_kill("killed on request", requested=True)
        if self.killing and time.time() > self.kill_deadline:
            self._signal(signal.SIGKILL)
        if self.sampler is not None:
            try:
                snap = self.sampler.maybe_sample(torch_devices=self.torch_devices)
                if snap is not None:
                    self.emit("telemetry", **snap, node_rank=self.node_rank, host=socket.gethostname())
            except Exception as exc:
                self.sampler = None
                say(f"telemetry error: {exc}")
        if time.time() >= self.comm_next_t:
            self.comm_next_t = time.time() + 2.0
            self.follow_comm_logs()
        alive = self.ranks_running()
        if time.time() >= self.last_lines_t:  # reading the logs' tails every tick cost ~2 % of training
            self.last_lines_t = time.time() + 5.0
            self.last_lines = {r: (tail_lines(self.run.rank_log(r), 1) or [""])[-1] for r in (self.rank_pids or {0: 0})}
        last_lines = self.last_lines
        alert = self.watchdog.check(time.time(), ranks_alive=alive and not self.killing, last_lines=last_lines)
        if alert:
            self.emit("alert", **alert)

    def follow_comm_logs(self) -> None:
        """Feed the new bytes of every rank log to an NCCL/RCCL INFO parser; emit a ``comm``
        event when what it knows changes (version, init state, transports)."""
        from cockpit.comm.flight import read_dumps
        from cockpit.comm.nccl_log import NcclLogParser, merge_snapshots

        world = self.cfg.world_size
        if world <= 1 and not any(k.startswith(("NCCL_", "RCCL_")) for k in os.environ):
            return
        for log in sorted(self.run.logs_dir.glob("rank*.log")):
            try:
                rank = int(log.stem[4:])
            except ValueError:
                continue
            parser = self.comm_parsers.setdefault(rank, NcclLogParser(rank=rank))
            offset = self.comm_offsets.get(rank, 0)
            try:
                with open(log, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read(1 << 20)
            except OSError:
                continue
            self.comm_offsets[rank] = offset + len(data)
            if data:
                parser.feed(data)
        if not self.comm_parsers:
            return
        merged = merge_snapshots([p.snapshot() for p in self.comm_parsers.values()])
        flight = read_dumps(self.run.logs_dir)  # which collective each rank was in at a timeout
        if flight:
            merged["details"]["flight"] = flight
        key = (
            merged.get("status"),
            merged.get("version"),
            json.dumps(merged.get("details"), sort_keys=True, default=str)[:4000],
        )
        if merged.get("status") not in (None, "unknown") and key != self.comm_last:
            self.comm_last = key
            self.emit("comm", source="nccl_log", **merged)

    def loop(self) -> int:
        while self.ranks_running():
            try:
                self.tick()
            except OSError as exc:  # a full disk (or a vanished file) must not take the supervisor down
                self._write_failed(exc)
                say(f"supervisor: {exc}")
            time.sleep(POLL_S)
        # the launcher is gone; make sure nothing of its group is left
        self._signal(signal.SIGKILL)
        time.sleep(0.1)
        self.follow_events()
        code = self.proc.returncode if self.proc is not None else None
        return self.finish(code)

    def finish(self, code: int | None) -> int:
        """Record the end: state and reason (``cockpit.run.runstate.final_state``) in status.json,
        the event log and summary.json. ``code`` None: an adopted run (the exit code is unknown)."""
        if self.disk_full or _disk_nearly_full(self.run.path):
            release_reserve(self.run)
        status = self.run.read_status()
        outcome = attempt_outcome([e for e in (self.finished_event, self.stopped_event, self.worker_failure) if e])
        exit_text = describe_exit(code) if code is not None else "exited"
        state, reason = final_state(
            code,
            killing=self.killing,
            kill_reason=self.kill_reason,
            outcome=outcome,
            exit_text=exit_text,
            kill_requested=self.kill_requested,
        )
        if (
            state == "failed"
            and "disk full" not in (reason or "")
            and (self.disk_full or _disk_nearly_full(self.run.path))
        ):
            reason = f"disk full: {self.disk_full or f'no space left on the run dir disk ({self.run.path})'}; {reason}"
        failing_rank = (self.worker_failure or {}).get("rank", 0)
        tail = tail_lines(self.run.rank_log(int(failing_rank or 0)), 20) if state == "failed" else []
        if state == "failed":
            if self.worker_failure is None or self.killing:
                self.emit("run_failed", reason=reason, rank=failing_rank, log_tail=tail)
            else:
                self.emit("state", state="failed", reason=reason, log_tail=tail)
        self.emit("state", state=state, reason=reason)
        step = max(self.last_step, status.get("step") or 0)
        final = {
            **self.status_changes,
            "state": state,
            "reason": reason,
            "exit_code": code,
            "log_tail": tail,
            "step": step,
            "ended": time.time(),
        }
        self.status_changes = {}
        self.status(**final)
        self._settle_summary(state, reason)
        self._remove_partial_checkpoints()
        self.notify(
            {"kind": "state", "t": time.time(), "state": state, "reason": reason, "log_tail": tail, "step": step}
        )
        if self.sampler is not None:
            try:
                self.sampler.close()
            except Exception:
                pass
        return 0 if state in ("finished", "stopped") else 1

    def _remove_partial_checkpoints(self) -> None:
        """The ranks are gone: a checkpoint still in ``checkpoints/.staging`` was never completed (a
        rank killed or failing mid-save, a full disk) and nothing can resume from it. Node 0's
        supervisor only (another node's may end while rank 0 still writes a shared output_dir)."""
        if self.node_rank != 0:
            return
        out = Path(self.cfg.output_dir) if self.cfg.output_dir else self.run.path
        staging = out / "checkpoints" / CHECKPOINT_STAGING
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
            say(f"partial checkpoint(s) removed: {staging}")

    def _settle_summary(self, state: str, reason: str | None) -> None:
        try:
            if not self.run.summary_path.exists():
                atomic_write_json(
                    self.run.summary_path,
                    {"run_id": self.run.run_id, "state": state, "reason": reason, "steps": self.last_step},
                )
            else:
                summary = self.run.read_summary()
                if summary.get("state") != state:
                    summary.update(state=state, reason=reason)
                    atomic_write_json(self.run.summary_path, summary)
        except OSError as exc:
            say(f"summary.json not written: {exc}")


RESERVE_BYTES = 256 * 1024
RESERVE_NAME = ".reserve"


def make_reserve(run: RunDir) -> None:
    """A little real space held for the end: when the disk fills, it is given back so the final
    state, event and summary can still be written."""
    try:
        with open(run.path / RESERVE_NAME, "wb") as fh:
            fh.write(b"\0" * RESERVE_BYTES)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        (run.path / RESERVE_NAME).unlink(missing_ok=True)


def release_reserve(run: RunDir) -> None:
    (run.path / RESERVE_NAME).unlink(missing_ok=True)


def _disk_nearly_full(path: Path) -> bool:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return False
    return usage.free < max(RESERVE_BYTES * 4, usage.total // 200)


def say(line: str) -> None:
    """A line in logs/supervisor.log, if the disk lets it."""
    try:
        print(line, flush=True)
    except OSError:
        pass


def take_supervisor_lock(run: RunDir) -> int | None:
    """The run's supervisor lock (flock on ``.supervisor.lock``, held for the process's life and
    never inherited by the ranks); None when another supervisor holds it."""
    import fcntl

    fd = os.open(run.path / ".supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def main(argv: list[str]) -> int:
    adopting = "--adopt" in argv
    run = RunDir(Path([a for a in argv if not a.startswith("--")][0]).resolve())
    lock = take_supervisor_lock(run)
    if lock is None:
        say("another supervisor watches this run; exiting")
        return 0
    sup = Supervisor(run)
    signal.signal(signal.SIGTERM, lambda *_: sup.request_kill("supervisor terminated (SIGTERM)"))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # belt and braces: we are in our own session anyway
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if adopting:
        if not sup.adopt():
            from cockpit.run.liveness import reconcile

            reconcile(run, adopt=False, supervisor_gone=True)  # nothing left to watch: the readers' verdict ends it
            return 0
        say(f"supervisor pid {os.getpid()} adopted the run's ranks")
    else:
        make_reserve(run)
        try:
            sup.start()
        except Exception as exc:
            run.update_status(state="failed", reason=f"could not start the ranks: {exc}", **sup._identity())
            sup.emit("run_failed", reason=f"could not start the ranks: {exc}")
            sup.notify(
                {"kind": "state", "t": time.time(), "state": "failed", "reason": f"could not start the ranks: {exc}"}
            )
            os.close(lock)
            sup.notifier.drain()
            return 1
    code = sup.loop()
    # the run has ended: the lock goes first (a resume may start the next attempt's supervisor now),
    # then a notify command still running gets the rest of its time
    os.close(lock)
    sup.notifier.drain()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
