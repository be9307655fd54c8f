"""The compact form of many nodes' telemetry in the event log (``node_telemetry`` and ``heartbeats``
events, ``cockpit/store/events.py``): written by global rank 0 (``cockpit/telemetry/node.py``), read
by the supervisor's watchdog and the cockpit (``cockpit/ui/state.py``).

Why compact: a 64-node job relaying every GPU's full record every few seconds wrote ~75 KB/s to the
event log (1.3 GB a day; a week-long run's log then takes minutes to replay). Here a node's GPUs are
one row of short integer lists, and a tick's heartbeats one mapping step -> node ranges ("0-62,64"):
a healthy run's heartbeats are a few dozen bytes whatever the node count.

- :func:`ranges` / :func:`parse_ranges`: sorted node numbers <-> "0-3,7".
- :func:`grid_row` / :func:`row_devices`: a node's device records <-> its row
  ``{node, host, backend, total_mb, mem, util, temp, power}`` (mem: VRAM used in percent of
  total_mb, an integer; util percent; temp degrees C; power W; null where not measured).
- :func:`fold`: a ``node_telemetry`` event into a mapping node -> telemetry-like record
  ({node_rank, host, backend, devices, unavailable, source}), as readers keep the latest per node.
- :func:`outliers`: the GPUs a screen must not miss (the hottest, the least busy, the fullest),
  as full records with ``node_rank``: written at the heartbeat cadence even when the whole grid
  is written less often.

Pure, stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def ranges(numbers: Iterable[int]) -> str:
    """Sorted, deduplicated numbers as "0-3,7,9-10"."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(set(int(x) for x in numbers)):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [n]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def parse_ranges(text: str | None) -> list[int]:
    """ "0-3,7" -> [0, 1, 2, 3, 7]; "" or None -> []."""
    out: list[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(round(value))


def grid_row(node: int, host: Any, backend: Any, devices: list[dict[str, Any]]) -> dict[str, Any]:
    """One node's GPUs as a compact row (in index order)."""
    totals = [d.get("vram_total_mb") for d in devices]
    known = [float(t) for t in totals if isinstance(t, (int, float)) and t]
    total = max(known) if known else None
    mem: list[int | None] = []
    for d in devices:
        used, tot = d.get("vram_used_mb"), d.get("vram_total_mb")
        mem.append(_int(100.0 * float(used) / float(tot)) if isinstance(used, (int, float)) and tot else None)
    row: dict[str, Any] = {
        "node": int(node),
        "host": host,
        "backend": backend,
        "total_mb": _int(total),
        "mem": mem,
        "util": [_int(d.get("util_pct")) for d in devices],
        "temp": [_int(d.get("temp_c")) for d in devices],
        "power": [_int(d.get("power_w")) for d in devices],
    }
    if len(set(_int(t) for t in totals)) > 1:  # GPUs of different sizes on one node: each one's
        row["totals_mb"] = [_int(t) for t in totals]
    return row


def row_devices(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A row back to device records (``index``, ``vram_used_mb`` from the percent, ...)."""
    mem = row.get("mem") or []
    totals = row.get("totals_mb") or [row.get("total_mb")] * len(mem)

    def at(key: str, i: int) -> Any:
        values = row.get(key) or []
        return values[i] if i < len(values) else None

    out = []
    for i, pct in enumerate(mem):
        total = totals[i] if i < len(totals) else None
        out.append(
            {
                "index": i,
                "vram_used_mb": round(float(pct) * float(total) / 100.0) if pct is not None and total else None,
                "vram_total_mb": total,
                "util_pct": at("util", i),
                "temp_c": at("temp", i),
                "power_w": at("power", i),
            }
        )
    return out


OUTLIER_KEYS = ("index", "vram_used_mb", "vram_total_mb", "util_pct", "temp_c", "power_w")


def outliers(nodes: dict[int, list[dict[str, Any]]], most: int = 2) -> list[dict[str, Any]]:
    """The ``most`` hottest, least busy and fullest GPUs over ``nodes`` (node -> device records),
    each once, as ``{node_rank, why: [...], index, vram_used_mb, ...}``."""
    flat = [(node, d) for node, devs in sorted(nodes.items()) for d in devs]

    def pick(key: Any, why: str, reverse: bool) -> list[tuple[str, int, dict[str, Any]]]:
        have = [(key(d), node, d) for node, d in flat if key(d) is not None]
        have.sort(key=lambda x: (-x[0] if reverse else x[0], x[1], x[2].get("index") or 0))
        return [(why, node, d) for _, node, d in have[:most]]

    def vram(d: dict[str, Any]) -> float | None:
        used, total = d.get("vram_used_mb"), d.get("vram_total_mb")
        return float(used) / float(total) if isinstance(used, (int, float)) and total else None

    chosen: dict[tuple[int, Any], dict[str, Any]] = {}
    for why, node, d in (
        pick(lambda d: d.get("temp_c"), "hottest", True)
        + pick(lambda d: d.get("util_pct"), "least busy", False)
        + pick(vram, "fullest", True)
    ):
        entry = chosen.setdefault(
            (node, d.get("index")), {"node_rank": node, "why": [], **{k: d.get(k) for k in OUTLIER_KEYS}}
        )
        entry["why"].append(why)
    return list(chosen.values())


def fold(nodes: dict[int, dict[str, Any]], ev: dict[str, Any]) -> None:
    """A ``node_telemetry`` event into ``nodes`` (node -> its latest telemetry-like record): each
    row replaces its node's record, then each outlier's full figures replace that GPU's (records
    are replaced, never changed in place)."""
    for row in ev.get("nodes") or []:
        if isinstance(row, dict) and row.get("node") is not None:
            node = int(row["node"])
            nodes[node] = {
                "node_rank": node,
                "host": row.get("host"),
                "backend": row.get("backend"),
                "devices": row_devices(row),
                "ranks": [],
                "unavailable": row.get("unavailable") or {},
                "source": "node_grid",
            }
    for out in ev.get("outliers") or []:
        entry = nodes.get(int(out.get("node_rank") or 0)) if isinstance(out, dict) else None
        if entry is None:
            continue
        fresh = {k: out.get(k) for k in OUTLIER_KEYS}
        devices = [fresh if d.get("index") == fresh["index"] else d for d in entry.get("devices") or []]
        nodes[int(out["node_rank"])] = {**entry, "devices": devices}
