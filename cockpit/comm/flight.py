"""PyTorch's flight recorder: a hang's evidence (docs/rocm.md, item 10). No torch, no textual.

The relaunch with debug logging after a hang (:data:`cockpit.run.watchdog.DEBUG_ENV`) sets
``TORCH_NCCL_TRACE_BUFFER_SIZE`` (each rank keeps its last collectives in a ring buffer) and
``TORCH_NCCL_DUMP_ON_TIMEOUT`` (the buffer is written when a collective times out); the supervisor points
the dumps into the run dir (:func:`flight_env`: ``logs/flight_rank_<N>``). Each dump is a pickle of plain
data (``{"version", "pg_config", "entries": [{"profiling_name": "nccl:all_reduce", "collective_seq_id",
"state": "scheduled" | "started" | "completed", ...}]}``, as ``torch.distributed.flight_recorder`` reads
it); :func:`read_dumps` reads it with an unpickler that builds nothing but builtins and says, per rank,
which collective it was in: its oldest entry not completed, else its last one.
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FLIGHT_ENV = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
BUFFER_VARS = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
FILE_VARS = ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")
PREFIX = "flight_rank_"
MAX_DUMP_BYTES = 64 << 20


def flight_env(env: Mapping[str, str], logs_dir: Path) -> dict[str, str]:
    """Where the ranks write their dumps: the run's logs dir, when the recorder is on and nothing else
    names a file (torch's default is /tmp)."""
    if not any(env.get(v, "0") not in ("", "0") for v in BUFFER_VARS) or any(v in env for v in FILE_VARS):
        return {}
    target = str(Path(logs_dir) / PREFIX)
    return dict.fromkeys(FILE_VARS, target)


class _Plain(pickle.Unpickler):
    """Builtins only (the dump is dicts, lists, tuples, strings and numbers): nothing else is built."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def where_stuck(entries: list[Any]) -> dict[str, Any] | None:
    """A rank's collective when the dump was written: the oldest not completed, else the last."""
    plain = [e for e in entries if isinstance(e, dict)]
    if not plain:
        return None
    pending = [e for e in plain if e.get("state") != "completed"]
    e = pending[0] if pending else plain[-1]
    name = str(e.get("profiling_name") or "?")
    return {
        "op": name.split(":", 1)[-1],
        "seq": e.get("collective_seq_id"),
        "state": e.get("state"),
        "group": (e.get("process_group") or [None])[0] if isinstance(e.get("process_group"), (list, tuple)) else None,
        "pending": len(pending),
    }


def read_dumps(logs_dir: Path) -> dict[str, dict[str, Any]]:
    """Rank (a string, as in events) -> where it was (:func:`where_stuck`), or {"error": ...} for a dump
    that cannot be read; {} when no rank wrote one."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(logs_dir).glob(PREFIX + "*")):
        m = re.fullmatch(re.escape(PREFIX) + r"(\d+)", path.name)
        if not m:
            continue
        try:
            data = path.read_bytes()[:MAX_DUMP_BYTES]
            dump = _Plain(io.BytesIO(data)).load()
            where = where_stuck(list(dump.get("entries") or [])) if isinstance(dump, dict) else None
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
            out[m.group(1)] = {"error": f"{type(exc).__name__}: {exc}"[:120]}
            continue
        out[m.group(1)] = where or {"error": "no collective recorded"}
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def words(flight: Mapping[str, Mapping[str, Any]]) -> str:
    """'r0 all_reduce #412 started · r1 all_reduce #411 completed'."""
    parts = []
    for rank, w in flight.items():
        if w.get("error"):
            parts.append(f"r{rank} ({w['error']})")
        else:
            parts.append(f"r{rank} {w.get('op')} #{w.get('seq')} {w.get('state')}")
    return " · ".join(parts)
