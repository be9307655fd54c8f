"""Compare two or more runs (marked in Runs with space, opened with d): their curves overlaid
(by step or by tokens seen; loss, eval loss and any other stage curve the runs logged), only
the config keys that differ, and their summaries side by side.

The data is ``cockpit.compare.compare`` (pure: run dirs in, dict out), the same that
``cockpit compare RUN RUN --json`` prints; it is read in a thread worker."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from cockpit.compare import compare, fmt_cell, fmt_value, summary_rows
from cockpit.store.rundir import RunDir
from cockpit.ui.messages import WorkerMessage
from cockpit.ui.widgets import clip

# one marker per run: the runs stay apart on a terminal without colour
MARKERS = ("•", "+", "x", "*", "o", "#")
CURVE_TITLES = {"loss": "train loss", "eval_loss": "eval loss", "grad_norm": "grad norm", "tokens_per_s": "tokens/s",
                "aux_loss": "router aux loss"}  # fmt: skip


class CompareScreen(Screen):
    BINDINGS = [
        Binding("t", "toggle_x", "Step / tokens"),
        Binding("m", "next_curve", "Next curve"),
        Binding("escape,q", "leave", "Back"),
    ]

    class Loaded(WorkerMessage):
        """The runs' comparison (``cockpit.compare.compare``'s dict), read by the worker."""

    def __init__(self, runs: list[RunDir]) -> None:
        super().__init__(name="compare")
        self.runs = runs
        self.data: dict[str, Any] | None = None
        self.by_tokens = False
        self.curve = "loss"

    def compose(self) -> ComposeResult:
        from textual_plotext import PlotextPlot

        yield Static(f"comparing {len(self.runs)} runs …", id="compare-title", classes="screen-title")
        with Horizontal(id="compare-body"):
            yield PlotextPlot(id="compare-plot")
            with Vertical(id="compare-right"):
                yield DataTable(id="compare-summary", cursor_type="none", zebra_stripes=True)
                yield DataTable(id="compare-config", cursor_type="none", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self._load()

    @work(thread=True, exclusive=True, group="compare")
    def _load(self) -> None:
        self.post_message(self.Loaded(compare(self.runs)))

    @on(Loaded)
    def _show(self, message: Loaded) -> None:
        self.data = message.result
        self._fill_tables()
        self.draw_plot()

    # -- the pieces ---------------------------------------------------------------------------------
    def curves(self) -> list[str]:
        """Curves any of the runs has, loss and eval loss first."""
        names: list[str] = []
        for r in (self.data or {}).get("runs", []):
            names += [n for n in r["curves"] if n not in names]
        return sorted(names, key=lambda n: (n != "loss", n != "eval_loss", n))

    def _columns_width(self) -> int:
        """Characters per run column, from the screen's width (known before the tables are laid
        out): the tables take the whole width when narrow (under the plot), half beside it."""
        width = self.size.width if self.has_class("-narrow") else self.size.width // 2
        return max(12, width - 18) // max(1, len(self.runs)) - 2

    def _fill_tables(self) -> None:
        assert self.data is not None
        runs = self.data["runs"]
        col = max(8, self._columns_width())
        names = [f"{MARKERS[i % len(MARKERS)]} {r['name']}" for i, r in enumerate(runs)]
        summary = self.query_one("#compare-summary", DataTable)
        summary.clear(columns=True)
        summary.add_column("summary", key="label")
        for i, name in enumerate(names):
            summary.add_column(clip(name, col), key=f"r{i}")
        for key, label in summary_rows([r["summary"] for r in runs]):
            summary.add_row(label, *(clip(fmt_cell(key, r["summary"]), col) for r in runs), key=key)
        config = self.query_one("#compare-config", DataTable)
        config.clear(columns=True)
        diff = self.data["config_diff"]
        config.add_column(f"config: {len(diff)} differ" if diff else "config: the same", key="key")
        for i, name in enumerate(names):
            config.add_column(clip(name, col), key=f"r{i}")
        for key, values in diff.items():
            config.add_row(key, *(clip(fmt_value(v), col) for v in values), key=key)
        self._title()

    def _title(self) -> None:
        t = Text()
        t.append(f"Compare {len(self.runs)} runs", style="bold")
        t.append(f"  {CURVE_TITLES.get(self.curve, self.curve)} by {'tokens seen' if self.by_tokens else 'step'}")
        t.append("  t: step/tokens  m: next curve", style="dim")
        self.query_one("#compare-title", Static).update(t)

    def draw_plot(self) -> None:
        from textual_plotext import PlotextPlot

        if self.data is None:
            return
        widget = self.query_one("#compare-plot", PlotextPlot)
        plt = widget.plt
        plt.clear_data()
        plt.clear_figure()
        for i, r in enumerate(self.data["runs"]):
            xs_all = r["tokens"] if self.by_tokens else r["steps"]
            pts = [(x, y) for x, y in zip(xs_all, r["curves"].get(self.curve, [])) if x is not None and y is not None]
            if pts:
                plt.plot([p[0] for p in pts], [p[1] for p in pts], marker=MARKERS[i % len(MARKERS)], label=r["name"])
        plt.title(CURVE_TITLES.get(self.curve, self.curve))
        plt.xlabel("tokens seen" if self.by_tokens else "step")
        widget.refresh()
        self._title()

    # -- keys -----------------------------------------------------------------------------------
    def action_toggle_x(self) -> None:
        self.by_tokens = not self.by_tokens
        self.draw_plot()

    def action_next_curve(self) -> None:
        names = self.curves()
        if names:
            self.curve = names[(names.index(self.curve) + 1) % len(names)] if self.curve in names else names[0]
            self.draw_plot()

    def on_resize(self) -> None:
        if self.data is not None:
            self.call_after_refresh(self._fill_tables)

    def action_leave(self) -> None:
        self.dismiss()
