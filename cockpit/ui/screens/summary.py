"""A finished (or failed / stopped) run: summary.json, the loss plot, probes before/after with
the answers; merge / export / serve / chat (``cockpit export|serve|chat`` in subprocesses)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from cockpit.run.follow import peak_short, per_device_words
from cockpit.store.output_mark import foreign_adapter
from cockpit.store.rundir import RunDir
from cockpit.ui.formatting import STATE_STYLE, STATE_SYMBOL, step_ticks
from cockpit.ui.messages import WorkerMessage
from cockpit.ui.palette import themed
from cockpit.ui.screens.run_actions import ACTION_BINDINGS, RunActionsMixin
from cockpit.ui.state import RunFollower, fmt_duration
from cockpit.ui.widgets import clip, share_width

if TYPE_CHECKING:
    from textual import getters

    from cockpit.ui.app import CockpitApp


def summary_text(run: RunDir, summary: dict, status: dict) -> Text:
    state = summary.get("state") or status.get("state") or "?"
    t = Text()
    t.append(run.run_id, style="bold")
    t.append("  ")
    t.append(f" {STATE_SYMBOL.get(state, '?')} {state} ", style=themed(f"reverse {STATE_STYLE.get(state, '')}"))
    reason = summary.get("reason") or status.get("reason")
    if reason:
        t.append(f"  {reason}", style=themed(STATE_STYLE.get(state, "")))
    steps = summary.get("steps", status.get("step"))
    t.append(f"\nsteps {steps}/{summary.get('total_steps') or status.get('total_steps') or '?'}")
    if summary.get("epochs") is not None:
        t.append(f"  epochs {summary['epochs']:.2f}")
    t.append(f"  runtime {fmt_duration(summary.get('runtime_s'))}")
    if summary.get("tokens_per_s") is not None:
        t.append(f"  {summary['tokens_per_s']:,.0f} tokens/s")
    per_device = per_device_words(summary)
    if per_device:
        t.append("\nper device: " + per_device)
        if summary.get("mfu") is not None:
            t.append(f" {peak_short(summary)}", style="dim")
    fl, ll = summary.get("first_loss"), summary.get("last_loss")
    if isinstance(fl, (int, float)) and isinstance(ll, (int, float)):
        t.append(f"\nloss {fl:.4f} → {ll:.4f}")
        t.append(
            f"  ({100 * (ll - fl) / fl:+.1f}%)" if fl else "",
            style=themed("$text-success" if ll < fl else "$text-warning"),
        )
    for key, label, scale, higher_is_better in (
        ("eval_loss", "eval loss", None, False),
        ("eval_accuracy", "eval accuracy", 100, True),
    ):
        line = _eval_metric_line(summary.get(key), label, scale, higher_is_better)
        if line:
            t.append(*line)
    t.append_text(probe_lines(summary.get("probes_before") or {}, summary.get("probes_after") or {}))
    before, after = summary.get("held_out_before"), summary.get("held_out_after")
    t.append_text(held_out_reward_lines(before or {}, after or {}, summary.get("held_out_fell")))  # grpo
    if before and after and before.get("accuracy") is not None and after.get("accuracy") is not None:  # dpo / rm
        what = "value head scores chosen higher" if summary.get("stage") == "rm" else "policy prefers the chosen answer"
        t.append(
            f"\nheld-out pairs ({after.get('pairs')}): {100 * before['accuracy']:.0f}% → {100 * after['accuracy']:.0f}% ({what})",
            style=themed("$text-success" if after["accuracy"] > before["accuracy"] else "$text-warning"),
        )
    if summary.get("data", {}).get("lines"):  # a non-SFT stage's data report
        t.append("\ndata: " + "; ".join(summary["data"]["lines"][:2]), style="dim")
    tr = summary.get("truncation")
    if tr:
        t.append(
            f"\ndata: {tr.get('samples')} samples, p50 {tr.get('p50')} / max {tr.get('max')} tokens, "
            f"{tr.get('truncated')} truncated ({tr.get('truncated_pct', 0):.1f}%)",
            style="dim",
        )
    t.append_text(predict_lines(summary))
    if summary.get("adapter_dir"):
        t.append(f"\nadapter: {summary['adapter_dir']}", style="dim")
    if why := foreign_adapter(run, summary):  # another run wrote over its output_dir
        t.append(f"\n⚠ {why}", style=themed("bold $text-warning"))
    if not summary:
        t.append("\n(no summary.json yet)", style="dim")
    return t


def held_out_reward_lines(before: dict, after: dict, fell: list | None = None) -> Text:
    """grpo: the held-out prompts' mean reward (greedy completions scored by the run's reward
    functions, weighted) before -> after training, and each function's mean, a reward that fell
    (summary.json ``held_out_fell``) marked; one side when the other is missing (a stopped run has no after)."""
    t = Text()
    b, a = before.get("mean_reward"), after.get("mean_reward")
    if not isinstance(b, (int, float)) and not isinstance(a, (int, float)):
        return t
    prompts = after.get("prompts") or before.get("prompts")

    def side(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, (int, float)) else "-"

    t.append(f"\nheld-out prompts ({prompts}): mean reward {side(b)} → {side(a)}")
    if isinstance(b, (int, float)) and isinstance(a, (int, float)):
        t.append(f" ({a - b:+.3f})", style=themed("$text-success" if a > b else "$text-warning"))
    names = list(dict.fromkeys([*(before.get("rewards") or {}), *(after.get("rewards") or {})]))
    fallen = {str(f.get("reward")): f for f in fell or [] if isinstance(f, dict)}
    if names:
        t.append("\nrewards: ", style="dim")
        for i, n in enumerate(names):
            each = f"{n} {side((before.get('rewards') or {}).get(n))} → {side((after.get('rewards') or {}).get(n))}"
            t.append(", " if i else "", style="dim")
            t.append(
                f"{each} ▼ FELL" if n in fallen else each, style=themed("bold $text-error") if n in fallen else "dim"
            )
    if fallen:
        t.append(
            f"\n⚠ {', '.join(fallen)} fell on the held-out prompts while the total "
            f"{'rose' if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > b else 'moved'}: "
            "reward hacking? (reweight, or gate the other rewards on it)",
            style=themed("bold $text-warning"),
        )
    return t


def held_out_sample_rows(held: dict[str, dict]) -> tuple[list[dict], list[dict]]:
    """grpo's held-out samples (the first prompts' greedy completions and their reward) before and
    after training, as the probe table's rows: what a run without probes shows there."""

    def row(s: dict) -> dict:
        said = str(s.get("completion") or "").strip() or "(empty)"
        reward = s.get("reward")
        return {"prompt": s.get("prompt") or "", "expect": "", "answer": f"{said}  → {reward:.2f}"}

    def rows(ev: dict | None) -> list[dict]:
        samples = (ev or {}).get("samples") or []
        return [row(s) for s in samples if isinstance(s, dict) and isinstance(s.get("reward"), (int, float))]

    return rows(held.get("before")), rows(held.get("after"))


