"""``cockpit`` with no command: the Textual app.

Modes (each its own screen stack): ``runs`` (Runs -> Live / Summary), ``setup``, ``doctor``.
Everything heavy runs through the CLI in subprocesses; this process never imports torch,
transformers or peft, and quitting it never stops a run (runs belong to their supervisors).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from textual import events, work
from textual.app import App, ScreenStackError
from textual.await_complete import AwaitComplete
from textual.binding import Binding
from textual.command import CommandPalette, DiscoveryHit, Hit, Hits, Provider
from textual.css.query import NoMatches

from cockpit.store.rundir import RunDir, default_runs_dir, list_runs


class CockpitCommands(Provider):
    """Command palette entries: screens, presets, runs."""

    def _commands(self) -> list[tuple[str, Callable[[], Any], str]]:
        from cockpit.ui.presets import list_presets

        app: CockpitApp = self.app  # type: ignore[assignment]
        cmds: list[tuple[str, Callable[[], Any], str]] = [
            ("Setup: new run", partial(app.action_go, "setup"), "the forms, presets, launch"),
            ("Runs", partial(app.action_go, "runs"), "every run in the runs dir"),
            ("Doctor", partial(app.action_go, "doctor"), "check this machine (cockpit doctor)"),
        ]
        for p in list_presets():
            cmds.append((f"Preset: {p.name}", partial(app.load_preset, p.path), f"load {p.path} into Setup"))
        from cockpit.ui.screens.chat import open_chat
        from cockpit.ui.screens.run_actions import RESUMABLE

        cmds += self._screen_commands()
        for name in sweep_names(app.runs_dir):
            cmds.append((f"Sweep: {name}", partial(app.open_sweep, name), "its trials, the best, importance"))
        for r in reversed(list_runs(app.runs_dir)[-50:]):
            cmds.append((f"Run: {r.run_id}", partial(app.open_run, r), "open its live view or summary"))
            state = r.read_status().get("state")
            if state == "finished":
                cmds.append(
                    (f"Chat: {r.run_id}", partial(open_chat, app, r), "base vs tuned side by side (cockpit chat)")
                )
            elif state in RESUMABLE:
                cmds.append(
                    (f"Resume: {r.run_id}", partial(app.resume_run, r), f"{state}: continue from its checkpoint")
                )
        return cmds

    def _screen_commands(self) -> list[tuple[str, Callable[[], Any], str]]:
        """The keys of the screen the palette was opened on (Live: stop, save, kill, plot, ...)."""
        below = self.screen
        if type(below).__name__ != "LiveScreen":
            return []
        run_id = below.run.run_id  # type: ignore[attr-defined]  # the Live screen
        return [
            (f"Live: {b.description.lower()} ({run_id})", getattr(below, f"action_{b.action}"), f"key {b.key}")
            for b in below.BINDINGS
            if isinstance(b, Binding) and b.action in ("save", "stop", "kill", "plot", "logs", "warnings", "search")
        ]

    async def discover(self) -> Hits:
        for name, cb, help_text in self._commands():
            yield DiscoveryHit(name, cb, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, cb, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), cb, help=help_text)


def sweep_names(runs_dir: Path) -> list[str]:
    """The sweeps of the runs dir (``<runs>/sweeps/<name>/spec.yaml``), newest first; no Optuna."""
    found = [p for p in (runs_dir / "sweeps").glob("*/spec.yaml")] if (runs_dir / "sweeps").is_dir() else []
    return [p.parent.name for p in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)]


class CockpitPalette(CommandPalette):
    """Textual's command palette, safe to close from outside while it is still working.

    F2 / F3 / F4 close an open palette and switch mode in the same key (:meth:`CockpitApp.action_go`).
    The palette runs in its own task: an Enter, a search or a selection typed just before the F-key
    can still be in its queue, and Textual's palette then dismissed itself a second time, popping the
    screen of the mode just switched to (``ScreenStackError``), or its search ran on a palette being
    taken apart (``NoMatches``). Closed here, it cancels its search as Esc does, and a later dismiss
    is a no-op. Each palette has its own id: a palette closed a moment ago is removed from the app
    only after the app's next message, which can be the next Ctrl+P (``DuplicateIds`` on
    ``--command-palette``: issue 50)."""

    _serial = 0

    def __init__(self) -> None:
        CockpitPalette._serial += 1
        super().__init__(id=f"--command-palette-{CockpitPalette._serial}")
        self.closed = False

    @work(exclusive=True, group=CommandPalette._GATHER_COMMANDS_GROUP)
    async def _gather_commands(self, search_value: str) -> None:
        """Textual's search; none once the palette is closed (a search queued before the close ran on a
        palette whose widgets were gone: ``NoMatches`` on ``CommandList``, a crash)."""
        if self.closed:
            return
        try:
            await CommandPalette._gather_commands.__wrapped__(self, search_value)  # type: ignore[attr-defined]
        except NoMatches:
            if not self.closed:
                raise

    def close_palette(self) -> None:
        """Close the palette as Esc does (its search cancelled, ``Closed`` posted); once."""
        if not self.closed:
            self._cancel_gather_commands()
            self.app.post_message(CommandPalette.Closed(option_selected=False))
            self.dismiss(None)

    def dismiss(self, result: Any = None) -> AwaitComplete:
        if self.closed or not self.is_active:  # closed already: the queued second dismiss pops nothing
            return AwaitComplete(_nothing())
        self.closed = True
        return super().dismiss(result)


async def _nothing() -> None:
    return None


def _lazy_screen(module: str, name: str) -> Callable[[], Any]:
    """A mode's screen, imported when the mode is first shown (the first frame waits for none else)."""

    def make():
        import importlib

        return getattr(importlib.import_module(f"cockpit.ui.screens.{module}"), name)()

    return make


