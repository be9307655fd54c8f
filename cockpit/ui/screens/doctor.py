"""The Doctor screen: ``cockpit doctor --json`` in a subprocess, a table of pass/warn/fail/skip."""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.coordinate import Coordinate
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from cockpit.ui.messages import WorkerMessage
from cockpit.ui.palette import themed

# Textual style strings: the table's cells (Rich text) resolve them with palette.themed
STATUS_STYLE = {"pass": "$text-success", "warn": "bold $text-warning", "fail": "bold $text-error", "skip": "dim"}
MARK = {"pass": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


class DoctorScreen(Screen):
    BINDINGS = [Binding("r", "rerun", "Run again"), Binding("f", "only_problems", "Problems only")]

    def __init__(self, checks: list[dict] | None = None) -> None:
        super().__init__()
        self.checks = checks
        self.problems_only = False

    def compose(self) -> ComposeResult:
        from cockpit.ui.widgets import Bearings

        yield Bearings(id="bearings")
        yield Static("Doctor — is this machine ready to fine-tune?", id="doctor-title", classes="screen-title")
        yield DataTable(id="doctor-table", zebra_stripes=True, cursor_type="row")
        yield Static(id="doctor-detail", classes="pane")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for col in ("status", "check", "seen"):
            table.add_column(col, key=col)
        checks = self.checks if self.checks is not None else getattr(self.app, "doctor_checks", None)
        if isinstance(checks, Mapping):  # a test's answers per set of needs: this screen's has none
            checks = checks.get("")
        if checks is not None:
            self.show(checks)
        else:
            self.action_rerun()

    def action_rerun(self) -> None:
        self.query_one("#doctor-title", Static).update("Doctor — running cockpit doctor --json …")
        self._run()

    class Ran(WorkerMessage):
        """``cockpit doctor --json`` answered (a ``cli_calls.CliResult``)."""

    @work(thread=True, exclusive=True, group="doctor")
    def _run(self) -> None:
        from cockpit.ui import cli_calls

        self.post_message(self.Ran(cli_calls.doctor()))

    @on(Ran)
    def _ran(self, message: Ran) -> None:
        res = message.result
        if isinstance(res.data, list):
            self.show(res.data)
        else:
            self.query_one("#doctor-title", Static).update(
                Content.styled(f"Doctor failed: {res.error_text}", "$text-error")
            )

    def show(self, checks: list[dict]) -> None:
        self.checks = checks
        table = self.query_one(DataTable)
        table.clear()
        for i, c in enumerate(checks):
            if self.problems_only and c.get("status") in ("pass", "skip"):
                continue
            st = c.get("status", "?")
            table.add_row(
                Text(MARK.get(st, st), style=themed(STATUS_STYLE.get(st, ""))),
                c.get("title", c.get("id")),
                (c.get("seen") or "")[:120],
                key=str(i),
            )
        n = {s: sum(1 for c in checks if c.get("status") == s) for s in MARK}
        self.query_one("#doctor-title", Static).update(
            Content.assemble(
                "Doctor  ",
                (f"{n['pass']} ok  ", "$text-success"),
                (f"{n['warn']} warning(s)  ", "$text-warning"),
                (f"{n['fail']} failed  ", "$text-error"),
                (f"{n['skip']} skipped", "dim"),
            )
        )
        self._detail(0)

    def _detail(self, row: int) -> None:
        table = self.query_one(DataTable)
        if not self.checks or table.row_count == 0:
            self.query_one("#doctor-detail", Static).update("")
            return
        key = table.coordinate_to_cell_key(Coordinate(min(row, table.row_count - 1), 0)).row_key
        c = self.checks[int(str(key.value))]
        t = Text()
        t.append(f"{c.get('title')}: ", style="bold")
        t.append(c.get("seen") or "")
        if c.get("fix"):
            t.append("\nfix: ", style=themed("bold $text-warning"))
            t.append(c["fix"])
        if c.get("matters_for"):
            t.append(f"\nmatters for: {', '.join(c['matters_for'])}", style="dim")
        self.query_one("#doctor-detail", Static).update(t)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._detail(event.cursor_row)

    def action_only_problems(self) -> None:
        self.problems_only = not self.problems_only
        if self.checks is not None:
            self.show(self.checks)