def predict_lines(summary: dict) -> Text:
    """do_predict's scores (LLaMA-Factory's BLEU-4 / ROUGE, 0..100), the samples and where the
    predictions are; a prediction-only run's adapter."""
    t = Text()
    if summary.get("adapter_name_or_path"):
        t.append(f"\npredicted with the adapter {summary['adapter_name_or_path']}", style="dim")
    p = summary.get("predict")
    if not isinstance(p, dict) or not all(isinstance(p.get(k), (int, float)) for k in PREDICT_SCORES):
        return t
    scores = "  ".join(f"{label} {p[k]:.2f}" for k, label in PREDICT_SCORES.items())
    stopped = ", stopped early" if p.get("stopped") else ""
    t.append(f"\npredict ({p.get('samples')} samples{stopped}): {scores}")
    if p.get("predictions"):
        t.append(f"\npredictions: {p['predictions']}", style="dim")
    return t


PREDICT_SCORES = {"bleu_4": "BLEU-4", "rouge_1": "ROUGE-1", "rouge_2": "ROUGE-2", "rouge_l": "ROUGE-L"}


def _count(p: dict) -> str:
    return f"{p.get('passed')}/{p.get('total')} ({100 * (p.get('rate') or 0):.0f}%)" if p else "-"


def probe_lines(before: dict, after: dict) -> Text:
    """Probes before -> after, per set when the probes name sets (the demo: identity, control)."""
    t = Text()
    if not (before or after):
        return t
    sets = list(dict.fromkeys([*(before.get("sets") or {}), *(after.get("sets") or {})]))
    if not sets:
        t.append(f"\nprobes: {_count(before)} before → {_count(after)} after")
        return t
    for name in sets:
        b, a = (before.get("sets") or {}).get(name) or {}, (after.get("sets") or {}).get(name) or {}
        verdict = ""
        if a and b:
            verdict = (
                ("  ✓ kept" if a["passed"] >= b["passed"] else "  ✗ forgot some")
                if name == "control"
                else ("  ✓ learned" if a["passed"] > b["passed"] else "  ✗ not learned")
            )
        t.append(f"\nprobes {name}: {_count(b)} before → {_count(a)} after")
        t.append(verdict, style=themed("$text-success" if "✓" in verdict else "$text-error"))
    return t


