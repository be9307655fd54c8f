"""Incremental tail of a run's log files (``logs/rank*.log``, ``logs/supervisor.log``).

Only new bytes are read; the kept lines are bounded (a deque). No textual here.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path


class LogTail:
    def __init__(self, logs_dir: Path, max_lines: int = 5000, first_read_bytes: int = 256 << 10):
        self.logs_dir = Path(logs_dir)
        self.lines: deque[str] = deque(maxlen=max_lines)
        self.offsets: dict[str, int] = {}
        self.pending: dict[str, bytes] = {}
        self.first_read_bytes = first_read_bytes
        self.total = 0  # lines ever kept (viewers compare it with what they have shown)

    def files(self) -> list[Path]:
        if not self.logs_dir.is_dir():
            return []
        ranks = sorted(self.logs_dir.glob("rank*.log"), key=lambda p: (len(p.name), p.name))
        sup = self.logs_dir / "supervisor.log"
        return ranks + ([sup] if sup.exists() else [])

    def read_new(self) -> list[str]:
        """New complete lines, each prefixed by its file's short name when several exist."""
        out: list[str] = []
        files = self.files()
        many = len([f for f in files if f.stat().st_size > 0]) > 1 if files else False
        for path in files:
            name = path.name
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            off = self.offsets.get(name)
            if off is None:  # first look: only the end of a big file
                off = max(0, size - self.first_read_bytes)
            if size < off:  # truncated / replaced
                off = 0
            if size == off:
                self.offsets[name] = off
                continue
            with open(path, "rb") as fh:
                fh.seek(off)
                chunk = fh.read(size - off)
            self.offsets[name] = off + len(chunk)
            data = self.pending.get(name, b"") + chunk
            parts = data.split(b"\n")
            self.pending[name] = parts.pop()
            tag = name[:-4] if many else ""
            for raw in parts:
                line = raw.decode("utf-8", "replace").rstrip("\r")
                if "\r" in line:  # progress bars: keep the last frame
                    line = line.rsplit("\r", 1)[-1]
                out.append(f"[{tag}] {line}" if tag else line)
        self.lines.extend(out)
        self.total += len(out)
        return out

    def search(self, needle: str) -> list[str]:
        if not needle:
            return list(self.lines)
        low = needle.lower()
        return [ln for ln in self.lines if low in ln.lower()]
