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
- Global rank 0 also runs a :class:`NodeCollector`: when a node's ``seq`` moved it emits a
  ``heartbeat`` event (node_rank, host, step, seq; at once when the step moved, else every
  ``min_gap_s``, 3 s), and for the other nodes a ``telemetry`` event carrying ``node_rank`` and
  ``host`` (``source`` "node_reporter", every ``min_gap_s``). A node whose thread
  stopped (frozen process, lost network) stops producing heartbeats: the supervisor's
  watchdog names it.

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

KEY = "cockpit/node/{}"


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
    """``min_gap_s``: a node's heartbeat is written when its step moved, else at most every
    ``min_gap_s``; its relayed telemetry at most every ``min_gap_s`` (the event log of a
    week-long run on many nodes stays small)."""

    def __init__(
        self,
        store: Any,
        nnodes: int,
        own_node: int = 0,
        min_gap_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self.nnodes = int(nnodes)
        self.own_node = int(own_node)
        self.min_gap_s = float(min_gap_s)
        self.clock = clock
        self._seq: dict[int, int] = {}
        self._beat: dict[int, tuple[float, Any]] = {}  # node -> (when written, step)
        self._relayed: dict[int, float] = {}
        self.ended: set[int] = set()  # nodes whose last report says training ended

    def collect(self) -> list[tuple[str, dict[str, Any]]]:
        """(kind, fields) for every node whose report is new since the last call (and due)."""
        out: list[tuple[str, dict[str, Any]]] = []
        now = self.clock()
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
            last_t, last_step = self._beat.get(node, (None, None))
            ended_now = bool(report.get("train_ended")) and node not in self.ended
            if report.get("train_ended"):
                self.ended.add(node)
            if last_t is None or ended_now or report.get("step") != last_step or now - last_t >= self.min_gap_s:
                self._beat[node] = (now, report.get("step"))
                out.append(
                    (
                        "heartbeat",
                        {
                            "node_rank": node,
                            "host": report.get("host"),
                            "step": report.get("step"),
                            "seq": seq,
                            "train_ended": bool(report.get("train_ended")),
                        },
                    )
                )
            if node != self.own_node and "devices" in report and now - self._relayed.get(node, -1e9) >= self.min_gap_s:
                self._relayed[node] = now
                out.append(
                    (
                        "telemetry",
                        {
                            "node_rank": node,
                            "host": report.get("host"),
                            "source": "node_reporter",
                            "backend": report.get("backend"),
                            "devices": report.get("devices") or [],
                            "ranks": [],
                            "unavailable": report.get("unavailable") or {},
                        },
                    )
                )
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