def image_label(r: dict) -> str:
    """An image probe's image as the Summary names it: its file name and width×height (the result's
    ``image`` / ``image_size``); "" for a text probe."""
    if not r.get("image"):
        return ""
    size = r.get("image_size")
    return f"{r['image']} {size[0]}×{size[1]}" if isinstance(size, list) and len(size) == 2 else str(r["image"])


def probe_prompt(r: dict) -> str:
    """A probe's prompt as the probe table shows it: an image probe's image in place of its ``<image>``
    (or before the prompt without one)."""
    import re

    prompt = str(r.get("prompt", ""))
    if not r.get("image"):
        return prompt
    label = f"[{image_label(r)}] "
    return re.sub(r"<image>\s*", lambda _: label, prompt, count=1) if "<image>" in prompt else label + prompt


def probe_detail(found: list[tuple[str, dict]]) -> Text:
    """One probe, whole: the prompt, what it expects, and each side's answer with its verdict."""
    first = found[0][1]
    t = Text()
    if first.get("set"):
        t.append(f"set: {first['set']}\n", style="dim")
    if first.get("image_path"):
        t.append("image\n", style="bold")
        t.append(f"{image_label(first)}  {first['image_path']}\n")
        t.append("i on the probe's row: the image (cockpit web opens it in the browser)\n\n", style="dim")
    t.append("prompt\n", style="bold")
    t.append(f"{first.get('prompt', '')}\n\n")
    exp = first.get("expect", first.get("expected"))
    if exp:
        t.append("expects\n", style="bold")
        t.append((", ".join(map(str, exp)) if isinstance(exp, list) else str(exp)) + "\n\n")
    for when, r in found:
        ok = r.get("ok")
        t.append(f"{when} training: ", style="bold")
        t.append("✓ passed\n" if ok else "✗ failed\n", style=themed("$text-success" if ok else "$text-error"))
        t.append((r.get("answer") or "(empty)") + "\n\n")
    return t


# probe table columns: the wanted and the least width of prompt, expected, before, after
PROBE_COLUMNS = ("prompt", "expected", "before", "after")
PROBE_WANTS, PROBE_MINS = [48, 20, 60, 60], [12, 6, 10, 14]  # the most and the least cells


class ProbeTable(DataTable):
    """The probe table, whose cells are cut to its width: it says when that width changes, which the
    screen's own resize does not cover (the narrow layout's class moves the table from half the screen
    to all of it after the first fill; under load the rows stayed cut to the half: CI, 2026-12-06)."""

    class WidthChanged(Message):
        """The table's width is not the one its cells were cut to."""

    def on_resize(self, event: events.Resize) -> None:
        self.post_message(self.WidthChanged())


