"""Which run's work an ``output_dir`` holds: what a run produced stays that run's.

A config's ``output_dir`` (LLaMA-Factory's ``output_dir: saves/smol/lora/sft`` with
``overwrite_output_dir: true``) is a folder outside the run dir that a later run may write again. So:

- rank 0 marks the folder when its run starts training there (``cockpit_run.json``: run id, run dir,
  ``claimed``) and again when it has saved its adapter (``adapter_dir``, ``adapter_fingerprint``,
  ``written``); summary.json keeps the same ``adapter_fingerprint`` (every run, whatever its output_dir);
- every reader of a finished run's adapter (export, serve, chat, the Summary screen) asks
  :func:`foreign_adapter`: the adapter's files fingerprinted again and compared with summary.json's,
  and the mark naming the run that wrote over it.

The fingerprint is a SHA-256 over each file's name, size and content; a file over ``WHOLE_BYTES``
(a full model's shards) is taken by size and modification time instead, so that asking costs
milliseconds. No torch, no textual.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from cockpit.store.rundir import RunDir, atomic_write_json

MARK = "cockpit_run.json"
WHOLE_BYTES = 16 * 2**20  # files up to this size are hashed whole (a LoRA adapter, the tokenizer)


def fingerprint(folder: Path) -> str | None:
    """The adapter's (or saved model's) files as one digest; None when the folder holds none."""
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file()) if Path(folder).is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        st = f.stat()
        digest.update(f"{f.relative_to(folder).as_posix()}\0{st.st_size}\0".encode())
        if st.st_size > WHOLE_BYTES:
            digest.update(str(st.st_mtime_ns).encode())
            continue
        with f.open("rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def read_mark(out: Path) -> dict[str, Any]:
    """``out``'s mark ({} when there is none or it cannot be read)."""
    try:
        mark = json.loads((Path(out) / MARK).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return mark if isinstance(mark, dict) else {}


def claim(out: Path, run: RunDir) -> None:
    """``run`` starts writing into ``out`` (rank 0, before its first step)."""
    atomic_write_json(Path(out) / MARK, {"run_id": run.run_id, "run_dir": str(run.path), "claimed": time.time()})


def stamp(out: Path, run: RunDir, adapter: Path) -> str | None:
    """``run`` has saved its adapter at ``adapter`` (in ``out``); its fingerprint, also in the mark."""
    mark = read_mark(out)
    fp = fingerprint(adapter)
    atomic_write_json(
        Path(out) / MARK,
        {
            "run_id": run.run_id,
            "run_dir": str(run.path),
            "claimed": mark.get("claimed") if mark.get("run_id") == run.run_id else time.time(),
            "adapter_dir": str(adapter),
            "adapter_fingerprint": fp,
            "written": time.time(),
        },
    )
    return fp


def foreign_adapter(run: RunDir, summary: dict[str, Any]) -> str | None:
    """Why the adapter summary.json names is no longer ``run``'s (another run wrote over its
    output_dir, or its files changed since); None while it is, or when there is none to judge."""
    if not summary.get("adapter_dir"):
        return None
    adapter = Path(summary["adapter_dir"])
    mark = read_mark(adapter.parent)
    other = mark.get("run_id") if mark.get("run_id") not in (None, run.run_id) else None
    own = summary.get("adapter_fingerprint")
    if other is None and (not adapter.is_dir() or not own):
        return None  # gone (the callers say so), or a run from before the fingerprint: nothing says otherwise
    if adapter.is_dir() and own and fingerprint(adapter) == own:
        return None
    if other:
        when = mark.get("written") or mark.get("claimed")
        at = time.strftime(" on %Y-%m-%d %H:%M", time.localtime(when)) if isinstance(when, int | float) else ""
        return (
            f"the adapter in {adapter} is no longer {run.run_id}'s: run {other} wrote into the same "
            f"output_dir {adapter.parent}{at} (overwrite_output_dir); its weights are that run's, not this one's"
        )
    return (
        f"the adapter in {adapter} is no longer {run.run_id}'s: its files changed after the run saved them "
        "(they differ from summary.json's adapter_fingerprint)"
    )
