"""The Live screen: one run, followed from its event log (replayed, then live).

Reading: a thread worker folds the existing history in chunks (a huge log keeps the screen
responsive), then a timer reads only the bytes appended since the last tick. Drawing happens
only when the state's ``version`` changed. Controls go through ``RunDir.request`` (files), so
leaving or quitting the UI never stops the run.

After a hang alert, ``r`` stops the run (stop, then kill after a grace: hung ranks never reach
the step boundary where a stop is consumed) and starts it again through ``cockpit train
--detach`` with the alert's remedy merged into the config's ``env``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Input, Static
from textual.worker import get_current_worker

from cockpit.store.rundir import RunDir
from cockpit.ui import device_grid, formatting
from cockpit.ui.logtail import LogTail, ReadableLog
from cockpit.ui.messages import WorkerMessage, post_or_run
from cockpit.ui.palette import themed
from cockpit.ui.panes import (
    AlertsPane,
    CompletionsPane,
    DevicesPane,
    ExpertsPane,
    SparkGrid,
    StepBar,
    TextPane,
    metric_grid,
    stage_grid,
)
from cockpit.ui.screens import on_top
from cockpit.ui.state import RunFollower, RunState


class LiveScreen(Screen):
    AUTO_FOCUS = None
    BINDINGS = [
        Binding("s", "save", "Save ckpt"),
        Binding("x", "stop", "Stop"),
        Binding("k", "kill", "Kill"),
        Binding("r", "relaunch", "Relaunch (hang)", show=False),  # the alerts pane says it, after a hang
        Binding("m", "memory_remedy", "Memory remedy", show=False),  # the alerts pane says it, after a memory alert
        Binding("p", "plot", "Plot"),
        Binding("l", "logs", "Raw log"),
        Binding("w", "warnings", "Warnings"),
        Binding("c", "completions", "Completions", show=False),  # grpo: the pane says it
        Binding("slash", "search", "Search"),
        Binding("n", "node(1)", "Next node", show=False),  # several nodes: the devices pane says it
        Binding("N", "node(-1)", "Previous node", show=False),
        Binding("o", "least_busy_node", "Least busy node", show=False),
        Binding("a", "all_nodes", "All nodes", show=False),
        Binding("enter", "summary", "Summary"),  # shown once the run has ended
        Binding("escape,q", "leave", "Leave"),
    ]

    RELAUNCH_STOP_GRACE_S = 10.0  # a stop first (saves a checkpoint if the ranks are not hung)
    RELAUNCH_KILL_GRACE_S = 20.0  # then kill; then the supervisor's process group is killed

    LOG_PERIOD_S = 1.0  # the log pane: new lines read and drawn once per second

    class ReplayProgress(WorkerMessage):
        """The replay worker has folded more of the history: draw it."""

    class Replayed(WorkerMessage):
        """The replay worker has read the whole history: follow from here."""

    class Relaunched(WorkerMessage):
        """``cockpit train --detach`` of the relaunch answered (a ``cli_calls.CliResult``)."""

    class Resumed(WorkerMessage):
        """``cockpit resume --stop --detach`` answered (a ``cli_calls.CliResult``)."""

    def __init__(self, run: RunDir, poll_s: float | None = None) -> None:
        super().__init__(name=f"live-{run.run_id}")
        self.run = run
        self.follower = RunFollower(run)
        self.state = self.follower.state
        self._state_lock = threading.Lock()  # not `self.lock`: Textual's own (an asyncio RLock, used by Widget.batch)
        self.tail = LogTail(run.logs_dir)
        self.readable = ReadableLog()
        self.warnings_open = False
        self._ended_when_opened: bool | None = None  # known once the history is read
        self._finish_told = False
        self.poll_s = poll_s
        self.replay_progress: float | None = 0.0
        self.peeked: RunState | None = None
        self._drawn_version = -1
        self._logs_at = 0.0
        self._header_at = 0.0
        self._needle = ""
        self._log_seen = 0

    # -- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Vertical(id="live-top"):
            yield TextPane(id="live-title")
            yield StepBar(total=None, show_eta=False, id="live-progress")
        yield metric_grid()
        yield stage_grid()  # dpo / kto / rm: shown once the run reports them
        with Horizontal(id="live-mid"):
            yield DevicesPane(id="devices", classes="pane")
            yield AlertsPane(id="alerts", classes="pane")
        yield CompletionsPane(id="completions")  # grpo: shown once the run reports sampled completions
        yield ExpertsPane(id="experts")  # a mixture-of-experts run: shown once it reports its expert load
        yield Input(
            placeholder="search the log; Enter keeps the filter, Esc clears it",
            id="log-search",
            classes="hidden",
            disabled=True,
        )
        yield Static(id="log")  # the tail only, redrawn without a layout pass; `l` opens the scrollable log
        yield Footer()

    def on_mount(self) -> None:
        import os

        self.app.sub_title = self.run.run_id
        # the panes, found once: draw() and the 4 Hz poll ask them every tick (a DOM query per tick was
        # a measurable part of the follow CPU)
        self._grids = list(self.query(SparkGrid))
        self._devices, self._alerts = self.query_one(DevicesPane), self.query_one(AlertsPane)
        self._completions = self.query_one(CompletionsPane)
        self._experts = self.query_one(ExpertsPane)
        self._bar = self.query_one("#live-progress", StepBar)
        try:
            big = os.path.getsize(self.run.events_path) > (4 << 20)
        except OSError:
            big = False
        self.peeked = self.follower.peek() if big else None  # the header, at once, for a big log
        self._replay()
        self.set_interval(1.0, self._tick_clock)

    # -- reading ----------------------------------------------------------------------------
    @property
    def clock(self):
        return getattr(self.app, "clock", None) or __import__("time").time

    @work(thread=True, exclusive=True, group="replay")
    def _replay(self) -> None:
        import os

        try:
            size = os.path.getsize(self.run.events_path)
        except OSError:
            size = 0
        # a huge history is sampled (every stride-th step line) up to its last few MB
        exact_from = max(0, size - (4 << 20))
        stride = max(1, exact_from // (self.state.capacity * 16 * 300))
        last_draw = 0.0
        worker = get_current_worker()
        while not worker.is_cancelled:  # cancelled: the screen was left
            f = self.follower
            events, done = f.read_chunk(stride if f.reader.offset < exact_from else 1)
            with self._state_lock:
                f.state.apply(events)
                self.replay_progress = None if done else (f.reader.offset / size if size else None)
            if done:
                break
            if time.monotonic() - last_draw > 0.5:  # progress, not a redraw per chunk
                self.post_message(self.ReplayProgress())
                last_draw = time.monotonic()
            time.sleep(0.005)  # let the UI thread have the GIL: keys stay responsive
        self.post_message(self.Replayed())

    @on(ReplayProgress)
    def _replay_progress(self) -> None:
        self.draw()  # under the state lock, as the worker applies events under it

    @on(Replayed)
    def _start_following(self) -> None:
        self.replay_progress = None
        self._ended_when_opened = self.state.ended
        self._read_logs(history=True)
        self.draw()
        interval = self.poll_s or getattr(self.app, "poll_s", 0.25)
        if getattr(self.app, "follow", True):
            self.set_interval(interval, self._poll)

    def _poll(self) -> None:
        with self._state_lock:
            changed = self.follower.poll(max_chunks=4)
        if changed or self._held_back_due():
            self.draw()
        if time.monotonic() - self._logs_at >= self.LOG_PERIOD_S:
            self._read_logs()
        if self.state.ended and self._ended_when_opened is False and not self._finish_told:
            self._tell_finished()

    # -- the run ended while on screen: say so, offer the Summary ---------------------------------
    def _tell_finished(self) -> None:
        self._finish_told = True
        self._read_logs()
        self.refresh_bindings()
        self.app.bell()  # the header says it has ended and that Enter opens the Summary (no toast over the log)
        self.draw()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "summary":
            return self.state.ended  # in the footer once the run has ended
        return True

    def action_summary(self) -> None:
        if not self.state.ended:
            return
        from cockpit.ui.screens.summary import SummaryScreen

        self.app.sub_title = ""
        self.app.switch_screen(SummaryScreen(self.run))

    def action_node(self, by: int) -> None:
        """The devices pane's drill-down: one node's GPUs in the detailed form, the next / previous one."""
        with self._state_lock:
            if len(self.state.nodes) < 2:
                return
            self._devices.step_node(self.state, by)
        self._redraw_devices()

    def action_least_busy_node(self) -> None:
        with self._state_lock:
            self._devices.node = device_grid.least_busy_node(self.state)
        self._redraw_devices()

    def action_all_nodes(self) -> None:
        self._devices.node = None
        self._redraw_devices()

    def _redraw_devices(self) -> None:
        self._drawn_version = -1
        self.draw()

    def action_completions(self) -> None:
        """Focus the completions pane (arrows / PgUp / PgDn scroll it); again: back to the screen."""
        pane = self._completions
        if pane.has_class("hidden"):
            self.notify("c shows sampled completions: this run reports none (grpo runs do)", severity="warning")
        elif pane.has_focus:
            self.set_focus(None)
        else:
            pane.take_focus()

    def action_warnings(self) -> None:
        self.warnings_open = not self.warnings_open
        self._show_log()

    def _read_logs(self, history: bool = False) -> None:
        self._logs_at = time.monotonic()
        if not self.state.ended and getattr(self.app, "follow", True):
            from cockpit.run.liveness import reconcile

            reconcile(self.run)  # a dead supervisor: adopted, or its end state reaches the event log
        new = self.tail.read_new()
        self.readable.add(new, self.state.log_seq, history=history)
        if new or self.state.log_seq != self._log_seen:
            self._show_log()

    def _show_log(self) -> None:
        """The readable log (events as `cockpit attach` prints them, warnings folded); while
        searching, the raw lines that match."""
        from rich.text import Text

        widget = self.query_one("#log", Static)
        rows = max(1, widget.size.height or 20)
        if self._needle:
            lines = self.tail.search(self._needle)[-rows:]
        else:
            with self._state_lock:
                events = list(itertools.islice(reversed(self.state.recent), rows))[::-1]
                self._log_seen = self.state.log_seq
            lines = self.readable.view(events, rows, self.warnings_open, self.state.t0)
        text = Text("\n".join(lines), no_wrap=True, overflow="ellipsis")
        if lines and lines[-1].startswith("⚠"):
            text.stylize(themed("bold $text-warning"), len(text.plain) - len(lines[-1]))
        if self._needle:
            text.highlight_words([self._needle], style=themed("reverse $text-warning"), case_sensitive=False)
        widget.update(text, layout=False)

    def _redraw_title(self) -> None:
        self._title().show(
            formatting.header(self._header_state(), self.clock(), self.replay_progress, self._title_width())
        )

    def _title(self) -> TextPane:
        return self.query_one("#live-title", TextPane)

    def _title_width(self) -> int | None:
        return self.query_one("#live-title", Static).content_region.width or None

    def _header_state(self):
        return self.peeked if (self.replay_progress is not None and self.peeked is not None) else self.state

    def _tick_clock(self) -> None:
        if (
            not self.state.ended and self.run_is_slurm_job()
        ):  # the scheduler's end (scancel, time limit) reaches the event log
            self._ask_scheduler()
        # elapsed / ETA move on between steps; a draw in the last second already showed them
        if not self.state.ended and time.monotonic() - self._header_at > 0.9:
            self._redraw_title()

    # -- drawing: the panes decide what changed (cockpit/ui/panes.py) ---------------------------------
    def _held_back_due(self) -> bool:
        """A pane whose throttle held back a redraw, and whose period is now over."""
        return any(grid.due() for grid in self._grids) or self._devices.due()

    def draw(self) -> None:
        with self._state_lock:
            st = self.state
            if st.version == self._drawn_version and self.replay_progress is None and not self._held_back_due():
                return
            self._drawn_version = st.version
            hs = self._header_state()
            self._title().show(formatting.header(hs, self.clock(), self.replay_progress, self._title_width()))
            self._header_at = time.monotonic()
            if hs.total:
                self._bar.update(total=hs.total, progress=min(hs.step, hs.total))
            for grid in self._grids:  # each throttles itself: the header, bar and alerts show every step
                grid.show_state(st)
            tall = self.size.height >= 40
            many = len(st.nodes) > 8  # the node x GPU map: a taller #live-mid on a tall screen (app.tcss)
            mid = self._devices.parent  # the class on #live-mid restyles its two panes, not the whole screen
            if mid is not None and many != mid.has_class("-many-nodes"):
                mid.set_class(many, "-many-nodes")
            self._devices.show_state(
                st, (22 if tall and many else 16 if tall else 9) - 1
            )  # #live-mid's max-height, less comm
            self._alerts.show_state(st, 6 if tall else 3)
            self._completions.show_state(st)
            self._experts.show_state(st, 9 if tall else 3)

    # -- actions ----------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="slurm-queue")
    def _ask_scheduler(self) -> None:
        from cockpit.slurm.queue import effective_status

        effective_status(self.run)

    def run_is_slurm_job(self) -> bool:
        if not hasattr(self, "_slurm_job"):
            from cockpit.slurm.queue import job_id

            self._slurm_job = job_id(self.run.read_status())
        return bool(self._slurm_job)

    def _slurm_cancel(self, what: str) -> bool:
        """A Slurm job still in the queue (stop) or killed: scancel, which reaches every node."""
        if what == "save" or not self.run_is_slurm_job() or (what == "stop" and self.state.state != "queued"):
            return False
        from cockpit.slurm.queue import cancel

        ok, said = cancel(self.run, self._slurm_job, f"cockpit UI ({what})")
        self.notify(f"scancel {self._slurm_job}" + (f": {said}" if said else ""), severity="warning" if ok else "error")
        return True

    def _request(self, what: str, message: str) -> None:
        if self.state.ended:
            self.notify("the run has ended", severity="warning")
            return
        if self._slurm_cancel(what):
            return
        self.run.request(what, "cockpit UI")
        self.notify(message, severity="warning" if what == "kill" else "information")

    def action_save(self) -> None:
        self._request("save", "save requested: a checkpoint is written at the next step boundary")

    def action_stop(self) -> None:
        self._request("stop", "stop requested: the run saves a checkpoint and stops")

    def action_kill(self) -> None:
        from cockpit.ui.screens.modals import Confirm

        if self.state.ended:
            self.notify("the run has ended", severity="warning")
            return

        def done(yes: bool | None) -> None:
            if yes:
                self._request("kill", "kill requested: the supervisor ends the ranks now (no checkpoint)")

        self.app.push_screen(
            Confirm(f"Kill {self.run.run_id} now?\nNo checkpoint is saved; work since the last one is lost.", "Kill"),
            done,
        )

    # -- relaunch with the hang alert's remedy ------------------------------------------------------
    def action_relaunch(self) -> None:
        from rich.text import Text

        from cockpit.ui.screens.modals import Decide
        from cockpit.ui.state import hang_alert, relaunch_config, remedy_env

        alert = hang_alert(self.state)
        if alert is None:
            self.notify("r relaunches after a hang alert; there is none standing", severity="warning")
            return
        env = remedy_env(alert)
        try:
            cfg, notes = relaunch_config(self.run, env)
        except Exception as exc:  # noqa: BLE001 - an unreadable config.yaml: say so, keep the screen
            self.notify(f"cannot read {self.run.config_path}: {exc}", severity="error")
            return
        body = Text()
        if not self.state.ended:
            body.append(
                f"Stop {self.run.run_id} (a stop request, then kill after {self.RELAUNCH_STOP_GRACE_S:g} s: "
                "hung ranks cannot reach a step boundary) and ",
                style="bold",
            )
        body.append("start the same config again as a new run, with these settings added to its env:\n\n", style="bold")
        for k, v in env.items():
            body.append(f"  {k}={v}\n", style=themed("$text-primary"))
        for n in notes:
            body.append(f"\n! {n}", style=themed("$text-warning"))

        def done(yes: bool | None) -> None:
            if yes:
                self.notify("relaunching: stopping the run …")
                self._relaunch(cfg)

        self.app.push_screen(Decide("Relaunch with these settings", body, "Stop and relaunch", "Cancel"), done)

    @work(thread=True, exclusive=True, group="relaunch")
    def _relaunch(self, cfg: Mapping[str, Any]) -> None:
        from cockpit.run.control import relaunch_config_path, stop_escalating
        from cockpit.ui import cli_calls

        stop_escalating(
            self.run, "cockpit UI: relaunch after a hang", self.RELAUNCH_STOP_GRACE_S, self.RELAUNCH_KILL_GRACE_S
        )
        path = relaunch_config_path(self.run)
        secrets = cli_calls.write_config(path, cfg)
        # the new run is opened even when the person left this screen meanwhile
        res = cli_calls.train_detached(path, self.run.path.parent, secrets=secrets)
        post_or_run(self, self.Relaunched(res), self._relaunched)

    @on(Relaunched)
    def _relaunched(self, message: Relaunched) -> None:
        from pathlib import Path

        res = message.result
        if not (res.rc == 0 and isinstance(res.data, dict) and res.data.get("run_dir")):
            self.notify(f"relaunch failed (exit {res.rc}): {res.error_text[-600:]}", severity="error", timeout=15)
            return
        new = LiveScreen(RunDir(Path(res.data["run_dir"])))
        if on_top(self):
            self.app.switch_screen(new)
        else:
            self.app.push_screen(new)

    # -- stop at a checkpoint and resume with the memory alert's remedy ---------------------------------
    def action_memory_remedy(self) -> None:
        from rich.text import Text

        from cockpit.ui.screens.modals import Decide
        from cockpit.ui.state import memory_alert, memory_remedy_args

        alert = memory_alert(self.state)
        items = memory_remedy_args(alert) if alert else []
        if not items:
            self.notify("m applies a memory alert's remedy; there is none standing", severity="warning")
            return
        body = Text()
        body.append(f"{alert.get('message')}\n\n", style=themed("$text-warning"))
        body.append(
            f"Stop {self.run.run_id} at the next step boundary (a checkpoint is saved), then resume it from "
            "that checkpoint as a new attempt with:\n\n",
            style="bold",
        )
        for item in items:
            body.append(f"  {item}\n", style=themed("$text-primary"))
        body.append(
            "\nThe same as: cockpit resume " + self.run.run_id + " --stop " + " ".join(f"--set '{i}'" for i in items),
            style="dim",
        )

        def done(yes: bool | None) -> None:
            if yes:
                self.notify("stopping at a checkpoint, then resuming with the change …")
                self._resume_with(items)

        self.app.push_screen(
            Decide("Memory pressure: apply the remedy", body, "Stop and resume", "Cancel", danger=False), done
        )

    @work(thread=True, exclusive=True, group="memory-remedy")
    def _resume_with(self, items: list[str]) -> None:
        from cockpit.ui import cli_calls

        args = ["resume", str(self.run.path), "--stop", "--detach", "--json"]
        for item in items:
            args += ["--set", item]
        # told even when the person left this screen meanwhile
        post_or_run(self, self.Resumed(cli_calls.run_cli(*args, timeout=900)), self._resumed)

    @on(Resumed)
    def _resumed(self, message: Resumed) -> None:
        res = message.result
        if res.rc == 0 and isinstance(res.data, dict):
            changes = ", ".join(f"{k}={v}" for k, v in (res.data.get("config_changes") or {}).items())
            self.notify(
                f"attempt {res.data.get('attempt')} started from {res.data.get('checkpoint')} with {changes}",
                timeout=10,
            )
        else:
            self.notify(f"resume failed (exit {res.rc}): {res.error_text[-600:]}", severity="error", timeout=15)

    def action_plot(self) -> None:
        from cockpit.ui.screens.modals import PlotView

        self.app.push_screen(PlotView(self.state))

    def action_logs(self) -> None:
        from cockpit.ui.screens.modals import LogView

        self.app.push_screen(LogView(self.tail, self.run.run_id, poll=False))

    def action_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.disabled = False
        box.remove_class("hidden")
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "log-search":
            self._needle = event.value
            self._show_log()

    def on_resize(self) -> None:
        self.call_after_refresh(self._show_log)
        self.call_after_refresh(self._redraw_title)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "log-search":
            self.set_focus(None)

    def action_leave(self) -> None:
        if self._completions.has_focus:  # esc: back from the completions pane, the screen stays
            self.set_focus(None)
            return
        box = self.query_one("#log-search", Input)
        if box.has_focus or not box.has_class("hidden"):
            box.value = ""
            box.add_class("hidden")
            box.disabled = True
            self.set_focus(None)
            self.on_input_changed(Input.Changed(box, ""))
            return
        self.app.sub_title = ""
        self.dismiss()
