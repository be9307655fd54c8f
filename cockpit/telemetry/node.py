"""Every node's GPUs and heartbeat, carried to global rank 0 through the rendezvous' key-value store.

Each node has its own supervisor and run dir (``cockpit/strategy/multinode.py``); only global
rank 0's run dir is the one the cockpit follows. The nodes already share one channel: the c10d
store of the torchrun rendezvous (``MASTER_ADDR:MASTER_PORT`` in every rank's environment). It
works while the ranks are stuck in a collective, which is when a hang needs it most.

- Local rank 0 of every node runs a :class:`NodeReporter` in a daemon thread: every
  ``interval_s`` it writes ``cockpit/node/<node_rank>`` = ``{node_rank, host, seq, step,
  backend, devices, unavailable}``: ``step`` is the last training step the reporting rank
  finished (None before the first), ``devices`` the node's GPUs from amdsmi / NVML (the
  telemetry backends; omitted on node 0, whose supervisor samples them already).
- Global rank 0 also runs a :class:`NodeCollector`, which folds every node's new reports into
  bounded events (``cockpit/store/node_grid.py``): ``heartbeats`` (step -> node ranges; at once
  when a step moved, else every ``min_gap_s``, 3 s) and ``node_telemetry`` (the other nodes' GPUs
  as one compact row each, at most every ``min_gap_s`` and within a byte budget; the outlying
  GPUs as full records in between). A node whose thread stopped (frozen process, lost network)
  is absent from the heartbeats: the supervisor's watchdog names it.

Store calls: ``set``, ``check`` (never a blocking ``get`` of a key that may not exist yet) and
``get``. Any store failure is counted and retried next period; telemetry never fails a run.
No torch here: the caller passes the store (``torch.distributed.TCPStore`` in the ranks).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from cockpit.store.node_grid import grid_row, outliers, ranges

KEY = "cockpit/node/{}"
GRID_BYTES_PER_S = 2048.0  # the whole grid of every node's GPUs, on average, at most


class NodeReporter:
    def __init__(
        self, store: Any, node_rank: int, host: str, backend: Any = None, unavailable: dict[str, str] | None = None
    ):
        self.store = store
        self.node_rank = int(node_rank)
        self.host = host
        self.backend = backend
        self.unavailable = dict(unavailable or {})
        self.seq = 0
        self.step: int | None = None
        self.train_ended = False

    def payload(self) -> dict[str, Any]:
        self.seq += 1
        out: dict[str, Any] = {
            "node_rank": self.node_rank,
            "host": self.host,
            "seq": self.seq,
            "step": self.step,
            "train_ended": self.train_ended,
        }
        if self.backend is not None:
            out["backend"] = self.backend.name
            out["unavailable"] = dict(self.unavailable)
            try:
                out["devices"] = self.backend.devices()
            except Exception as exc:  # noqa: BLE001 - a library that worked at start and fails now
                out["devices"] = []
                out["unavailable"][self.backend.name] = f"sampling failed: {type(exc).__name__}: {exc}"[:160]
        return out

    def publish(self) -> None:
        self.store.set(KEY.format(self.node_rank), json.dumps(self.payload()))


class NodeCollector:
    """Every node's report, into at most three bounded events per period (``cockpit/store/node_grid.py``):

    - ``heartbeats``: the nodes whose report is new since the last one, as step -> node ranges
      (``steps``: [[step, "0-62"], ...]), with ``hosts`` for nodes seen for the first time and
      ``ended`` for nodes whose training just ended; written when a node's step moved, else at
      most every ``min_gap_s``. A node whose reports stop is absent from them: the watchdog names it.
    - ``node_telemetry`` with ``nodes`` (one compact row per node other than ``own_node``, whose
      supervisor samples its GPUs) and ``outliers`` (the hottest, least busy and fullest GPUs as
      full records): the whole grid at most every ``min_gap_s`` and no more often than
      ``budget_bytes_per_s`` allows (its size / the budget: a 4096-GPU job's grid comes every
      ~50 s), the outliers alone every ``min_gap_s`` in between. So the event log grows by a
      bounded number of bytes per second whatever the GPU count (``bench/telemetry_volume.py``).
    """

    def __init__(
        self,
        store: Any,
        nnodes: int,
        own_node: int = 0,
        min_gap_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        budget_bytes_per_s: float = GRID_BYTES_PER_S,
    ):
        self.store = store
        self.nnodes = int(nnodes)
        self.own_node = int(own_node)
        self.min_gap_s = float(min_gap_s)
        self.clock = clock
        self.budget_bytes_per_s = float(budget_bytes_per_s)
        self._seq: dict[int, int] = {}
        self._step: dict[int, Any] = {}  # node -> the last step it reported
        self._hosts: dict[int, Any] = {}
        self._pending: dict[int, Any] = {}  # node -> step: new reports since the last heartbeats event
        self._new_hosts: dict[int, Any] = {}
        self._new_ended: set[int] = set()
        self._moved = False
        self._beat_t: float | None = None
        self._devices: dict[int, dict[str, Any]] = {}  # node -> its last report with devices
        self._fresh = False  # a report with devices came since the last node_telemetry event
        self._grid_t: float | None = None
        self._grid_bytes = 0
        self._outliers_t: float | None = None
        self.ended: set[int] = set()  # nodes whose last report says training ended

    def grid_period_s(self) -> float:
        """How long the whole grid waits after the last one: min_gap_s, longer when it is big."""
        return max(self.min_gap_s, self._grid_bytes / self.budget_bytes_per_s if self.budget_bytes_per_s > 0 else 0.0)

    def _read(self) -> None:
        for node in range(self.nnodes):
            key = KEY.format(node)
            if not self.store.check([key]):
                continue
            try:
                report = json.loads(self.store.get(key))
            except ValueError:
                continue
            seq = int(report.get("seq") or 0)
            if self._seq.get(node) == seq:
                continue
            self._seq[node] = seq
            step = report.get("step")
            self._pending[node] = step
            if self._step.get(node, "never") != step:
                self._moved = True
                self._step[node] = step
            host = report.get("host")
            if self._hosts.get(node, "never") != host:
                self._hosts[node] = self._new_hosts[node] = host
                self._moved = True
            if report.get("train_ended") and node not in self.ended:
                self.ended.add(node)
                self._new_ended.add(node)
                self._moved = True
            if node != self.own_node and "devices" in report:
                self._devices[node] = report
                self._fresh = True

    def _heartbeats(self) -> dict[str, Any]:
        by_step: dict[Any, list[int]] = {}
        for node, step in self._pending.items():
            by_step.setdefault(step, []).append(node)
        steps = sorted(by_step.items(), key=lambda kv: (kv[0] is None, -(kv[0] or 0)))
        out: dict[str, Any] = {"steps": [[step, ranges(nodes)] for step, nodes in steps]}
        if self._new_hosts:
            out["hosts"] = {str(k): v for k, v in sorted(self._new_hosts.items())}
        if self._new_ended:
            out["ended"] = ranges(self._new_ended)
        self._pending, self._new_hosts, self._new_ended, self._moved = {}, {}, set(), False
        return out

    def _grid(self, whole: bool) -> dict[str, Any]:
        devices = {node: r.get("devices") or [] for node, r in self._devices.items()}
        fields: dict[str, Any] = {"outliers": outliers(devices)}
        if whole:
            rows = []
            for node, report in sorted(self._devices.items()):
                row = grid_row(node, report.get("host"), report.get("backend"), devices[node])
                if not devices[node] and report.get("unavailable"):
                    row["unavailable"] = report["unavailable"]
                rows.append(row)
            fields["nodes"] = rows
            self._grid_bytes = len(json.dumps(rows, separators=(",", ":")))
            fields["period_s"] = round(self.grid_period_s(), 1)
        self._fresh = False
        return fields

    def collect(self) -> list[tuple[str, dict[str, Any]]]:
        """(kind, fields) of the events due now: heartbeats of the nodes with new reports, and
        the grid or its outliers (never blocks on a node that has not published yet)."""
        out: list[tuple[str, dict[str, Any]]] = []
        now = self.clock()
        self._read()
        if self._pending and (self._moved or self._beat_t is None or now - self._beat_t >= self.min_gap_s):
            self._beat_t = now
            out.append(("heartbeats", self._heartbeats()))
        if self._fresh:
            if self._grid_t is None or now - self._grid_t >= self.grid_period_s():
                self._grid_t = self._outliers_t = now
                out.append(("node_telemetry", self._grid(whole=True)))
            elif self._outliers_t is None or now - self._outliers_t >= self.min_gap_s:
                self._outliers_t = now
                out.append(("node_telemetry", self._grid(whole=False)))
        return out


class NodeThread:
    """Runs the reporter (and, in global rank 0, the collector) every ``interval_s`` in a daemon thread."""

    def __init__(
        self,
        reporter: NodeReporter,
        collector: NodeCollector | None,
        emit: Callable[..., None] | None,
        interval_s: float,
    ):
        self.reporter = reporter
        self.collector = collector
        self.emit = emit
        self.interval_s = max(0.2, float(interval_s))
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cockpit-node-telemetry", daemon=True)

    def start(self) -> NodeThread:
        self._thread.start()
        return self

    def tick(self) -> None:
        try:
            self.reporter.publish()
            if self.collector is not None and self.emit is not None:
                for kind, fields in self.collector.collect():
                    self.emit(kind, **fields)
        except Exception:  # noqa: BLE001 - the store went away (rendezvous host gone): try again next period
            self.failures += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.tick()  # the last step reached, published once more


ACTIVE: NodeThread | None = None  # this process's thread (local rank 0 of a node), if any


def note_step(step: int) -> None:
    """The training step this rank just finished, for its node's next heartbeat."""
    if ACTIVE is not None:
        ACTIVE.reporter.step = int(step)


def note_train_end() -> None:
    """Training ended on this node: its last step is published at once (not a period later)."""
    if ACTIVE is not None:
        ACTIVE.reporter.train_ended = True
        ACTIVE.tick()


def finish(wait_s: float = 5.0) -> None:
    """At the rank's end: stop the thread; global rank 0 first waits (up to ``wait_s``) for every
    node's report that its training ended, so each node's last heartbeat reaches the event log
    even when training was shorter than one telemetry period."""
    active = ACTIVE
    if active is None:
        return
    collector = active.collector
    deadline = time.monotonic() + wait_s
    while collector is not None and len(collector.ended) < collector.nnodes and time.monotonic() < deadline:
        active.tick()
        time.sleep(0.1)
    active.stop()
