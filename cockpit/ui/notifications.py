"""The cockpit's notifications: a run of its runs dir finished or failed, hangs, or hit a
memory-pressure alert (the rule is ``cockpit.run.notify.notification``, shared with the
supervisor's ``notify_command``), whichever screen is showing.

- :class:`RunWatch` reads, every few seconds in a thread worker, only the new bytes of every run's
  event log, and parses only its ``state`` / ``alert`` / ``run_started`` lines. Runs already in the
  runs dir when the cockpit starts are read from their end (what happened before is not news);
  a run that appears later, from its start.
- The app (``CockpitApp.on_run_notes``) shows each as a Textual toast (``App.notify``), rings the
  bell (``App.bell``), and writes a desktop notification for terminals that have one
  (:func:`osc_sequences`): OSC 9 (iTerm2, WezTerm, kitty, Ghostty) or OSC 777 (VTE terminals such
  as GNOME Terminal, foot, urxvt), wrapped for tmux's passthrough when ``$TMUX`` is set (tmux 3.3+
  passes it on with ``set -g allow-passthrough on``). ``$COCKPIT_TERMINAL_NOTIFY`` overrides the
  guess: ``osc9``, ``osc777``, ``osc9,osc777`` or ``off``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from textual.message import Message

from cockpit.run.notify import notification
from cockpit.store.rundir import list_runs

ENV_TERMINAL = "COCKPIT_TERMINAL_NOTIFY"
NEEDLES = (b'"kind":"state"', b'"kind":"alert"', b'"kind":"run_started"')


class RunNotes(Message):
    """Notifications found by the watch worker, for the app (posted from the worker's thread)."""

    def __init__(self, notes: list[dict[str, Any]]) -> None:
        super().__init__()
        self.notes = notes


@dataclass
class _Tail:
    offset: int
    pending: bytes = b""
    told: set[str] = field(default_factory=set)  # the ends told for this attempt (failed is written twice)

    def read(self, path: Path) -> list[dict[str, Any]]:
        try:
            if path.stat().st_size <= self.offset:
                return []
            with open(path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return []
        self.offset += len(chunk)
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()
        events = []
        for line in lines:
            if any(n in line for n in NEEDLES):
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if isinstance(ev, dict):
                    events.append(ev)
        return events


class RunWatch:
    """The new notable events of every run in ``runs_dir`` since the previous :meth:`poll`."""

    def __init__(self, runs_dir: str | os.PathLike[str]) -> None:
        self.runs_dir = Path(runs_dir)
        self.tails: dict[str, _Tail] = {}
        self.polled = False
        self._lock = threading.Lock()

    def poll(self) -> list[dict[str, Any]]:
        if not self._lock.acquire(blocking=False):  # the previous poll still runs
            return []
        try:
            return self._poll()
        finally:
            self._lock.release()

    def _poll(self) -> list[dict[str, Any]]:
        first, self.polled = not self.polled, True
        notes: list[dict[str, Any]] = []
        for run in list_runs(self.runs_dir):
            tail = self.tails.get(run.run_id)
            if tail is None:
                try:
                    size = run.events_path.stat().st_size if first else 0
                except OSError:
                    size = 0
                tail = self.tails[run.run_id] = _Tail(size)
            for ev in tail.read(run.events_path):
                if ev.get("kind") == "run_started":
                    tail.told.clear()
                    continue
                note = notification(ev, run.run_id, run.path)
                if note is None:
                    continue
                if ev.get("kind") == "state":
                    if note["event"] in tail.told:
                        continue
                    tail.told.add(note["event"])
                notes.append(note)
        return notes


def _clean(text: str, limit: int = 240) -> str:
    """One line without control characters (they would end the escape sequence early)."""
    text = "".join(ch if ch >= " " and ch != "\x7f" else " " for ch in str(text))
    return " ".join(text.split())[:limit]


def osc_kinds(env: Mapping[str, str]) -> tuple[str, ...]:
    """Which desktop-notification sequences this terminal understands, guessed from its
    environment (which survives into tmux and over SSH for the ones named), or as
    ``$COCKPIT_TERMINAL_NOTIFY`` says."""
    override = (env.get(ENV_TERMINAL) or "").strip().lower()
    if override:
        return tuple(k for k in ("osc9", "osc777") if k in override.replace(" ", "").split(","))
    term, program = env.get("TERM", ""), env.get("TERM_PROGRAM", "")
    kinds: list[str] = []
    if (
        program in ("iTerm.app", "WezTerm", "ghostty")
        or env.get("LC_TERMINAL") == "iTerm2"
        or any(
            env.get(k) for k in ("ITERM_SESSION_ID", "WEZTERM_EXECUTABLE", "KITTY_WINDOW_ID", "GHOSTTY_RESOURCES_DIR")
        )
        or term in ("xterm-kitty", "xterm-ghostty")
    ):
        kinds.append("osc9")
    elif env.get("VTE_VERSION") or term.startswith(("foot", "rxvt-unicode")):
        kinds.append("osc777")
    return tuple(kinds)


def osc_sequences(title: str, body: str, env: Mapping[str, str]) -> str:
    """The desktop-notification escape sequences for this terminal ('' for none), each wrapped in
    tmux's passthrough (``ESC P tmux; ... ESC \\``, inner ESCs doubled) when ``$TMUX`` is set."""
    title, body = _clean(title, 80).replace(";", ","), _clean(body)
    out = []
    for kind in osc_kinds(env):
        seq = f"\x1b]9;{title}: {body}\x07" if kind == "osc9" else f"\x1b]777;notify;{title};{body}\x07"
        if env.get("TMUX"):
            seq = "\x1bPtmux;" + seq.replace("\x1b", "\x1b\x1b") + "\x1b\\"
        out.append(seq)
    return "".join(out)


SEVERITY = {"info": "information", "warn": "warning", "error": "error"}