class SummaryScreen(RunActionsMixin, Screen):
    if TYPE_CHECKING:  # as Textual types MessagePump.app, for mypy only: the attributes used on the app are checked
        app = getters.app(CockpitApp)

    BINDINGS = [
        *ACTION_BINDINGS,
        Binding("p", "plot", "Plot"),
        Binding("l", "logs", "Logs"),
        Binding("v", "live", "Event view"),
        Binding("i", "image", "Image"),  # an image probe's row (check_action): its image
        Binding("escape,q", "leave", "Back"),
    ]

    def __init__(self, run: RunDir) -> None:
        super().__init__(name=f"summary-{run.run_id}")
        self.run = run
        self.follower = RunFollower(run)
        self.probe_width = 0  # the table width the probe cells were last cut to

    def compose(self) -> ComposeResult:
        from textual_plotext import PlotextPlot

        yield Static(id="summary-text", classes="pane")
        with Horizontal(id="summary-body"):
            yield PlotextPlot(id="summary-plot")
            with Vertical(id="summary-right"):
                yield ProbeTable(id="probes", zebra_stripes=True, cursor_type="row")
        yield Static(id="export-result", classes="dim")
        yield Footer()

    def on_mount(self) -> None:
        if not self.query("#probes"):  # closed before its first frame (Enter then F3 at once: issue 50)
            return
        self.app.sub_title = self.run.run_id
        self.query_one("#summary-text", Static).update(
            summary_text(self.run, self.run.read_summary(), self.run.read_status())
        )
        table = self.query_one("#probes", DataTable)
        for col in ("prompt", "expected", "before", "after"):
            table.add_column(col, key=col)
        self._load()

    class Loaded(WorkerMessage):
        """The worker has read the run's event log into ``self.follower``."""

    @work(thread=True, exclusive=True, group="summary")
    def _load(self) -> None:
        self.follower.poll()
        self.post_message(self.Loaded())

    @on(Loaded)
    def _draw(self) -> None:
        from textual_plotext import PlotextPlot

        st = self.follower.state
        s = st.series["loss"]
        widget = self.query_one("#summary-plot", PlotextPlot)
        plt = widget.plt
        plt.clear_data()
        if len(s):
            plt.plot(list(s.xs), s.means(), marker="braille", label="train")
        if len(st.evals):
            plt.scatter(list(st.evals.xs), st.evals.means(), marker="x", label="eval")
        plt.xticks(*step_ticks([*s.xs, *st.evals.xs]))
        plt.title("loss")
        plt.xlabel("step")
        widget.refresh()
        self._fill_probes()

    def _fill_probes(self) -> None:
        """Every column on screen at any width (the after column is the one that matters): the
        cells are cut to the table's width; a row per probe set names it."""
        st = self.follower.state
        table = self.query_one("#probes", DataTable)
        table.clear()
        before = (st.probes.get("before") or {}).get("results") or []
        after = (st.probes.get("after") or {}).get("results") or []
        samples = not (before or after)  # no probes: grpo's held-out samples, when the run has them
        if samples:
            before, after = held_out_sample_rows(st.held_out)
        n = max(len(before), len(after))

        def longest(rows: list[dict], key: str, extra: int = 0) -> int:
            return max((cell_len(str(r.get(key) or "").replace("\n", " ")) + extra for r in rows), default=0)

        every = before + after
        wants = [
            min(c, max(m, w))
            for c, m, w in zip(
                PROBE_WANTS,
                PROBE_MINS,
                (
                    max((cell_len(probe_prompt(r).replace("\n", " ")) for r in every), default=0),
                    longest(every, "expect") + 2,
                    longest(before, "answer", 2),
                    longest(after, "answer", 2),
                ),
            )
        ]
        self.probe_width = table.size.width
        room = (table.size.width or self.size.width) - 2 * table.cell_padding * len(PROBE_COLUMNS) - 2
        widths = dict(zip(PROBE_COLUMNS, share_width(room, wants, PROBE_MINS)))

        def cell(r: dict | None, width: int) -> Text:
            if not r:
                return Text("-", style="dim")
            ans = (r.get("answer") or "").replace("\n", " ") or "(empty)"
            if "ok" not in r:  # a held-out sample: its reward, no verdict
                return Text(clip(ans, width))
            return Text(
                clip(("✓ " if r.get("ok") else "✗ ") + ans, width),
                style=themed("$text-success" if r.get("ok") else "$text-error"),
            )

        group = None
        if samples and n:  # the held-out prompts' greedy answers, each with its reward
            table.add_row(
                Text(clip("— held-out —", widths["prompt"]), style="bold"),
                "",
                Text(clip("answer → reward", widths["before"]), style="dim"),
                Text(clip("answer → reward", widths["after"]), style="dim"),
                key="held-out",
            )
        for i in range(n):
            b = before[i] if i < len(before) else None
            a = after[i] if i < len(after) else None
            base = a or b or {}
            if base.get("set") and base.get("set") != group:
                group = base["set"]
                table.add_row(
                    Text(clip(f"— {group} —", widths["prompt"]), style="bold"), "", "", "", key=f"set-{group}"
                )
            exp = base.get("expect", base.get("expected"))
            exp_s = ", ".join(map(str, exp)) if isinstance(exp, list) else str(exp or "")
            table.add_row(
                Text(clip(probe_prompt(base).replace("\n", " "), widths["prompt"])),  # Text: "[...]" is no markup
                clip(exp_s, widths["expected"]),
                cell(b, widths["before"]),
                cell(a, widths["after"]),
                key=f"sample-{i}" if samples else str(i),
            )
        if not n:
            table.add_row("(no probes in this run)", "", "", "")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a probe row: its prompt, the expected words and both answers, whole."""
        from cockpit.ui.screens.modals import TextView

        key = str(event.row_key.value)
        if not key.isdigit():
            return
        i = int(key)
        st = self.follower.state
        sides = [(when, ((st.probes.get(when) or {}).get("results") or [])) for when in ("before", "after")]
        found = [(when, rows[i]) for when, rows in sides if i < len(rows)]
        if found:
            self.app.push_screen(TextView(f"probe {i + 1}", probe_detail(found)))

    def probe_row(self) -> dict | None:
        """The result under the probe table's cursor (after training's, else before's), or None."""
        table = self.query_one("#probes", DataTable)
        if not table.row_count:
            return None
        key = str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)
        if not key.isdigit():
            return None
        st = self.follower.state
        for when in ("after", "before"):
            rows = (st.probes.get(when) or {}).get("results") or []
            if int(key) < len(rows):
                return rows[int(key)]
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Image: only on an image probe's row."""
        if action == "image":
            return bool(self.query("#probes")) and bool((self.probe_row() or {}).get("image_path"))
        return True

    def on_data_table_row_highlighted(self) -> None:
        self.refresh_bindings()

    def action_image(self) -> None:
        """The image probe's image: opened in a new browser tab under ``cockpit web`` (Textual's
        deliver_binary, served by textual-serve); in a terminal, its path."""
        import mimetypes
        from pathlib import Path

        r = self.probe_row() or {}
        path = r.get("image_path")
        if not path:
            return
        where = self.query_one("#export-result", Static)
        if not Path(path).is_file():
            where.update(Text(f"{r.get('image')}: no longer at {path}", style=themed("$text-error")))
        elif self.app.is_web:
            mime = mimetypes.guess_type(path)[0] or "application/octet-stream"
            self.app.deliver_binary(Path(path), open_method="browser", mime_type=mime, name="probe-image")
            where.update(f"{r.get('image')}: opened in a new browser tab")
        else:
            where.update(f"{r.get('image')}: {path} (cockpit web opens it in the browser)")

    def on_resize(self) -> None:
        if self.follower.state.probes or self.follower.state.held_out:
            self.call_after_refresh(self._fill_probes)

    @on(ProbeTable.WidthChanged)
    def _probe_width_changed(self) -> None:
        table = self.query_one("#probes", DataTable)
        if table.size.width != self.probe_width and (self.follower.state.probes or self.follower.state.held_out):
            self.call_after_refresh(self._fill_probes)

    # merge / export / serve / chat: cockpit.ui.screens.run_actions.RunActionsMixin
    def action_target(self) -> RunDir:
        return self.run

    def show_action_progress(self, msg: str) -> None:
        self.query_one("#export-result", Static).update(msg)

    def show_action_result(self, title: str, msg: Text, ok: bool) -> None:
        self.query_one("#export-result", Static).update(msg)

    def action_plot(self) -> None:
        from cockpit.ui.screens.modals import PlotView

        self.app.push_screen(PlotView(self.follower.state))

    def action_logs(self) -> None:
        from cockpit.ui.logtail import LogTail
        from cockpit.ui.screens.modals import LogView

        self.app.push_screen(LogView(LogTail(self.run.logs_dir), self.run.run_id, poll=True))

    def action_live(self) -> None:
        self.app.open_live(self.run, on_top=True)  # on top of this Summary: Esc comes back here

    def action_leave(self) -> None:
        self.app.sub_title = ""
        self.dismiss()

    def after_delete(self, run: RunDir) -> None:
        self.action_leave()


def _eval_metric_line(metric: Any, label: str, scale: int | None, higher_is_better: bool) -> tuple[str, Any] | None:
    """summary.json's {count, first, last, best} of an eval metric as one line and its style: first -> last,
    best; as a percentage when ``scale`` is 100."""
    if not (isinstance(metric, dict) and metric.get("first") and metric.get("last")):
        return None
    (s0, v0), (s1, v1), (sb, vb) = metric["first"], metric["last"], metric.get("best") or metric["last"]

    def fmt(v: float) -> str:
        return f"{scale * v:.1f}%" if scale else f"{v:.4f}"

    evals = "" if scale else f", {metric.get('count')} evals"
    better = v1 > v0 if higher_is_better else v1 < v0
    text = f"\n{label} {fmt(v0)} (step {s0}) → {fmt(v1)} (step {s1}){evals}, best {fmt(vb)} at step {sb}"
    return text, themed("$text-success" if better else "$text-warning")
