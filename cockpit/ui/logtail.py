"""Incremental tail of a run's log files (``logs/rank*.log``, ``logs/supervisor.log``), and the
readable view of it the Live pane shows (:class:`ReadableLog`).

Only new bytes are read; the kept lines are bounded (a deque). No textual here.
"""

from __future__ import annotations

import re
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


# -- the Live pane's readable log ------------------------------------------------------------------
_TAG = re.compile(r"^\[[\w.-]+\] ?")
_WARNING = re.compile(r"Warning\b|warnings\.warn|\[WARNING\]|\bWARNING\b|^W\d{4} |\bwarn\(", re.IGNORECASE)
# transformers' (and TRL's) logger lines, through its own handler: "[transformers] Tried to track the number
# of tokens seen..." (no level in the line; the ranks print it at warning level, often after every step)
_LIBRARY_LOG = re.compile(r"^(\[[\w.-]+\] )?\[transformers\] ")
_NOISE = re.compile(
    r"^\{'(loss|eval_loss|train_runtime|grad_norm|learning_rate|epoch)'"  # HF Trainer's metric dicts: the step lines say them
    r"|\d+%\|[^|]*\|"  # tqdm progress bars
    r"|^(\[rank\d+\] )?held-out (before|after): "  # the rank's own line: the held_out event says it, in its place
    r"|^\s*$"
)
# event kinds the pane shows, as `cockpit attach` prints them (cockpit.run.follow.format_event)
EVENT_KINDS = frozenset(
    {
        "run_started",
        "train_begin",
        "step",
        "eval",
        "probe_results",
        "held_out",
        "progress",
        "checkpoint_saved",
        "alert",
        "run_finished",
        "run_stopped",
        "run_failed",
        "stop_requested",
    }
)


def classify(line: str, previous: str = "") -> str:
    """``warning`` (with its indented continuation lines), ``noise`` (metric dicts, progress
    bars, blanks: said better elsewhere) or ``text``."""
    body = _TAG.sub("", line, count=1)
    if previous == "warning" and body[:1].isspace() and body.strip():
        return "warning"
    if _WARNING.search(body) or _LIBRARY_LOG.match(line):
        return "warning"
    if _NOISE.search(body):
        return "noise"
    return "text"


class ReadableLog:
    """What the Live pane shows: the run's events as ``cockpit attach`` prints them (step lines,
    probes, checkpoints, alerts), the log lines that say something, and every warning folded
    into one counted line (``expanded``: the warnings themselves). The raw log is LogTail's.

    Log lines are placed after the events that had arrived when they were read (``marker``:
    the RunState's event count then)."""

    def __init__(self, max_lines: int = 2000) -> None:
        self.text: deque[tuple[int, str]] = deque(maxlen=max_lines)
        self.warnings: deque[str] = deque(maxlen=max_lines)
        self.warning_count = 0
        self.hidden = 0
        self._previous = ""

    def add(self, lines: list[str], marker: int, history: bool = False) -> None:
        """New raw log lines; ``history``: lines from before the screen opened (only counted:
        they have no place among the replayed events; the raw log has them)."""
        for line in lines:
            kind = self._previous = classify(line, self._previous)
            if kind == "warning":
                if not _TAG.sub("", line, count=1)[:1].isspace():
                    self.warning_count += 1
                self.warnings.append(line)
            elif kind == "noise":
                self.hidden += 1
            elif not history:
                self.text.append((marker, line))

    def fold_line(self, expanded: bool) -> str:
        if not self.warning_count:
            return ""
        verb = "w: fold them" if expanded else "w: show"
        return f"⚠ {self.warning_count} warning(s) folded ({verb}) · l: the raw log"

    def view(
        self, events: list[tuple[int, dict]], rows: int, expanded: bool = False, start_t: float | None = None
    ) -> list[str]:
        """The last ``rows`` lines: events and log text in order, the fold line last."""
        from cockpit.run.follow import format_event

        fold = self.fold_line(expanded)
        room = max(1, rows - (1 if fold else 0))
        if expanded:
            return [*list(self.warnings)[-room:], fold]
        merged: list[str] = []
        text = list(self.text)
        ti = len(text)
        # walk back from the newest, taking events and text lines by their order, until full
        ei = len(events)
        while len(merged) < room and (ei > 0 or ti > 0):
            if ti > 0 and (ei == 0 or text[ti - 1][0] >= events[ei - 1][0]):
                ti -= 1
                merged.extend(reversed([text[ti][1]]))
            else:
                ei -= 1
                s = format_event(events[ei][1], start_t)
                if s:
                    merged.extend(reversed(s.splitlines()))
        out = merged[:room][::-1]
        return [*out, fold] if fold else out
