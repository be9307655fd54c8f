"""The Live screen's panes: each a widget that takes the run state and decides for itself whether
to redraw, by comparing what it would show with what it shows (never by the identity of the state's
objects, so a reducer that mutates instead of replacing cannot freeze a pane).

- :class:`TextPane`: a ``Static`` shown from rendered text (the header, devices, alerts): redrawn only
  when the text changed, with a layout pass only when its number of lines changed (a layout of the
  whole screen per step is most of the UI's CPU otherwise).
- :class:`DevicesPane` / :class:`AlertsPane`: ``device_grid.devices`` (one node's GPUs, several nodes', or a
  node x GPU heatmap, with a drill-down to one node) / ``formatting.alerts`` of the state.
- :class:`SparkGrid`: a grid of metric sparklines with its own throttle (Textual blends a colour per bar
  on every render: about a third of the UI's CPU while following), at most one redraw per
  ``period_s`` while the run goes on; the stage grid (dpo / kto / rm) shows a row once the run reports it.
  A throttled pane is ``pending``, and ``due()`` once its period is over: only then does the Live
  screen's 4 Hz poll draw without a new event.
- :class:`StepBar`: Textual's ProgressBar without the repaint its (unshown) ETA estimate caused at
  every update.
- :class:`CompletionsPane`: grpo's latest sampled completions and their rewards (``formatting.completions``),
  scrollable; hidden until the run reports completions (only grpo does).
- :class:`ExpertsPane`: a mixture-of-experts run's expert load per layer (``formatting.expert_load``); hidden
  until the run reports one.

``cockpit/ui/formatting.py`` stays pure (state -> text); these widgets only place its output.
"""

from __future__ import annotations

import time
from typing import Any

from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.reactive import var
from textual.widgets import ProgressBar, Sparkline, Static

from cockpit.ui import device_grid, formatting
from cockpit.ui.state import METRIC_TITLES, STAGE_TITLES, RunState, fmt_num

SHORT = {"loss": "loss", "lr": "lr", "grad_norm": "grad norm", "tokens_per_s": "tokens/s"}


class TextPane(Static):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._shown: object = None
        self._lines: int | None = None

    def show(self, content: Any) -> None:
        if content == self._shown:  # e.g. telemetry at 1 Hz with the same numbers
            return
        self._shown = content
        lines = content.plain.count("\n") if hasattr(content, "plain") else str(content).count("\n")
        self.update(content, layout=lines != self._lines)
        self._lines = lines


class StepBar(ProgressBar):
    """The Live screen's progress bar. Textual's ProgressBar repaints itself whenever its ETA estimate
    moves, at every update and every second, though this bar does not show it (the header says the
    ETA): here the estimate is kept without a repaint, so the bar repaints only when it changes."""

    _display_eta: var[int | None] = var(None)


class DevicesPane(TextPane):
    """Per-device memory (amdsmi / NVML / the ranks' torch figures), the CPU run's RSS, the comm line;
    many nodes as a node x GPU heatmap, ``node`` (the drill-down) one node's GPUs (``ui/device_grid.py``)."""

    MAP_PERIOD_S = 2.0  # a many-node map follows the figures at most this often (node 0's come every second)

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.node: int | None = None
        self.pending = False  # a newer map held back by the throttle: the next poll draws it
        self._map_at: float | None = None  # when the map was last drawn while following live

    def show_state(self, state: RunState, max_lines: int) -> None:
        width = self.size.width or self.screen.size.width // 2
        now = time.monotonic()
        live = getattr(self.screen, "replay_progress", None) is None and not state.ended  # never held in a replay
        hold = live and self._map_at is not None and now - self._map_at < self.MAP_PERIOD_S
        self.show(device_grid.devices(state, width, max_lines, only=self.node, hold=hold))
        self.pending = hold and device_grid.map_behind(state)
        if live and not hold:
            self._map_at = now

    def due(self) -> bool:
        """A map held back by the throttle whose period is over: the next draw shows it."""
        return self.pending and (self._map_at is None or time.monotonic() - self._map_at >= self.MAP_PERIOD_S)

    def step_node(self, state: RunState, by: int) -> int | None:
        """The drill-down moves ``by`` nodes (from the map: the first or the last); past either end, back to the map."""
        nodes = sorted(state.nodes)
        if not nodes:
            return None
        if self.node not in nodes:
            self.node = nodes[0] if by > 0 else nodes[-1]
        else:
            at = nodes.index(self.node) + by
            self.node = nodes[at] if 0 <= at < len(nodes) else None
        return self.node


class AlertsPane(TextPane):
    """The latest alerts, checkpoints and probe sets, ``limit`` lines of alerts at most."""

    def show_state(self, state: RunState, limit: int) -> None:
        self.show(formatting.alerts(state, limit))


