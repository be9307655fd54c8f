"""The Sweep screen: one ``cockpit sweep``'s trials (docs/sweeps.md), opened from the Runs screen
with S on a trial's run (``<sweep>-t<N>``) or from the palette ("Sweep: NAME").

It shows the trials table (number, state with pruned, steps, objective, each parameter, the run),
the best trial so far, the objective by trial number (a sparkline) and each parameter's importance
once enough trials completed. Its data is ``cockpit sweep status NAME --json`` in a subprocess
(``cli_calls.sweep_status``: Optuna and its SQLite storage stay out of the UI process, and the
importance is computed there), read by a thread worker at the mount and then periodically while
the screen is on top and the sweep can still change (a live driver, a trial's run not ended); the UI
thread never waits on it.

Keys: Enter opens the selected trial's run (Live while it runs, else Summary, as Runs decides, but
on top of this screen: ``app.open_live`` / ``open_summary`` with ``on_top``); space marks trials and d compares the marked ones (the selected one and the
best without marks: ``screens/compare.py``); b saves the best trial's config as a preset in your
presets folder (``cockpit sweep best NAME --save-preset PATH``, ``cli_calls.sweep_save_best``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Sparkline, Static

from cockpit.store.rundir import TERMINAL_STATES, RunDir
from cockpit.ui.formatting import state_text
from cockpit.ui.messages import WorkerMessage
from cockpit.ui.palette import themed
from cockpit.ui.screens import on_top

if TYPE_CHECKING:
    from textual import getters

    from cockpit.ui.app import CockpitApp

MARK = "●"
REFRESH_S = 5.0  # at most this often: each read is a `cockpit sweep status` process
ACTIVE = ("running", "pruning")  # trial states whose run may still be going


def sweep_of(run: RunDir) -> str | None:
    """The sweep a run belongs to: its status.json ``sweep``, else its name's ``<sweep>-t<N>``."""
    import re

    from cockpit.compare import short_name

    name = run.read_status().get("sweep")
    if isinstance(name, str) and name:
        return name
    found = re.fullmatch(r"(.+)-t\d+(?:-[0-9a-f]{4})?", short_name(run.run_id))
    return found.group(1) if found else None


def cell(value: Any) -> str:
    from cockpit.cells import value_text

    return value_text(value)  # the digits of the driver's log and `cockpit sweep status`


def trial_state(trial: dict[str, Any]) -> Text:
    """The trial's state as the table shows it (pruned, failed with its reason's first words)."""
    state = trial["state"]
    style = {"complete": "finished", "pruned": "stopped", "pruning": "stopping", "fail": "failed"}.get(state, state)
    shown = {"complete": "complete", "fail": "failed"}.get(state, state)
    return state_text(style, shown)


def param_keys(st: dict[str, Any]) -> list[str]:
    return sorted({k for t in st.get("trials", []) for k in t["params"]})


def title_text(st: dict[str, Any]) -> Text:
    """The sweep's name, objective, trials asked of the budget (a grid's: at most its points)."""
    title = Text(f"Sweep {st['name']}", style="bold")
    title.append(f"  {st['objective']} ({st['direction']}) · {len(st['trials'])}/{st['trials_budget']} trials")
    if st.get("grid_points"):
        title.append(f" of a {st['grid_points']}-point grid")
    title.append(
        f" · {st['parallel']} at once · {'driver running' if st.get('driver_alive') else 'no driver'}", style="dim"
    )
    return title


def tie_text(st: dict[str, Any]) -> str | None:
    """The line under the best when it ties with other trials (``cockpit sweep status``'s ``best.tie``)."""
    return (st.get("best") or {}).get("tie")


def best_text(st: dict[str, Any]) -> Text:
    b = st.get("best")
    t = Text()
    if not b:
        t.append("best: none yet", style="bold")
        t.append(" (no trial has completed)", style="dim")
        return t
    t.append("best: ", style="bold")
    t.append(f"trial {b['number']}", style=themed("bold $text-success"))
    t.append(f"  {st['objective']} {cell(b['value'])}  ")
    t.append(", ".join(f"{k}={cell(v)}" for k, v in b["params"].items()), style=themed("$text-primary"))
    if b.get("run_id"):
        from cockpit.compare import short_name

        t.append(f"  {short_name(b['run_id'])}", style="dim")
    return t


def importance_text(st: dict[str, Any], width: int = 40) -> Text:
    """Each parameter's importance as a bar (``cockpit sweep status``'s ``importance``)."""
    imp = st.get("importance")
    t = Text("importance", style="bold")
    if not imp:
        done = sum(1 for tr in st.get("trials", []) if tr["state"] == "complete")
        t.append(f"\nafter 4 completed trials ({done} so far)", style="dim")
        return t
    t.append(f"  {imp['evaluator']} · {imp['trials']} trials", style="dim")
    params = imp["params"]
    name_w = max((len(k) for k in params), default=4)
    bar_w = max(4, width - name_w - 8)
    for key, value in params.items():
        t.append(f"\n{key:<{name_w}} ")
        t.append("█" * max(1, round(value * bar_w)), style=themed("$text-primary"))
        t.append(f" {value:.2f}")
    return t


