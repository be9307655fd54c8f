"""The Runs screen: every run in the runs dir (a DataTable, refreshed periodically); the selected
finished run can be merged, exported, served or chatted with (``screens/run_actions.py``); space
marks runs and d compares the marked ones (``screens/compare.py``). Queued runs (``cockpit queue``,
``cockpit/run/queue.py``) are listed above the runs with their position and the GPUs they wait for
(an active run the queue started shows the GPUs it holds); Delete takes one out, [ and ]
move it, and a
queue whose runner died is adopted (a new runner started) at each refresh.

Columns fit their values (``update_cell(update_width=True)`` grows and shrinks them); the run
column shows the run id without its timestamp (``started`` has the time; ``cockpit attach``
takes the short name too).

The first listing (each run's status read and its liveness checked) comes after the first frame,
from a thread worker (``Listed``); until then the table is empty and ``listed`` is False. Later
refreshes (the timer, ``r``, after an action) read on the UI thread, as before."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from cockpit.compare import short_name
from cockpit.slurm.queue import effective_statuses, waiting_on_scheduler
from cockpit.store.rundir import TERMINAL_STATES, RunDir, list_runs, running_s
from cockpit.ui.formatting import state_text
from cockpit.ui.messages import WorkerMessage
from cockpit.ui.screens import on_top
from cockpit.ui.screens.run_actions import ACTION_BINDINGS, RunActionsMixin
from cockpit.ui.state import fmt_duration
from cockpit.ui.widgets import Bearings

if TYPE_CHECKING:
    from textual import getters

    from cockpit.ui.app import CockpitApp

COLUMNS = ("mark", "run", "state", "step", "loss", "duration", "started")
MARK = "●"
QUEUED = "queue:"  # a queued entry's row key: QUEUED + its id


@dataclass(frozen=True)
class Listing:
    """One read of the runs dir, as data (the cells' Rich text is made on the UI thread, where the
    app's theme is known: ``palette.themed``): each run with its status (liveness checked), the
    queued entries in queue order, the Slurm runs whose scheduler must be asked, and why the
    queue's runner could not start."""

    runs: list[tuple[RunDir, dict]]
    queued: list[dict]
    asking: list[RunDir]
    queue_error: str | None


def read_listing(runs_dir: Path) -> Listing:
    """Every run's status, its liveness checked (a dead supervisor's run is adopted or ended:
    lost / finished); a queue whose runner died gets a new one (as every ``cockpit queue`` command
    does). No widgets: a thread worker may call it."""
    from cockpit.run.liveness import reconcile
    from cockpit.run.queue import ensure_runner, listing

    runs = list_runs(runs_dir)
    statuses = effective_statuses(runs, cached_only=True)  # Slurm runs: queued with squeue's reason, or ended
    asking = [r for r in runs if waiting_on_scheduler(statuses[r.run_id])]
    checked = [(r, reconcile(r, status=statuses[r.run_id])) for r in runs]
    try:
        ensure_runner(runs_dir)
        queue_error = None
    except OSError as exc:
        queue_error = str(exc)
    queued = [e for e in listing(runs_dir) if e["state"] in ("queued", "launching")]
    return Listing(checked, queued, asking, queue_error)


def queue_rows(queued: list[dict]) -> dict[str, tuple]:
    """The queued entries (not yet a run), in queue order: row key -> cells."""
    from cockpit.run.queue import gpus_text

    rows = {}
    for e in queued:
        state = f"queued #{e['position']}" if e["position"] else "starting"
        state = f"{state} · {gpus_text(e)}" if gpus_text(e) else state
        when = time.strftime("%m-%d %H:%M", time.localtime(e["added"]))
        rows[QUEUED + e["id"]] = (" ", Path(e["config"]).stem, state_text("queued", state), "-", "-", "-", when)
    return rows


def run_row(run: RunDir, st: dict, now: float, marked: bool = False) -> tuple:
    """A run's cells and its state, from its status (liveness checked: ``read_listing``)."""
    started = st.get("started")
    state = st.get("state") or "?"
    shown = (
        f"{state} · {st['reason']}" if state == "queued" and st.get("reason") else state
    )  # Slurm: the scheduler's state (reason)
    if st.get("gpus") and state not in TERMINAL_STATES:
        shown = f"{shown} · GPU {','.join(map(str, st['gpus']))}"  # the GPUs the queue gave it
    dur = running_s(st, now)  # the pauses between attempts left out
    step = f"{st.get('step') or 0}/{st.get('total_steps') or '?'}"
    loss = st.get("last_loss")
    loss_s = f"{loss:.4f}" if isinstance(loss, (int, float)) else "-"
    when = time.strftime("%m-%d %H:%M", time.localtime(started)) if started else "-"
    mark = MARK if marked else " "
    return (mark, short_name(run.run_id), state_text(state, shown), step, loss_s, fmt_duration(dur), when), state


class RunsScreen(RunActionsMixin, Screen):
    if TYPE_CHECKING:  # as Textual types MessagePump.app, for mypy only: the attributes used on the app are checked
        app = getters.app(CockpitApp)

    BINDINGS = [
        Binding("enter", "open", "Open", show=True),
        Binding("a", "attach", "Attach live"),
        *ACTION_BINDINGS,
        Binding("space", "mark", "Mark"),
        Binding("d", "compare", "Compare marked"),
        Binding("S", "sweep", "Sweep"),
        Binding("n", "new", "New run"),
        Binding("r", "refresh_runs", "Refresh"),
        Binding("left_square_bracket", "queue_move(-1)", "Queued run earlier", show=False, key_display="["),
        Binding("right_square_bracket", "queue_move(1)", "Queued run later", show=False, key_display="]"),
    ]

    def compose(self) -> ComposeResult:
        yield Bearings(id="bearings", counted_by_screen=True)
        yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="runs-hint", classes="dim")
        yield Footer()

    class Listed(WorkerMessage):
        """The first listing (a :class:`Listing`), read by a worker after the first frame."""

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for col in COLUMNS:
            table.add_column(" " if col == "mark" else col, key=col)
        self.states: dict[str, str] = {}
        self.marked: set[str] = set()
        self.listed = False  # the table has the runs (the first listing arrives after the first frame)
        self._first_listing()
        self.set_interval(getattr(self.app, "runs_refresh_s", 2.0), self._tick)
        table.focus()

    @work(thread=True, exclusive=True, group="runs-listing")
    def _first_listing(self) -> None:
        self.post_message(self.Listed(read_listing(self.app.runs_dir)))

    @on(Listed)
    def _first_listed(self, message: Listed) -> None:
        if (
            not self.listed and self.is_attached
        ):  # not when a refresh came first (its rows are as new), nor while closing
            self._show(message.result)

    def _tick(self) -> None:
        if on_top(self) and self.listed:  # not while a Live / Summary screen covers it, nor before the first listing
            self.refresh_runs()

    def refresh_runs(self) -> None:
        self._show(read_listing(self.app.runs_dir))

    def _show(self, listing: Listing) -> None:
        if listing.asking:
            self._ask_scheduler(listing.asking)
        if listing.queue_error:
            self.notify(f"the run queue's runner could not start: {listing.queue_error}", severity="error")
        now = self.app.clock()
        self.marked &= {r.run_id for r, _st in listing.runs}
        rows = {r.run_id: run_row(r, st, now, r.run_id in self.marked) for r, st in listing.runs}
        self.states = {run_id: state for run_id, (_cells, state) in rows.items()}
        cells = {run_id: c for run_id, (c, _state) in sorted(rows.items(), reverse=True)}
        self._fill(self.query_one(DataTable), {**queue_rows(listing.queued), **cells})
        self.listed = True
        live = sum(1 for s in self.states.values() if s not in TERMINAL_STATES)
        self.query_one(Bearings).refresh_line((live, len(rows)))
        self.query_one("#runs-hint", Static).update(
            "Enter: open · space: mark, d: compare marked · ?: every key · quitting never stops a run"
            if rows
            else "No runs yet. Press n (or F2) to set one up."
        )

    def _fill(self, table: DataTable, cells: dict[str, tuple]) -> None:
        """Rows in order: the queued entries by position, then the runs newest first."""
        if [str(k.value) for k in table.rows] != list(cells):  # rows came, went or moved: redraw, cursor kept
            key = self._selected_key()
            table.clear()
            for row_key, values in cells.items():
                table.add_row(*values, key=row_key)
            if key in cells:
                table.move_cursor(row=table.get_row_index(key))
            return
        for row_key, values in cells.items():
            for col, value in zip(COLUMNS, values):
                if table.get_cell(row_key, col) != value:  # a column grows (or shrinks) to its values
                    table.update_cell(row_key, col, value, update_width=True)

    @work(thread=True, exclusive=True, group="slurm-queue")
    def _ask_scheduler(self, runs: list[RunDir]) -> None:
        """squeue/sacct for the Slurm runs (at most every few seconds), off the UI thread; the next
        refresh shows the answers."""
        effective_statuses(runs)

    def action_refresh_runs(self) -> None:
        self.refresh_runs()

    def action_mark(self) -> None:
        run = self._selected()
        if run is None:
            return
        self.marked ^= {run.run_id}
        self.query_one(DataTable).update_cell(run.run_id, "mark", MARK if run.run_id in self.marked else " ")
        self.query_one("#runs-hint", Static).update(
            f"{len(self.marked)} marked: d compares them (space: mark or unmark the selected run)"
        )

    def action_compare(self) -> None:
        from cockpit.ui.screens.compare import CompareScreen

        marked = [r for r in list_runs(self.app.runs_dir) if r.run_id in self.marked]
        if len(marked) < 2:
            self.notify("mark two or more runs with space, then press d", severity="warning")
            return
        self.app.push_screen(CompareScreen(marked))

    def _selected_key(self) -> str | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def _selected(self) -> RunDir | None:
        """The selected run (None on a queued entry's row)."""
        key = self._selected_key()
        if key is None or key.startswith(QUEUED):
            return None
        return RunDir(self.app.runs_dir / key)

    def action_queue_move(self, by: int) -> None:
        """[ and ]: the selected queued entry one place earlier or later (``cockpit queue move``)."""
        from cockpit.run.queue import listing, move_entry

        key = self._selected_key()
        if key is None or not key.startswith(QUEUED):
            self.notify("[ and ] move a queued run (the rows at the top)", severity="warning")
            return
        entry_id = key[len(QUEUED) :]
        position = next((e["position"] for e in listing(self.app.runs_dir) if e["id"] == entry_id), 0)
        try:
            if position:
                move_entry(self.app.runs_dir, entry_id, max(1, position + by))
        except LookupError as exc:
            self.notify(str(exc.args[0]), severity="warning")
        self.refresh_runs()  # the redraw keeps the cursor on the moved entry

    def action_delete(self) -> None:
        """Delete: a queued entry leaves the queue; a run is deleted as before (``run_actions``)."""
        key = self._selected_key()
        if key is None or not key.startswith(QUEUED):
            return super().action_delete()
        from cockpit.run.queue import listing, remove_entry
        from cockpit.ui.screens.modals import Confirm

        entry_id = key[len(QUEUED) :]
        entry = next((e for e in listing(self.app.runs_dir) if e["id"] == entry_id), None)
        if entry is None:
            self.notify(f"queue entry {entry_id} is no longer queued", severity="warning")
            self.refresh_runs()
            return

        def answered(yes: bool | None) -> None:
            if not yes:
                return
            try:
                removed = remove_entry(self.app.runs_dir, entry_id)
            except LookupError as exc:
                self.notify(str(exc.args[0]), severity="warning")
            else:
                self.notify(f"removed from the queue: {removed['config']}")
            self.refresh_runs()

        sets = "".join(f" --set {o}" for o in entry.get("overrides") or [])
        where = f"#{entry['position']}" if entry.get("position") else "starting"
        question = f"Take queue entry {entry_id} ({where}) out of the queue?\n{entry['config']}{sets}"
        self.app.push_screen(Confirm(question, "Remove"), answered)

    def action_target(self) -> RunDir | None:  # merge / export / serve / chat act on the selected run
        return self._selected()

    def after_delete(self, run: RunDir) -> None:
        self.refresh_runs()

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

    def action_sweep(self) -> None:
        """S: the Sweep screen of the selected run's sweep (a trial's run is ``<sweep>-t<N>``)."""
        from cockpit.ui.screens.sweep import sweep_of

        run = self._selected()
        name = sweep_of(run) if run is not None else None
        if name is None:
            self.notify("S opens a sweep: select one of its trials' runs (<sweep>-t<N>)", severity="warning")
            return
        self.app.open_sweep(name)

    def action_new(self) -> None:
        self.app.action_go("setup")