class CockpitApp(App):
    CSS_PATH = "app.tcss"
    SCREENS_BY_MODE = {  # mode -> the screen it starts with, imported when first shown
        "runs": _lazy_screen("runs", "RunsScreen"),
        "setup": _lazy_screen("setup", "SetupScreen"),
        "doctor": _lazy_screen("doctor", "DoctorScreen"),
    }
    TITLE = "cockpit"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (40, "-tall")]
    COMMANDS = App.COMMANDS | {CockpitCommands}
    BINDINGS = [
        # priority: they work over the keys view, the palette and dialogs too (action_go closes those)
        Binding("f2", "go('setup')", "Setup", priority=True),
        Binding("f3", "go('runs')", "Runs", priority=True),
        Binding("f4", "go('doctor')", "Doctor", priority=True),
        Binding("ctrl+q", "quit", "Quit (runs keep going)", priority=True),
        Binding("question_mark", "toggle_keys", "Keys", key_display="?"),
    ]

    def __init__(
        self,
        runs_dir: str | Path | None = None,
        *,
        start: str = "auto",
        clock: Callable[[], float] | None = None,
        poll_s: float = 0.25,
        runs_refresh_s: float = 2.0,
        follow: bool = True,
        start_preset: str | Path | None = None,
        doctor_checks: list[dict] | Mapping[str, list[dict]] | None = None,  # the doctor's answer (tests; setup_launch)
        open_run: str | None = None,
        machine: Any = None,
        notify_poll_s: float = 2.0,
    ) -> None:
        self.runs_dir = Path(runs_dir).expanduser() if runs_dir else default_runs_dir()
        if start == "auto":
            start = "runs" if list_runs(self.runs_dir) else "setup"
        # The start mode's screen is the app's default screen (get_default_screen), the other modes
        # are added as modes: no blank screen drawn then replaced, and no CSS refresh that a mode
        # switch costs (together ~0.25 s of the first frame). Textual reads DEFAULT_MODE in __init__.
        self.DEFAULT_MODE = start  # type: ignore[misc]  # per instance on purpose
        super().__init__()
        for mode, make in self.SCREENS_BY_MODE.items():
            if mode != start:
                self.add_mode(mode, make)
        self.clock = clock or time.time
        self.poll_s = poll_s
        self.runs_refresh_s = runs_refresh_s
        self.follow = follow
        self.start = start
        self.start_preset = start_preset
        self.doctor_checks = doctor_checks
        self.open_run_ref = open_run
        self.machine = machine  # cockpit.ui.widgets.Machine; None: detected when first shown
        self.notify_poll_s = notify_poll_s
        self.run_watch: Any = None  # cockpit.ui.notifications.RunWatch, from the first poll

    def get_default_screen(self):
        """The start mode's screen (Textual asks once, for the mode it starts in). The start mode is
        registered here, once its stack exists: unregistered, switching back to it raised
        ``UnknownModeError`` (F4 then F3 with runs present; n on Runs after a first launch)."""
        make = self.SCREENS_BY_MODE[self.DEFAULT_MODE]
        if self.DEFAULT_MODE not in self._modes:
            self.add_mode(self.DEFAULT_MODE, make)
        return make()

    def on_mount(self) -> None:
        if self.notify_poll_s:
            self.set_interval(self.notify_poll_s, self._watch_runs)
        if self.open_run_ref:
            from cockpit.store.rundir import resolve_run

            try:
                self.open_run(resolve_run(self.open_run_ref, self.runs_dir))
            except LookupError as exc:
                self.notify(str(exc), severity="error")

    # -- notifications: a run finished / failed / hangs / memory pressure, whatever the screen ---------
    def _watch_runs(self) -> None:
        self.run_worker(self._poll_runs, thread=True, group="run-watch", exit_on_error=False)

    def _poll_runs(self) -> None:
        """(thread) the runs dir's new notable events, posted to the app as one RunNotes."""
        from cockpit.ui.notifications import RunNotes, RunWatch

        if self.run_watch is None:
            self.run_watch = RunWatch(self.runs_dir)
        notes = self.run_watch.poll()
        if notes:
            self.post_message(RunNotes(notes))

    def on_run_notes(self, message: Any) -> None:
        """A toast per notification and the bell once, except for the run whose Live screen is showing
        (its header and alerts pane say it, and it rings the bell at the end: no toast over its log,
        issue 29); the terminal's own desktop notification for every one."""
        import os

        from cockpit.ui.notifications import SEVERITY, osc_sequences
        from cockpit.ui.screens.live import LiveScreen

        try:
            shown = self.screen
        except ScreenStackError:  # the app is closing (its screens are gone): no one to tell
            return
        watched = shown.run.run_id if isinstance(shown, LiveScreen) else None
        told = False
        for note in message.notes:
            self.write_terminal(osc_sequences(f"cockpit: {note['title']}", note["message"], os.environ))
            if note["run_id"] == watched:
                continue
            severity = SEVERITY.get(note["level"], "information")
            self.notify(
                note["message"],
                title=note["title"],
                severity=severity,  # type: ignore[arg-type]  # one of Textual's three
                timeout=30 if severity == "error" else 12,
                markup=False,
            )
            told = True
        if told:
            self.bell()

    def write_terminal(self, data: str) -> None:
        """Raw escape sequences to the terminal (none headless or under the web driver's page)."""
        if data and not self.is_headless and self._driver is not None:
            self._driver.write(data)

    async def on_event(self, event: events.Event) -> None:
        """Keys typed after the app began to close (the palette's Quit, then more keys at once) reach no
        screen: Textual's key handler then raised ``ScreenStackError`` and the exit code was 1."""
        if isinstance(event, events.Key) and not self._screen_stacks.get(self._current_mode):
            return
        await super().on_event(event)

    def action_command_palette(self) -> None:
        """Ctrl+P: the palette (:class:`CockpitPalette`), unless the shown screen is one."""
        if self.use_command_palette and not CommandPalette.is_open(self):
            self.push_screen(CockpitPalette())

    def action_toggle_keys(self) -> None:
        """``?``: the current screen's keys and what they do (a modal; ? or Esc closes it)."""
        from cockpit.ui.screens.modals import KeysView

        if isinstance(self.screen, KeysView):
            self.pop_screen()
        else:
            self.push_screen(KeysView(self.screen))

    # -- navigation used by screens and the palette -------------------------------------------------
    def action_go(self, mode: str) -> None:
        """F2 / F3 / F4 (and the palette): show a mode's own screen. What covers it is closed first
        (the keys view, the palette, a dialog: dismissed, so its caller hears "cancel"); the mode
        opens on its base screen (F3 is the Runs list, also from Live or Summary, which are pushed on
        the runs mode; leaving a mode keeps them until then)."""
        if mode != self.current_mode:
            while self.screen.is_modal:
                shown = self.screen
                if isinstance(shown, CockpitPalette):
                    CockpitPalette.close_palette(shown)
                else:
                    shown.dismiss(None)
                if self.screen is shown:  # (not popped: never loop)
                    break
            self.switch_mode(mode)
        while len(self.screen_stack) > 1:
            self.screen.dismiss(None)

    def show_on_runs(self, screen: Any) -> None:
        """Push ``screen`` (Live, Summary, Chat) on the Runs screen: one run's view at a time."""
        self.action_go("runs")
        self.push_screen(screen)

    def open_live(self, run: RunDir, on_top: bool = False) -> None:
        """``run``'s Live screen on Runs, or ``on_top`` of the current screen (the Summary's event view)."""
        from cockpit.ui.screens.live import LiveScreen

        if on_top:
            self.push_screen(LiveScreen(run))
        else:
            self.show_on_runs(LiveScreen(run))

    def open_summary(self, run: RunDir, on_top: bool = False) -> None:
        """``run``'s Summary on Runs, or ``on_top`` of the current screen (the Sweep screen's trial)."""
        from cockpit.ui.screens.summary import SummaryScreen

        if on_top:
            self.push_screen(SummaryScreen(run))
        else:
            self.show_on_runs(SummaryScreen(run))

    def open_sweep(self, name: str, runs_dir: Path | None = None) -> None:
        """The Sweep screen of the sweep ``name`` (``<runs>/sweeps/<name>``) on Runs."""
        from cockpit.ui.screens.sweep import SweepScreen

        self.show_on_runs(SweepScreen(name, runs_dir))

    def open_run(self, run: RunDir) -> None:
        from cockpit.store.rundir import TERMINAL_STATES

        if run.read_status().get("state") in TERMINAL_STATES:
            self.open_summary(run)
        else:
            self.open_live(run)

    def resume_run(self, run: RunDir) -> None:
        """The palette's "Resume: RUN": the Runs screen's resume (a confirmation, then cockpit resume)."""
        self.action_go("runs")
        runs = self.screen
        runs.resume_selected(run)  # type: ignore[attr-defined]  # the Runs screen

    def load_preset(self, path: Path) -> None:
        self.action_go("setup")
        self.call_after_refresh(lambda: self.screen.load_preset(Path(path)))  # type: ignore[attr-defined]  # the setup screen


def run_app(args: Any = None) -> int:
    import os
    import signal
    import sys

    runs_dir = getattr(args, "ui_runs_dir", None) or getattr(args, "runs_dir", None)
    # The terminal went away (SSH drop, tmux killed): leave at once. Runs are owned by their
    # supervisors, so nothing is lost; without this a UI with no terminal could linger.
    signal.signal(signal.SIGHUP, lambda *_: os._exit(129))
    config = getattr(args, "config", None)
    if config and not os.path.isfile(os.path.expanduser(config)):
        print(f"cockpit: {config}: no such file", file=sys.stderr)
        return 2
    # cockpit CONFIG.yaml: Setup with the config in the form (relative paths in it read from here)
    app = CockpitApp(
        runs_dir, start="setup" if config else "auto", start_preset=os.path.expanduser(config) if config else None
    )
    return run_to_exit(app)


def run_to_exit(app: App, headless: bool = False) -> int:
    """Run ``app``; its exit code: an exception in the UI exits 1 (Textual's return code), not 0."""
    app.run(headless=headless)
    return app.return_code or 0