def objective_points(st: dict[str, Any]) -> list[tuple[int, float]]:
    """(trial number, objective) of the trials that have one, in trial order."""
    return [(t["number"], float(t["objective"])) for t in st.get("trials", []) if t.get("objective") is not None]


def changing(st: dict[str, Any] | None) -> bool:
    """Whether another read may show something new: none yet (or it failed), a live driver, or a trial
    whose run has not ended. A sweep whose driver is gone and whose runs all ended stays as it is (r reads it)."""
    if not st:
        return True
    return bool(st.get("driver_alive")) or any(
        t["state"] in ACTIVE and t.get("run_state") not in TERMINAL_STATES for t in st.get("trials", [])
    )


class SweepScreen(Screen):
    if TYPE_CHECKING:
        app = getters.app(CockpitApp)

    BINDINGS = [
        Binding("enter", "open", "Open trial", show=True),
        Binding("space", "mark", "Mark"),
        Binding("d", "compare", "Compare"),
        Binding("b", "save_best", "Best as preset"),
        Binding("r", "refresh_sweep", "Refresh"),
        Binding("escape,q", "leave", "Back"),
    ]

    class Read(WorkerMessage):
        """``cockpit sweep status NAME --json``'s result (a ``cli_calls.CliResult``)."""

    class Saved(WorkerMessage):
        """``cockpit sweep best NAME --save-preset PATH --json``'s result and the path: (CliResult, Path)."""

    def __init__(self, name: str, runs_dir: Path | None = None) -> None:
        super().__init__(name="sweep")
        self.sweep = name
        self.runs_dir_given = runs_dir
        self.data: dict[str, Any] | None = None
        self.error: str | None = None
        self.marked: set[int] = set()
        self.reads = 0  # answers shown (tests wait for the first)

    @property
    def runs_dir(self) -> Path:
        return Path(self.runs_dir_given or self.app.runs_dir)

    def compose(self) -> ComposeResult:
        yield Static(f"Sweep {self.sweep} …", id="sweep-title", classes="screen-title")
        yield Static("", id="sweep-best")
        yield Static("", id="sweep-tie")  # the best is one of trials with the same objective (shown only then)
        yield DataTable(id="sweep-trials", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="sweep-bottom"):
            with Vertical(id="sweep-objective"):
                yield Static("objective by trial", id="sweep-spark-title", classes="dim")
                yield Sparkline([], id="sweep-spark", summary_function=max)
                yield Static("", id="sweep-spark-range", classes="dim")
            yield Static("", id="sweep-importance")
        yield Static("Enter: open trial · space: mark, d: compare · b: best as preset", id="sweep-hint", classes="dim")
        yield Footer()

    def on_mount(self) -> None:
        self._read()
        self.set_interval(max(REFRESH_S, getattr(self.app, "runs_refresh_s", 2.0)), self._tick)
        self.query_one(DataTable).focus()

    def _tick(self) -> None:
        if on_top(self) and changing(self.data):
            self._read()

    @work(thread=True, exclusive=True, group="sweep-status")
    def _read(self) -> None:
        from cockpit.ui.cli_calls import sweep_status

        self.post_message(self.Read(sweep_status(self.sweep, self.runs_dir)))

    @on(Read)
    def _shown(self, message: Read) -> None:
        res = message.result
        self.reads += 1
        if res.rc != 0 or not isinstance(res.data, dict):
            self.error = res.error_text
            self.query_one("#sweep-title", Static).update(
                Text(f"Sweep {self.sweep}: {self.error}", style=themed("$text-error"))
            )
            return
        self.error = None
        self.data = res.data
        self._fill(res.data)

    # -- drawing ----------------------------------------------------------------------------------
    def _fill(self, st: dict[str, Any]) -> None:
        self.query_one("#sweep-title", Static).update(title_text(st))
        self.query_one("#sweep-best", Static).update(best_text(st))
        tie = tie_text(st)
        self.query_one("#sweep-tie", Static).update(tie or "")
        self.query_one("#sweep-tie", Static).display = bool(tie)
        self._fill_table(st)
        points = objective_points(st)
        spark = self.query_one("#sweep-spark", Sparkline)
        spark.data = [v for _n, v in points]
        spark.summary_function = min if st["direction"] == "minimize" else max
        lo = min(points, key=lambda p: p[1]) if points else None
        hi = max(points, key=lambda p: p[1]) if points else None
        self.query_one("#sweep-spark-range", Static).update(
            f"t{points[0][0]}-t{points[-1][0]}: low {lo[1]:.4g} t{lo[0]} · high {hi[1]:.4g} t{hi[0]}"
            if points and lo and hi
            else "no values yet"
        )
        width = max(24, self.size.width // 2 - 2)
        self.query_one("#sweep-importance", Static).update(importance_text(st, width))

    def _fill_table(self, st: dict[str, Any]) -> None:
        table = self.query_one("#sweep-trials", DataTable)
        keys = param_keys(st)
        columns = ["mark", "#", "state", "steps", st["objective"], *keys, "run"]
        if [str(c.label) for c in table.columns.values()] != [" " if c == "mark" else c for c in columns]:
            table.clear(columns=True)
            for c in columns:
                table.add_column(" " if c == "mark" else c, key=c)
        from cockpit.compare import short_name

        best = (st.get("best") or {}).get("number")
        rows = {}
        for t in st["trials"]:
            obj = Text(cell(t["objective"]), style=themed("bold $text-success") if t["number"] == best else "")
            rows[str(t["number"])] = (
                MARK if t["number"] in self.marked else " ",
                str(t["number"]),
                trial_state(t),
                cell(t["steps"]),
                obj,
                *(cell(t["params"].get(k)) for k in keys),
                short_name(t["run_id"]) if t.get("run_id") else "-",
            )
        if [str(k.value) for k in table.rows] == list(rows):  # the same trials: their cells, in place
            for row_key, values in rows.items():
                for col, value in zip(columns, values):
                    if table.get_cell(row_key, col) != value:
                        table.update_cell(row_key, col, value, update_width=True)
            return
        key = self._selected_key()
        table.clear()
        for row_key, values in rows.items():
            table.add_row(*values, key=row_key)
        if key in rows:
            table.move_cursor(row=table.get_row_index(key))

    # -- the selection ---------------------------------------------------------------------------
    def _selected_key(self) -> str | None:
        table = self.query_one("#sweep-trials", DataTable)
        if table.row_count == 0:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def trial(self, number: int | None) -> dict[str, Any] | None:
        return next((t for t in (self.data or {}).get("trials", []) if t["number"] == number), None)

    def selected(self) -> dict[str, Any] | None:
        key = self._selected_key()
        return self.trial(int(key)) if key is not None else None

    def run_of(self, trial: dict[str, Any] | None) -> RunDir | None:
        if not trial or not trial.get("run_id") or not (self.runs_dir / trial["run_id"]).is_dir():
            return None
        return RunDir(self.runs_dir / trial["run_id"])

    # -- keys -------------------------------------------------------------------------------------
    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_open(self) -> None:
        """The selected trial's run: Live while it runs, its Summary once it ended (as Runs opens a run)."""
        trial = self.selected()
        run = self.run_of(trial)
        if run is None:
            if trial is not None:
                self.notify(f"trial {trial['number']} has no run (yet)", severity="warning")
            return
        state = run.read_status().get("state") or trial.get("run_state")  # type: ignore[union-attr]
        if state in TERMINAL_STATES:
            self.app.open_summary(run, on_top=True)
        else:
            self.app.open_live(run, on_top=True)

    def action_mark(self) -> None:
        trial = self.selected()
        if trial is None:
            return
        self.marked ^= {trial["number"]}
        self.query_one("#sweep-trials", DataTable).update_cell(
            str(trial["number"]), "mark", MARK if trial["number"] in self.marked else " "
        )
        self.query_one("#sweep-hint", Static).update(f"{len(self.marked)} marked: d compares them")

    def action_compare(self) -> None:
        """The marked trials' runs side by side; without two marks, the selected trial and the best."""
        from cockpit.ui.screens.compare import CompareScreen

        numbers = sorted(self.marked)
        if len(numbers) < 2:
            best = ((self.data or {}).get("best") or {}).get("number")
            sel = (self.selected() or {}).get("number")
            numbers = [n for n in dict.fromkeys([best, sel]) if n is not None]
        runs = [r for r in (self.run_of(self.trial(n)) for n in numbers) if r is not None]
        if len(runs) < 2:
            self.notify(
                "mark two or more trials with space (or select one other than the best), then d", severity="warning"
            )
            return
        self.app.push_screen(CompareScreen(runs))

    def action_save_best(self) -> None:
        if not (self.data or {}).get("best"):
            self.notify("no trial has completed yet: no best to save", severity="warning")
            return
        from cockpit.ui.presets import user_presets_dir

        self._save(user_presets_dir() / f"{self.sweep}-best.yaml")

    @work(thread=True, exclusive=True, group="sweep-best")
    def _save(self, path: Path) -> None:
        from cockpit.ui.cli_calls import sweep_save_best

        self.post_message(self.Saved((sweep_save_best(self.sweep, self.runs_dir, path), path)))

    @on(Saved)
    def _saved(self, message: Saved) -> None:
        res, path = message.result
        if res.rc != 0 or not isinstance(res.data, dict):
            self.notify(f"cockpit sweep best failed: {res.error_text}", severity="error")
            return
        self.saved_preset = path
        self.notify(
            f"trial {res.data['number']} ({cell(res.data['value'])}) saved as the preset {path} (Setup, the palette)"
        )

    def action_refresh_sweep(self) -> None:
        self._read()

    def action_leave(self) -> None:
        self.dismiss()
