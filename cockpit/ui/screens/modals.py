"""Modals: confirmation (short, or a long text with two answers), full-size metric plot, log viewer
with search, text preview, prompt."""

from __future__ import annotations

import os
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label, RichLog, Static

from cockpit.ui.formatting import step_ticks
from cockpit.ui.palette import themed
from cockpit.ui.state import METRIC_TITLES, METRICS, RunState


class Confirm(ModalScreen[bool]):
    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str, yes: str = "Yes", danger: bool = True) -> None:
        super().__init__()
        self.question, self.yes, self.danger = question, yes, danger

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.question, id="question")
            with Horizontal(id="dialog-buttons"):
                yield Button(f"{self.yes} (y)", variant="error" if self.danger else "primary", id="yes")
                yield Button("Cancel (n)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class Decide(ModalScreen[bool]):
    """A long text (scrollable) and two answers: ``yes`` (y) or ``no`` (n, Esc)."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, title: str, body: Text | str, yes: str, no: str = "Cancel", danger: bool = True) -> None:
        super().__init__()
        self.title_text, self.body, self.yes, self.no, self.danger = title, body, yes, no, danger

    def compose(self) -> ComposeResult:
        with Vertical(id="decide"):
            yield Label(self.title_text, classes="pane-title")
            with VerticalScroll(id="decide-body"):
                yield Static(self.body)
            with Horizontal(id="dialog-buttons"):
                yield Button(f"{self.yes} (y)", variant="error" if self.danger else "primary", id="yes")
                yield Button(f"{self.no} (n)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class Prompt(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, question: str, value: str = "") -> None:
        super().__init__()
        self.question, self.value = question, value

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.question)
            yield Input(self.value, id="prompt-input")
            yield Label("Enter to confirm, Esc to cancel", classes="dim")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class OpenConfig(ModalScreen["Path | None"]):
    """Ctrl+O in Setup: a YAML config to open, typed as a path (Enter) or picked in the tree of the
    folder the cockpit was started in (relative paths in it are read from there too)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def compose(self) -> ComposeResult:
        from textual.widgets import DirectoryTree

        class YamlTree(DirectoryTree):
            def filter_paths(self, paths):
                return [
                    p for p in paths if not p.name.startswith(".") and (p.is_dir() or p.suffix in (".yaml", ".yml"))
                ]

        with Vertical(id="open-config"):
            yield Label(
                "Open a config (LLaMA-Factory YAML): a path and Enter, or pick a file below", classes="pane-title"
            )
            yield Input(str(self.folder) + os.sep, id="open-path")
            yield YamlTree(self.folder, id="open-tree")
            yield Label("Enter opens · Tab: the tree · Esc cancels", classes="dim")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        path = Path(event.value.strip()).expanduser()
        if path.is_file():
            self.dismiss(path)
        else:
            self.notify(f"no such file: {path}", severity="error")

    def on_directory_tree_file_selected(self, event) -> None:
        self.dismiss(Path(event.path))

    def action_cancel(self) -> None:
        self.dismiss(None)


class TextView(ModalScreen[None]):
    """A read-only text (the equivalent command and YAML; an export result)."""

    BINDINGS = [Binding("escape,q", "close", "Close")]

    def __init__(self, title: str, body: Text | str) -> None:
        super().__init__()
        self.title_text, self.body = title, body

    def compose(self) -> ComposeResult:
        with Vertical(id="textview"):
            yield Label(self.title_text, classes="pane-title")
            with VerticalScroll():
                yield Static(self.body, id="textview-body")
        yield Footer()

    def set_body(self, body: Text | str) -> None:
        """Replace the text (a worker's result arriving while the view is open)."""
        self.body = body
        if self.is_attached:
            self.query_one("#textview-body", Static).update(body)

    def action_close(self) -> None:
        self.dismiss(None)


class PlotView(ModalScreen[None]):
    """One metric at full size (textual-plotext, imported only when opened)."""

    BINDINGS = [
        Binding("escape,q", "close", "Close"),
        Binding("1", "metric('loss')", "loss"),
        Binding("2", "metric('lr')", "lr"),
        Binding("3", "metric('grad_norm')", "grad norm"),
        Binding("4", "metric('tokens_per_s')", "tokens/s"),
        Binding("tab", "next_metric", "Next", show=False),
    ]

    def __init__(self, state: RunState, metric: str = "loss", title: str = "") -> None:
        super().__init__()
        self.state, self.metric, self.title_text = state, metric, title
        self._version = -1

    def compose(self) -> ComposeResult:
        from textual_plotext import PlotextPlot

        with Vertical(id="plotview"):
            yield PlotextPlot(id="plot")
        yield Footer()

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(1.0, self._maybe_redraw)

    def _maybe_redraw(self) -> None:
        if self.state.version != self._version:
            self.redraw()

    def redraw(self) -> None:
        from textual_plotext import PlotextPlot

        self._version = self.state.version
        s = self.state.series[self.metric]
        widget = self.query_one("#plot", PlotextPlot)
        plt = widget.plt
        plt.clear_data()
        plt.clear_figure()
        xs = list(s.xs)
        if len(s):
            plt.plot(xs, s.means(), marker="braille")
        if self.metric == "loss" and len(self.state.evals):
            xs += list(self.state.evals.xs)
            plt.scatter(list(self.state.evals.xs), self.state.evals.means(), marker="x", label="eval")
        plt.xticks(*step_ticks(xs))
        width = f", {s.width} steps per point" if s.width > 1 else ""
        plt.title(f"{METRIC_TITLES[self.metric]} — {self.title_text or self.state.run_id}{width}")
        plt.xlabel("step")
        widget.refresh()

    def action_metric(self, metric: str) -> None:
        self.metric = metric
        self.redraw()

    def action_next_metric(self) -> None:
        self.action_metric(METRICS[(METRICS.index(self.metric) + 1) % len(METRICS)])

    def action_close(self) -> None:
        self.dismiss(None)


class LogView(ModalScreen[None]):
    """The run's logs (the kept tail, bounded), filtered as you type."""

    BINDINGS = [Binding("escape", "close", "Close"), Binding("ctrl+f,slash", "focus_search", "Search")]

    def __init__(self, tail, title: str = "", poll: bool = True) -> None:
        super().__init__()
        self.tail, self.title_text, self.poll = tail, title, poll
        self.needle = ""
        self.seen = 0

    def compose(self) -> ComposeResult:
        with Vertical(id="logview"):
            yield Label(f"Logs — {self.title_text}", classes="pane-title")
            yield Input(placeholder="filter (case-insensitive)", id="logview-search")
            yield RichLog(id="logview-log", max_lines=self.tail.lines.maxlen, wrap=False, markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.show("")
        self.set_interval(0.5, self._follow)

    def show(self, needle: str) -> None:
        log = self.query_one("#logview-log", RichLog)
        log.clear()
        if self.poll:
            self.tail.read_new()
        for line in self.tail.search(needle):
            log.write(self._styled(line, needle))
        self.needle = needle
        self.seen = self.tail.total

    def _styled(self, line: str, needle: str) -> Text:
        t = Text(line)
        if needle:
            t.highlight_words([needle], style=themed("reverse $text-warning"), case_sensitive=False)
        return t

    def _follow(self) -> None:
        if self.poll:
            self.tail.read_new()
        n = min(self.tail.total - self.seen, len(self.tail.lines))
        self.seen = self.tail.total
        if n > 0:
            new = list(self.tail.lines)[-n:]
            log = self.query_one("#logview-log", RichLog)
            low = self.needle.lower()
            for line in new:
                if not low or low in line.lower():
                    log.write(self._styled(line, self.needle))

    def on_input_changed(self, event: Input.Changed) -> None:
        self.show(event.value)

    def action_focus_search(self) -> None:
        self.query_one("#logview-search", Input).focus()

    def action_close(self) -> None:
        self.dismiss(None)


def key_rows(screen, app) -> list[tuple[str, str, str]]:
    """(where, key, what) for every binding active on ``screen``: the screen's own first, then
    the app's, then the focused widget's (cursor keys and the like)."""
    from textual.screen import Screen as _Screen

    own, glob, widget = [], [], []
    seen: set[tuple[str, str]] = set()
    for active in screen.active_bindings.values():
        b = active.binding
        if (
            not b.description
            or b.action in ("toggle_keys", "command_palette")
            or any(a in b.action for a in ("focus_next", "focus_previous", "copy_text"))
        ):
            continue
        row = (app.get_key_display(b), b.description)
        if row in seen:
            continue
        seen.add(row)
        if isinstance(active.node, _Screen):
            own.append(("this screen", *row))
        elif active.node is app:
            glob.append(("everywhere", *row))
        else:
            widget.append((type(active.node).__name__, *row))
    return own + glob + [("everywhere", "^p", "command palette"), ("everywhere", "?", "this list")] + widget


class KeysView(ModalScreen[None]):
    """``?``: the keys of the screen below, with what they do (Esc or ? closes)."""

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, screen) -> None:
        super().__init__()
        self.below = screen

    def compose(self) -> ComposeResult:
        t = Text()
        t.append(
            f"Keys: {getattr(self.below, 'TITLE', None) or type(self.below).__name__.replace('Screen', '')}\n",
            style="bold",
        )
        where = None
        for group, key, what in key_rows(self.below, self.app):
            if group != where:
                where = group
                t.append(f"\n{group}\n", style="bold underline")
            t.append(f"  {key:>10}  ", style="bold")
            t.append(f"{what}\n")
        t.append("\nEsc or ? closes", style="dim")
        with VerticalScroll(id="keysview"):
            yield Static(t)

    def action_close(self) -> None:
        self.dismiss()
