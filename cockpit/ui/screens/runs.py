"""The Runs screen: every run in the runs dir (a DataTable, refreshed periodically); the selected
finished run can be merged, exported, served or chatted with (``screens/actions.py``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from cockpit.rundir import TERMINAL_STATES, RunDir, list_runs
from cockpit.slurm.queue import effective_statuses, waiting_on_scheduler
from cockpit.ui.render import STATE_STYLE
from cockpit.ui.screens.actions import ACTION_BINDINGS, RunActions
from cockpit.ui.state import fmt_duration

if TYPE_CHECKING:
    from textual import getters

    from cockpit.ui.app import CockpitApp

COLUMNS = ("run", "state", "step", "last loss", "duration", "started")


def run_row(run: RunDir, now: float, status: dict | None = None) -> tuple:
    from rich.text import Text

    from cockpit.liveness import reconcile

    st = status if status is not None else run.read_status()
    st = reconcile(run, status=st)  # liveness checked: a dead supervisor's run is adopted or ended (lost/finished)
    started, ended = st.get("started"), st.get("ended")
    state = st.get("state") or "?"
    shown = f"{state} · {st['reason']}" if state == "queued" and st.get("reason") else state  # Slurm: the scheduler's state (reason)
    dur = ((ended or now) - started) if started else None
    step = f"{st.get('step') or 0}/{st.get('total_steps') or '?'}"
    loss = st.get("last_loss")
    loss_s = f"{loss:.4f}" if isinstance(loss, (int, float)) else "-"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(started)) if started else "-"
    return (run.run_id, Text(shown, style=STATE_STYLE.get(state, "")), step, loss_s, fmt_duration(dur), when), state


class RunsScreen(RunActions, Screen):

    if TYPE_CHECKING:  # as Textual types MessagePump.app, for mypy only: the attributes used on the app are checked
        app = getters.app(CockpitApp)

    BINDINGS = [
        Binding("enter", "open", "Open", show=True),
        Binding("a", "attach", "Attach live"),
        *ACTION_BINDINGS,
        Binding("n", "new", "New run"),
        Binding("r", "refresh_runs", "Refresh"),
    ]

    def compose(self) -> ComposeResult:
        yield Static(id="runs-title", classes="screen-title")
        yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="runs-hint", classes="dim")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for col in COLUMNS:
            table.add_column(col, key=col)
        self.states: dict[str, str] = {}
        self.refresh_runs()
        self.set_interval(getattr(self.app, "runs_refresh_s", 2.0), self._tick)
        table.focus()

    def _tick(self) -> None:
        if self.app.screen is self:  # not while a Live / Summary screen covers it
            self.refresh_runs()

    def refresh_runs(self) -> None:
        runs_dir = self.app.runs_dir
        table = self.query_one(DataTable)
        now = self.app.clock()
        runs = list_runs(runs_dir)
        statuses = effective_statuses(runs, cached_only=True)  # Slurm runs: queued with squeue's reason, or ended by the scheduler
        asking = [r for r in runs if waiting_on_scheduler(statuses[r.run_id])]
        if asking:
            self._ask_scheduler(asking)
        rows = {r.run_id: run_row(r, now, statuses[r.run_id]) for r in runs}
        existing = {str(k.value) for k in table.rows}
        for run_id in existing - rows.keys():
            table.remove_row(run_id)
        for run_id, (cells, state) in rows.items():
            self.states[run_id] = state
            if run_id in existing:
                for col, value in zip(COLUMNS[1:], cells[1:]):
                    table.update_cell(run_id, col, value)
            else:
                table.add_row(*cells, key=run_id)
        if existing != set(rows):
            table.sort("run", reverse=True)
        live = sum(1 for s in self.states.values() if s not in TERMINAL_STATES)
        self.query_one("#runs-title", Static).update(f"Runs in {runs_dir}  —  {len(rows)} run(s), {live} active")
        self.query_one("#runs-hint", Static).update(
            "Enter: live view of an active run, summary of a finished one · a: attach (replay) · "
            "finished: c chat, s serve, m merge, e export · n: new run · quitting never stops a run"
            if rows else "No runs yet. Press n (or F2) to set one up.")

    @work(thread=True, exclusive=True, group="slurm-queue")
    def _ask_scheduler(self, runs: list[RunDir]) -> None:
        """squeue/sacct for the Slurm runs (at most every few seconds), off the UI thread; the next
        refresh shows the answers."""
        effective_statuses(runs)

    def action_refresh_runs(self) -> None:
        self.refresh_runs()

    def _selected(self) -> RunDir | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return RunDir(self.app.runs_dir / str(key.value))

    def action_target(self) -> RunDir | None:  # merge / export / serve / chat act on the selected run
        return self._selected()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_open(self) -> None:
        run = self._selected()
        if run is None:
            return
        state = self.states.get(run.run_id) or run.read_status().get("state")
        if state in TERMINAL_STATES:
            self.app.open_summary(run)
        else:
            self.app.open_live(run)

    def action_attach(self) -> None:
        run = self._selected()
        if run is not None:
            self.app.open_live(run)

    def action_new(self) -> None:
        self.app.switch_mode("setup")
