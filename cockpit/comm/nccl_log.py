"""Incremental parser for ``NCCL_DEBUG=INFO`` output (NCCL and RCCL) and PyTorch's NCCL watchdog.

For the supervisor, one parser per rank log, fed whatever bytes the tail read::

    parser = NcclLogParser(rank=3)
    parser.feed(new_bytes_or_text)      # any chunking; a partial last line waits
    snap = parser.snapshot()            # plain dict, cheap; see below
    parser.flush()                      # at EOF: parse a last line without newline

    # several ranks -> one ``comm`` event
    merged = merge_snapshots([p.snapshot() for p in parsers])

Without ``rank`` (one log holding several ranks, e.g. rccl-tests or a shared console) lines
are attributed through the ``comm 0x... rank N`` lines, the ``host:pid:tid [dev]`` prefix,
``[Rank N]`` of the watchdog, or the send/receive side of a connection line.

``snapshot()``::

    {"state": "unknown" | "initializing" | "complete" | "timeout" | "error",   # worst rank
     "ranks": {rank: {"state", "nranks", "peers": {peer: [transport, ...]}, "timeouts": [...],
                      "last_completed_work"}},
     "version": {"library": "rccl"|"nccl", "version", "hip", "cuda", "rocm", "git",
                 "librccl_path", "hostname"},                 # keys only when seen
     "network": {"name": "Socket"|"IB"|"IBext_v8"|..., "plugin": {...}, "socket_ifs": [...],
                 "ib_devices": [...], "oob_if", "bootstrap_if", "env": {VAR: value}},
     "channels": {"count", "coll", "p2p", "rings_connected", "trees_connected"},
     "links": [{"src", "dst", "transport", "kind": "p2p"|"shm"|"net"|..., "net", "gdrdma",
                "direction", "channels": [..], "comm"}],
     "timeouts": [{"rank", "seq", "op", "timeout_ms", "ran_ms", "numel_in", "numel_out"}],
     "errors": [line, ...], "warnings": [line, ...]}          # the last 20 of each

State per rank: ``initializing`` after any NCCL line (or ``Init START``) until every
communicator it started logged ``Init COMPLETE``; ``timeout`` after a watchdog timeout;
``error`` after an NCCL error trace (``file.cc:N -> code`` with a non-zero code, ``NCCL
error``, ``ncclSystemError``...) or a watchdog "Exception ... detected by watchdog" without a
timeout line. ``NCCL WARN`` lines alone are kept as warnings, not errors (healthy runs print
some, e.g. "Failed to open libibverbs.so").

The line shapes handled here are pinned by real logs in ``tests/fixtures/nccl/`` (each file
names the public issue it came from). No torch, no textual.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

STATE_ORDER = ("unknown", "complete", "initializing", "timeout", "error")  # later = worse

_PREFIX = re.compile(
    r"(?:(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) )?\[(?P<dev>\d+)\] (?:\S+:\d+ )?NCCL (?P<level>INFO|WARN|TRACE)\b ?(?P<msg>.*)$"
)
_VERSION_LINE = re.compile(
    r"\b(?P<lib>NCCL|RCCL) version (?P<ver>\d+\.\d+\.\d+)(?:[+\-](?P<plat>hip|cuda)(?P<platver>[\d.]+))?\s*(?P<rest>.*)$"
)
_BANNER = re.compile(r"^(?P<key>RCCL version|HIP version|ROCm version|Hostname|Librccl path)\s*:\s*(?P<val>.*?)\s*$")
_BANNER_KEYS = {
    "RCCL version": "version",
    "HIP version": "hip",
    "ROCm version": "rocm",
    "Hostname": "hostname",
    "Librccl path": "librccl_path",
}
_CONNECTION = re.compile(
    r"\b(?:Channel|Ring) (?P<ch>\d+)(?:/\d+)? : (?P<src>\d+)\[[^\]]*\] -> (?P<dst>\d+)\[[^\]]*\]"
    r"(?: \[(?P<dir>send|receive)\])? via (?P<transport>.+?)(?: comm (?P<comm>0x[0-9a-fA-F]+).*)?\s*$"
)
_RING_ORDER = re.compile(r"\bChannel (?P<ch>\d+)/(?P<n>\d+) :\s+\d+(?:\s+\d+)*\s*$")
_COMM = re.compile(r"\bcomm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) n[Rr]anks (?P<nranks>\d+)")
_COMM_PTR = re.compile(r"\bcomm (?P<comm>0x[0-9a-fA-F]+)\b")
_INIT = re.compile(r"- Init (?P<what>START|COMPLETE)\b")
_COUNTS = re.compile(r"(?P<coll>\d+) coll channels,.*?(?P<p2p>\d+) p2p channels\b")
_USING_NETWORK = re.compile(r"^(?:Using network|Using internal Network|Assigned NET plugin) (?P<net>\S+)")
_SOCKET_IFS = re.compile(r"\[\d+\](?P<name>[^\s<\[]+)<\d+>")
_IB_DEVS = re.compile(r"\[\d+\](?P<dev>[^\s\[;]+)")
_OOB = re.compile(r"OOB (?P<ifc>[^\s<]+)<\d+>")
_BOOTSTRAP = re.compile(r"^Bootstrap ?: Using (?:\[\d+\])?(?P<ifc>[^\s<]+)<\d+>")
_SET_BY_ENV = re.compile(r"^(?P<var>[A-Z][A-Z0-9_]+) set by environment to (?P<val>.*?)\.?\s*$")
_PLUGIN_NAME = re.compile(r"^Plugin name set by env to (?P<name>\S+)")
_PLUGIN_PATH = re.compile(r"^Plugin Path : (?P<path>\S+)")
_P2P_PLUGIN = re.compile(r"^P2P plugin (?P<name>\S+)")
_WATCHDOG = re.compile(
    r"\[Rank (?P<rank>\d+)\] Watchdog caught collective operation timeout: WorkNCCL\((?P<args>.*)\) ran for (?P<ran>\d+) milliseconds"
)
_WATCHDOG_ARG = re.compile(r"(?P<key>\w+)(?:\(ms\))?=(?P<val>[^,]+)")
_WATCHDOG_WORK = re.compile(
    r"Rank (?P<rank>\d+)\] Exception \(either an error or timeout\) detected by watchdog at work: (?P<work>-?\d+), "
    r"last enqueued NCCL work: (?P<enq>-?\d+), last completed NCCL work: (?P<done>-?\d+)"
)
_ERROR_TRACE = re.compile(r"\b[\w/]+\.(?:cc|cu|cpp|h):\d+ -> [1-9]\d*\b")
_ERROR_WORDS = re.compile(
    r"\bNCCL error\b|Test NCCL failure|\bnccl(?:System|Internal|UnhandledCuda|InvalidUsage|InvalidArgument|Remote)Error\b"
)


# (pattern, where, {key: group}, extra): a match stores the groups (digits as int) into
# self.network / self.channels / the plugin dict, plus the fixed ``extra`` items.
_FieldRule = tuple[re.Pattern[str], str, dict[str, str], dict[str, Any]]
_FIELD_RULES_INFO: tuple[_FieldRule, ...] = (
    (_USING_NETWORK, "network", {"name": "net"}, {}),
    (_BOOTSTRAP, "network", {"bootstrap_if": "ifc"}, {}),
    (_RING_ORDER, "channels", {"count": "n"}, {}),
    (_COUNTS, "channels", {"coll": "coll", "p2p": "p2p"}, {}),
)
_FIELD_RULES_PLUGIN: tuple[_FieldRule, ...] = (
    (_PLUGIN_NAME, "plugin", {"requested": "name"}, {}),
    (_PLUGIN_PATH, "plugin", {"path": "path"}, {"loaded": True}),
    (_P2P_PLUGIN, "plugin", {"name": "name"}, {"loaded": True}),
)


def transport_kind(transport: str) -> str:
    head = transport.split("/", 1)[0].upper()
    return {"P2P": "p2p", "SHM": "shm", "NET": "net", "COLLNET": "collnet", "NVLS": "nvls"}.get(head, "other")


@dataclass
class _Rank:
    state: str = "initializing"
    nranks: int | None = None
    comms_started: set[str] = field(default_factory=set)
    comms_complete: set[str] = field(default_factory=set)
    timeouts: list[dict[str, Any]] = field(default_factory=list)
    last_completed_work: int | None = None
    failed: bool = False
    watchdog_exception: bool = False  # "Exception (either an error or timeout) detected by watchdog"


class NcclLogParser:
    def __init__(self, rank: int | None = None, keep_lines: int = 20):
        self.rank = rank
        self._pending = b""
        self.lines_seen = 0
        self._ranks: dict[int, _Rank] = {}
        self._comm_rank: dict[str, int] = {}
        self._prefix_rank: dict[tuple[str, str, str], int] = {}
        self._links: dict[tuple, dict[str, Any]] = {}
        self._seen_nccl = False
        self.version: dict[str, Any] = {}
        self.network: dict[str, Any] = {"plugin": {}, "env": {}}
        self.channels: dict[str, Any] = {}
        self.timeouts: list[dict[str, Any]] = []
        self.errors: deque[str] = deque(maxlen=keep_lines)
        self.warnings: deque[str] = deque(maxlen=keep_lines)

    # -- input ----------------------------------------------------------------------------
    def feed(self, data: str | bytes) -> int:
        """Take any chunk of the log; returns how many complete lines were parsed."""
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        buf = self._pending + data
        *lines, self._pending = buf.split(b"\n")
        for raw in lines:
            self.feed_line(raw.decode("utf-8", "replace"))
        return len(lines)

    def flush(self) -> None:
        if self._pending:
            line, self._pending = self._pending, b""
            self.feed_line(line.decode("utf-8", "replace"))

    def feed_line(self, line: str) -> None:
        line = line.rstrip("\r\n")
        for segment in line.split("\r"):  # progress bars rewrite the line with \r
            if segment.strip():
                self.lines_seen += 1
                self._parse(segment)

    # -- attribution ----------------------------------------------------------------------
    def _rank_state(self, rank: int) -> _Rank:
        if rank not in self._ranks:
            self._ranks[rank] = _Rank()
        return self._ranks[rank]

    def _attribute(self, prefix: re.Match | None, msg: str, explicit: int | None = None) -> int | None:
        if self.rank is not None:
            return self.rank
        if explicit is not None:
            return explicit
        ptr = _COMM_PTR.search(msg)
        if ptr and ptr.group("comm") in self._comm_rank:
            return self._comm_rank[ptr.group("comm")]
        if prefix is not None and prefix.group("pid"):
            return self._prefix_rank.get((prefix.group("host"), prefix.group("pid"), prefix.group("dev")))
        return None

    # -- the line kinds -------------------------------------------------------------------
    def _parse(self, line: str) -> None:
        watchdog = _WATCHDOG.search(line)
        if watchdog:
            self._on_watchdog(watchdog)
            return
        work = _WATCHDOG_WORK.search(line)
        if work:
            state = self._rank_state(self._attribute(None, "", int(work.group("rank"))))
            state.last_completed_work = int(work.group("done"))
            state.watchdog_exception = True
            return
        banner = _BANNER.match(line.strip())
        if banner:
            key = _BANNER_KEYS[banner.group("key")]
            value = banner.group("val")
            if key == "version":
                self.version["library"] = "rccl"
                ver, _, git = value.partition("-")
                self.version["version"], self.version["git"] = ver, git or None
            else:
                self.version[key] = value
            return
        prefix = _PREFIX.search(line)
        msg = prefix.group("msg") if prefix else line.strip()
        version = _VERSION_LINE.search(msg)
        if version and (prefix is not None or msg.startswith(("NCCL version", "RCCL version"))):
            self._on_version(version)
            return
        if prefix is None:
            if _ERROR_WORDS.search(line):
                self._on_error(None, line)
            return
        self._seen_nccl = True
        rank = self._attribute(prefix, msg)
        if prefix.group("level") == "WARN":
            self.warnings.append(line.strip())
        if _ERROR_TRACE.search(msg) or _ERROR_WORDS.search(msg):
            self._on_error(rank, line)
            return
        comm = _COMM.search(msg)
        if comm:
            self._on_comm(prefix, msg, comm)
            return
        conn = _CONNECTION.search(msg)
        if conn:
            self._on_connection(prefix, conn, rank)
            return
        if rank is not None:
            self._rank_state(rank)
        self._on_info(msg)

    def _on_version(self, m: re.Match) -> None:
        plat = m.group("plat")
        self.version["library"] = "rccl" if (m.group("lib") == "RCCL" or plat == "hip") else "nccl"
        self.version["version"] = m.group("ver")
        if plat:
            self.version[plat] = m.group("platver")
        rest = m.group("rest").strip()
        if rest:
            self.version["git"] = rest

    def _on_comm(self, prefix: re.Match, msg: str, m: re.Match) -> None:
        ptr, comm_rank, nranks = m.group("comm"), int(m.group("rank")), int(m.group("nranks"))
        if self.rank is None:
            self._comm_rank[ptr] = comm_rank
            if prefix.group("pid"):
                self._prefix_rank[(prefix.group("host"), prefix.group("pid"), prefix.group("dev"))] = comm_rank
        rank = self.rank if self.rank is not None else comm_rank
        state = self._rank_state(rank)
        state.nranks = state.nranks or nranks
        init = _INIT.search(msg)
        if init and init.group("what") == "START":
            state.comms_started.add(ptr)
        elif init:
            state.comms_complete.add(ptr)

    def _on_connection(self, prefix: re.Match, m: re.Match, rank: int | None) -> None:
        src, dst = int(m.group("src")), int(m.group("dst"))
        transport = m.group("transport").strip()
        direction = m.group("dir")
        if rank is None:  # the side that logs: the receiver for [receive], else the sender
            rank = dst if direction == "receive" else src
        self._rank_state(rank)
        key = (m.group("comm"), src, dst, transport)
        link = self._links.get(key)
        if link is None:
            parts = transport.split("/")
            link = self._links[key] = {
                "src": src,
                "dst": dst,
                "transport": transport,
                "kind": transport_kind(transport),
                "net": parts[1] if parts[0].upper() == "NET" and len(parts) > 1 else None,
                "gdrdma": "GDRDMA" in transport,
                "direction": direction,
                "channels": [],
                "comm": m.group("comm"),
            }
        channel = int(m.group("ch"))
        if channel not in link["channels"]:
            link["channels"].append(channel)

    def _on_watchdog(self, m: re.Match) -> None:
        args = {a.group("key"): a.group("val").strip() for a in _WATCHDOG_ARG.finditer(m.group("args"))}

        def as_int(key: str) -> int | None:
            try:
                return int(args[key])
            except (KeyError, ValueError):
                return None

        rank = self._attribute(None, "", int(m.group("rank")))
        entry = {
            "rank": rank,
            "seq": as_int("SeqNum"),
            "op": args.get("OpType"),
            "timeout_ms": as_int("Timeout"),
            "ran_ms": int(m.group("ran")),
            "numel_in": as_int("NumelIn"),
            "numel_out": as_int("NumelOut"),
        }
        self.timeouts.append(entry)
        del self.timeouts[:-50]
        state = self._rank_state(rank)
        state.timeouts.append(entry)
        del state.timeouts[:-10]

    def _on_error(self, rank: int | None, line: str) -> None:
        self.errors.append(line.strip())
        if rank is None:
            rank = self.rank
        if rank is not None:
            self._rank_state(rank).failed = True
        else:
            self.channels.setdefault("_unattributed_error", True)

    def _on_info(self, msg: str) -> None:
        net = self.network
        if msg.startswith("NET/Plugin") or _PLUGIN_NAME.match(msg) or _PLUGIN_PATH.match(msg) or _P2P_PLUGIN.match(msg):
            self._on_plugin(msg)
            return
        if self._apply_rules(msg, _FIELD_RULES_INFO):
            return
        if msg.startswith("NET/Socket") and "Using" in msg:
            net["socket_ifs"] = [s.group("name") for s in _SOCKET_IFS.finditer(msg)]
            return
        if msg.startswith("NET/IB"):
            if "No device found" in msg:
                net.setdefault("ib_devices", [])
                return
            head = msg.split(";", 1)[0]
            if "Using" in head:
                net["ib_devices"] = [d.group("dev") for d in _IB_DEVS.finditer(head) if d.group("dev") != "RO]"]
            else:  # older NCCL: "NET/IB: [0] mlx5_3:1/IB", one line per device
                old = re.search(r"\[\d+\]\s+(\S+)", head)
                if old:
                    net.setdefault("ib_devices", []).append(old.group(1))
            oob = _OOB.search(msg)
            if oob:
                net["oob_if"] = oob.group("ifc")
            return
        m = _SET_BY_ENV.match(msg)
        if m:
            net["env"][m.group("var")] = m.group("val")
            return
        if msg.startswith("Connected all rings"):
            self.channels["rings_connected"] = True
        elif msg.startswith(("Connected all trees", "Connected NVLS tree")):
            self.channels["trees_connected"] = True

    def _apply_rules(self, msg: str, rules: tuple) -> bool:
        targets = {"network": self.network, "channels": self.channels, "plugin": self.network["plugin"]}
        for pattern, where, groups, extra in rules:
            m = pattern.search(msg)
            if m:
                values = {key: m.group(group) for key, group in groups.items()}
                targets[where].update({k: int(v) if v.isdigit() else v for k, v in values.items()}, **extra)
                return True
        return False

    def _on_plugin(self, msg: str) -> None:
        plugin = self.network["plugin"]
        plugin.setdefault("messages", [])
        if msg not in plugin["messages"]:
            plugin["messages"] = (plugin["messages"] + [msg])[-5:]
        if self._apply_rules(msg, _FIELD_RULES_PLUGIN):
            return
        missing = re.search(r"No plugin found \((?P<lib>[^)]+)\)|Could not find:? (?P<lib2>\S+?)\.?\s*$", msg)
        if missing:
            plugin["loaded"] = False
            plugin["missing"] = missing.group("lib") or missing.group("lib2")
        elif "Using internal" in msg or "using internal implementation" in msg:
            plugin["loaded"] = False
        elif "Loaded" in msg:
            plugin["loaded"] = True

    # -- output ---------------------------------------------------------------------------
    def _state_of(self, st: _Rank) -> str:
        if st.timeouts:
            return "timeout"
        if st.failed or st.watchdog_exception:
            return "error"
        if st.comms_complete and not (st.comms_started - st.comms_complete):
            return "complete"
        return "initializing"

    def snapshot(self) -> dict[str, Any]:
        ranks: dict[int, dict[str, Any]] = {}
        links = [dict(link, channels=sorted(link["channels"])) for link in self._links.values()]
        for rank, st in sorted(self._ranks.items()):
            peers: dict[int, list[str]] = {}
            for link in links:
                if rank in (link["src"], link["dst"]) and link["src"] != link["dst"]:
                    peer = link["dst"] if link["src"] == rank else link["src"]
                    if link["transport"] not in peers.setdefault(peer, []):
                        peers[peer].append(link["transport"])
            ranks[rank] = {
                "state": self._state_of(st),
                "nranks": st.nranks,
                "peers": peers,
                "timeouts": list(st.timeouts),
                "last_completed_work": st.last_completed_work,
            }
        states = [r["state"] for r in ranks.values()]
        if self.channels.get("_unattributed_error"):
            states.append("error")
        if not states and (self._seen_nccl or self.version):
            states.append("initializing")
        channels = {k: v for k, v in self.channels.items() if not k.startswith("_")}
        return {
            "state": worst_state(states),
            "ranks": ranks,
            "version": dict(self.version),
            "network": {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.network.items()},
            "channels": channels,
            "links": sorted(links, key=lambda link: (link["src"], link["dst"], link["transport"])),
            "timeouts": list(self.timeouts),
            "errors": list(self.errors),
            "warnings": list(self.warnings),
        }


def worst_state(states: Iterable[str]) -> str:
    worst = "unknown"
    for state in states:
        if STATE_ORDER.index(state) > STATE_ORDER.index(worst):
            worst = state
    return worst


def parse_text(text: str, rank: int | None = None) -> dict[str, Any]:
    parser = NcclLogParser(rank=rank)
    parser.feed(text)
    parser.flush()
    return parser.snapshot()


def merge_snapshots(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Several per-rank snapshots -> the fields of one ``comm`` event
    (``backend``, ``version``, ``world_size``, ``status``, ``details``)."""
    snaps = list(snapshots)
    ranks: dict[int, Any] = {}
    version: dict[str, Any] = {}
    network: dict[str, Any] = {}
    links: list[dict[str, Any]] = []
    timeouts: list[dict[str, Any]] = []
    errors: list[str] = []
    for snap in snaps:
        ranks.update(snap.get("ranks", {}))
        version = version or snap.get("version", {})
        network = network or {k: v for k, v in snap.get("network", {}).items() if v}
        links.extend(snap.get("links", []))
        timeouts.extend(snap.get("timeouts", []))
        errors.extend(snap.get("errors", [])[-3:])
    nranks = [r["nranks"] for r in ranks.values() if r.get("nranks")]
    states = [r["state"] for r in ranks.values()] + [s.get("state", "unknown") for s in snaps]
    return {
        "backend": version.get("library"),
        "version": version.get("version"),
        "world_size": max(nranks) if nranks else None,
        "status": worst_state(states),
        "details": {
            "version": version,
            "network": network,
            "ranks": {r: {"state": v["state"], "peers": v["peers"]} for r, v in sorted(ranks.items())},
            "transports": sorted({link["transport"] for link in links}),
            "timeouts": timeouts[-10:],
            "errors": errors[-10:],
        },
    }