class CompletionsPane(VerticalScroll):
    """grpo's latest sampled prompts, completions and rewards (``RunState.completions``), newest first,
    wrapped to the pane's width and scrollable (the mouse wheel; ``c`` focuses it for the keys). Hidden
    until the run reports completions; redrawn only when the text changes (a step without new samples, or
    telemetry, draws nothing). Its title (step, count, the key) is the border's."""

    HINT = "c: scroll"

    def __init__(self, **kw: Any) -> None:
        super().__init__(classes="hidden", **kw)
        self.can_focus = False  # only ``c`` focuses it: the screen's keys stay the screen's
        self._state: RunState | None = None

    def compose(self) -> ComposeResult:
        yield TextPane(id="completions-text")

    def show_state(self, state: RunState) -> None:
        if not state.completions:
            return
        self._state = state
        if self.has_class("hidden"):
            self.remove_class("hidden")
        title = formatting.completions_title(state, "esc: back" if self.has_focus else self.HINT)
        if self.border_title != title:
            self.border_title = title
        width = self.scrollable_content_region.width or self.screen.size.width - 3
        self.query_one(TextPane).show(formatting.completions(state, max(20, width)))

    def take_focus(self) -> None:
        self.can_focus = True
        self.focus()

    def on_resize(self) -> None:
        if self._state is not None:
            self.call_after_refresh(self.show_state, self._state)

    def on_focus(self) -> None:
        self.on_resize()

    def on_blur(self) -> None:
        self.can_focus = False
        self.on_resize()


class ExpertsPane(TextPane):
    """A mixture-of-experts run's expert load per layer (``formatting.expert_load``); hidden until the run
    reports one (only an MoE model's does)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(classes="hidden", **kw)

    def show_state(self, state: RunState, max_lines: int) -> None:
        if not state.expert_load:
            return
        if self.has_class("hidden"):
            self.remove_class("hidden")
        width = self.size.width or self.screen.size.width - 2
        self.show(formatting.expert_load(state, max(20, width), max_lines))


class SparkGrid(Grid):
    """A sparkline per metric, labelled with its last value. ``hide_until_reported``: the grid and each
    row stay hidden until the run reports that metric (the stage metrics of dpo / kto / rm)."""

    def __init__(
        self, metrics: tuple[str, ...], titles: dict[str, str], *, hide_until_reported: bool = False, **kw: Any
    ) -> None:
        super().__init__(classes="hidden" if hide_until_reported else "", **kw)
        self.metrics = metrics
        self.titles = titles
        self.hide_until_reported = hide_until_reported
        self.period_s = 1.0
        self.full_width_at = 24  # points: fewer get a cell each
        self.pending = False  # a redraw held back by the throttle: the next poll draws it
        self._at = 0.0
        self.drawn: dict[str, tuple[int, int]] = {}  # metric -> (points, width) its sparkline shows

    def compose(self) -> ComposeResult:
        for m in self.metrics:
            hidden = self.hide_until_reported
            with Horizontal(classes="spark-row hidden", id=f"row-{m}") if hidden else Horizontal(classes="spark-row"):
                yield Static(self.titles[m], id=f"lbl-{m}", classes="spark-label")
                yield Sparkline([], id=f"spark-{m}", summary_function=max)

    def show_state(self, state: RunState) -> None:
        now = time.monotonic()
        self.pending = not state.ended and now - self._at < self.period_s
        if self.pending:
            return
        self._at = now
        for m in self.metrics:
            s = state.series[m]
            if self.drawn.get(m) == (s.n, s.width) or (self.hide_until_reported and not s.n):
                continue
            if self.hide_until_reported and m not in self.drawn:  # the first value: show its row
                self.remove_class("hidden")
                self.query_one(f"#row-{m}").remove_class("hidden")
            self.drawn[m] = (s.n, s.width)
            spark = self.query_one(f"#spark-{m}", Sparkline)
            spark.data = s.means()
            # a bar per point while the points are few (3 points drawn over the whole row read as one
            # block); the whole row from full_width_at points on
            spark.styles.width = len(spark.data) if len(spark.data) < self.full_width_at else "1fr"
            named = state.metric_label(m)  # grpo's reward functions: the function's name, its mean±std
            if named is not None:
                label = f"{named[0][:9]:<9} {named[1]:>10}"
            else:
                label = f"{SHORT.get(m) or self.titles[m]:<9} {fmt_num(s.last, m):>10}"
            self.query_one(f"#lbl-{m}", Static).update(label, layout=False)

    def due(self) -> bool:
        """A redraw held back by the throttle whose period is over: the next draw shows it."""
        return self.pending and time.monotonic() - self._at >= self.period_s


def metric_grid() -> SparkGrid:
    from cockpit.ui.state import METRICS

    return SparkGrid(METRICS, METRIC_TITLES, id="sparks")


def stage_grid() -> SparkGrid:
    from cockpit.ui.state import STAGE_METRICS

    return SparkGrid(STAGE_METRICS, STAGE_TITLES, hide_until_reported=True, id="stage-sparks")
