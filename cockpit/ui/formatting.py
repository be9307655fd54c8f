"""Rich renderables for the panes (pure functions of a RunState; no widgets here)."""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.style import Style as RichStyle
from rich.text import Text

from cockpit.cells import clip
from cockpit.run.follow import peak_short, per_device_words
from cockpit.ui.palette import themed
from cockpit.ui.state import RunState, fmt_duration, hang_alert, memory_alert

# Textual style strings (theme variables), resolved by palette.themed where drawn: by meaning, an
# active run the theme's primary, finished success, failed / lost error, on the way warning
STATE_STYLE = {
    "starting": "$text-warning",
    "running": "bold $text-primary",
    "stopping": "$text-warning",
    "finished": "bold $text-success",
    "failed": "bold $text-error",
    "stopped": "$text-accent",
    "killed": "$text-accent",
    "queued": "$text-primary",
    "cancelled": "$text-accent",
    "lost": "bold $text-error",
}
LEVEL_STYLE = {"info": "$text-primary", "warn": "bold $text-warning", "error": "bold $text-error"}
# every state also has a symbol: readable with NO_COLOR and on a 16-colour terminal
STATE_SYMBOL = {
    "starting": "…",
    "running": "▶",
    "stopping": "…",
    "finished": "✓",
    "failed": "✗",
    "stopped": "■",
    "killed": "■",
    "queued": "◷",
    "cancelled": "■",
    "lost": "✗",
}


def state_text(state: str, shown: str | None = None) -> Text:
    """A run state as symbol + word (``shown``: the words, e.g. a queued run's reason), coloured
    (the colour is never the only sign)."""
    return Text(f"{STATE_SYMBOL.get(state, '?')} {shown or state}", style=themed(STATE_STYLE.get(state, "")))


def fill_style(frac: float) -> RichStyle | str:
    """How full: the theme's success colour, warning from 80 %, error from 95 %."""
    return themed("$success" if frac < 0.8 else "$warning" if frac < 0.95 else "$error")


def bar(frac: float | None, width: int = 10) -> Text:
    if frac is None:
        return Text("?" * 0 + "·" * width, style="dim")
    frac = max(0.0, min(1.0, frac))
    done = int(round(frac * width))
    style = fill_style(frac)
    return Text("█" * done, style=style) + Text("░" * (width - done), style="dim")


def header(state: RunState, now: float, replaying: float | None = None, width: int | None = None) -> Text:
    """The Live screen's title: run, state, step, epoch, elapsed, ETA, what it is doing. In
    ``width`` cells its first line never wraps: the run's short name first, then no epoch; what it
    is doing goes to a line of its own. When the run has ended: why, and that Enter opens the Summary."""
    from cockpit.compare import short_name

    name = state.run_id or "?"
    for run_name, with_epoch in ((name, True), (short_name(name), True), (short_name(name), False)):
        first = _header_line(state, now, run_name, with_epoch)
        if width is None or first.cell_len <= width:
            break
    t = first
    doing = state.activity(now)
    notes = []
    if doing:
        notes.append((doing, themed("italic $text-primary")))
    if replaying is not None:
        notes.append((f"loading history {100 * replaying:.0f}%", themed("italic $text-warning")))
    for note, style in notes:
        fits = width is None or t.cell_len - t.plain.rfind("\n") - 1 + 2 + len(note) <= width
        t.append("  " if fits else "\n", style="")
        t.append(note, style=style)
    if state.ended:
        if state.reason:
            t.append(f"\n{state.reason}", style=themed(STATE_STYLE.get(state.state, "")))
        t.append("\nThe run has ended. Enter: its Summary (probes, loss, export)", style="dim")
    return t


def _header_line(state: RunState, now: float, name: str, with_epoch: bool) -> Text:
    t = Text()
    t.append(name, style="bold")
    t.append("  ")
    t.append(
        f" {STATE_SYMBOL.get(state.state, '?')} {state.state} ",
        style=themed(f"reverse {STATE_STYLE.get(state.state, '')}"),
    )
    t.append(f"  step {state.step}/{state.total or '?'}")
    if with_epoch and state.epoch is not None:
        t.append(f"  epoch {state.epoch:.2f}")
    t.append(f"  elapsed {fmt_duration(state.elapsed(now))}")
    t.append(f"  ETA {fmt_duration(state.eta(now))}")
    return t


def step_ticks(xs: list[float], most: int = 6) -> tuple[list[float], list[str]]:
    """Whole steps for a plot's x axis, and their labels (plotext's own ticks fall between steps:
    1.0 9.8 18.5)."""
    ticks = whole_ticks(xs, most)
    return [float(t) for t in ticks], [str(t) for t in ticks]


def whole_ticks(xs: list[float], most: int) -> list[int]:
    if not xs:
        return []
    lo, hi = int(min(xs)), int(round(max(xs)))
    if hi - lo < most:
        return list(range(lo, hi + 1))
    raw = (hi - lo) / (most - 1)
    step = next(m * 10**e for e in range(len(str(hi)) + 1) for m in (1, 2, 5) if m * 10**e >= raw)
    first = -(-lo // step) * step
    return sorted({lo, *range(first, hi + 1, step)} - {t for t in range(first, hi + 1, step) if 0 < t - lo < step / 2})


def _mb(v: Any) -> str:
    if v is None:
        return "?"
    v = float(v)
    return f"{v / 1024:.1f} GiB" if v >= 1024 else f"{v:.0f} MiB"


LEVELS = " ▁▂▃▄▅▆▇█"


def level(frac: float | None) -> Text:
    """One cell for a fraction: a block of that height, coloured like :func:`bar`."""
    if frac is None:
        return Text("·", style="dim")
    frac = max(0.0, min(1.0, frac))
    style = fill_style(frac)
    return Text(LEVELS[max(1, round(frac * 8))], style=style)


def _vram_frac(d: dict[str, Any]) -> float | None:
    used, total = d.get("vram_used_mb"), d.get("vram_total_mb")
    return float(used) / float(total) if used is not None and total else None


def _node_summary(devs: list[dict[str, Any]]) -> str:
    used = sum(float(d.get("vram_used_mb") or 0) for d in devs)
    total = sum(float(d.get("vram_total_mb") or 0) for d in devs)
    temps = [float(d["temp_c"]) for d in devs if d.get("temp_c") is not None]
    power = [float(d["power_w"]) for d in devs if d.get("power_w") is not None]
    out = f" {_mb(used)}/{_mb(total)}" if total else ""
    if temps:
        out += f" max {max(temps):.0f}°C"
    if power:
        out += f" {sum(power) / 1000:.1f} kW" if sum(power) >= 1000 else f" {sum(power):.0f} W"
    return out


def _gpu_cell(d: dict[str, Any], bar_width: int) -> Text:
    t = Text(f"{d.get('index', '?'):>2} ")
    t.append_text(bar(_vram_frac(d), bar_width))
    t.append(f" {100 * (_vram_frac(d) or 0):3.0f}%" if _vram_frac(d) is not None else "    ?")
    t.append(f" u{float(d['util_pct']):3.0f}%" if d.get("util_pct") is not None else "      ")
    t.append(f" {float(d['temp_c']):3.0f}°" if d.get("temp_c") is not None else "     ")
    t.append(f" {float(d['power_w']):4.0f}W" if d.get("power_w") is not None else "      ")
    return t


def _gpu_cell_short(d: dict[str, Any]) -> Text:
    """A GPU without its bar (two to a line in a narrow pane): index, VRAM %, util, temperature, power."""
    frac = _vram_frac(d)
    t = Text(f"{d.get('index', '?'):>1}")
    t.append(
        f" {100 * frac:3.0f}%" if frac is not None else "    ?", style=fill_style(frac) if frac is not None else ""
    )
    t.append(f" u{float(d['util_pct']):3.0f}" if d.get("util_pct") is not None else "     ")
    t.append(f" {float(d['temp_c']):2.0f}°" if d.get("temp_c") is not None else "    ")
    t.append(f" {float(d['power_w']):3.0f}W" if d.get("power_w") is not None else "     ")
    return t


def _node_mem(state: RunState, node: int) -> str:
    """The node's ranks' allocator figures (the step event's mem): the highest peak, by rank."""
    rows = [(int(r), m) for r, m in state.mem.items() if isinstance(m, dict) and int(m.get("node_rank") or 0) == node]
    peaks = [(float(m["peak_mb"]), r, m) for r, m in rows if m.get("peak_mb") is not None]
    if not peaks:
        rss = [float(m["rss_mb"]) for _, m in rows if m.get("rss_mb") is not None]
        return f"ranks {len(rows)}: RSS max {_mb(max(rss))}" if rss else ""
    peak, rank, m = max(peaks)
    cap = f" of {_mb(m.get('capacity_mb'))}" if m.get("capacity_mb") else ""
    return f"ranks {len(rows)}: peak max {_mb(peak)}{cap} (r{rank}, {m.get('source') or '?'})"


def node_devices(state: RunState, width: int = 60, max_lines: int = 8, only: int | None = None, hint: str = "") -> Text:
    """Several nodes: each node's GPUs under its name. As many lines as fit in ``max_lines``:
    one per GPU (two columns when wide), else one line per node with a cell per GPU. ``only``: that
    node alone, in the detailed form (the drill-down of ``ui/device_grid.py``); ``hint``: its keys."""
    t = Text()
    t.append("Devices", style="bold underline")
    every = sorted(state.nodes.items())
    nodes = [(n, e) for n, e in every if n == only] if only is not None else every
    if only is not None:
        t.append(f"  node {only} of {len(every)}", style="bold")
    else:
        t.append(f"  {len(nodes)} nodes, {sum(len(e.get('devices') or []) for _, e in nodes)} GPUs", style="bold")
    if hint:
        t.append(f"  {hint}", style="dim")
    per_gpu_cols = 2 if width >= 76 else 1
    detail = sum(1 + -(-len(e.get("devices") or []) // per_gpu_cols) for _, e in nodes) + len(nodes) + 1
    detailed = detail <= max_lines or only is not None
    hang = hang_alert(state)
    silent = set((hang or {}).get("silent_nodes") or [])
    for node, ev in nodes:
        devs = ev.get("devices") or []
        host = str(ev.get("host") or "?")
        t.append(f"\n{'node ' if width >= 50 else 'n'}{node} ", style=themed("bold $text-primary"))
        t.append(host[: max(6, width // 5)], style=themed("$text-primary"))
        t.append(f" {ev.get('backend') or '?'}", style="dim")
        if node in silent:
            t.append(" SILENT", style=themed("bold $text-error"))
        if not devs:
            why = "; ".join(
                f"{k}: {v}" for k, v in (ev.get("unavailable") or {}).items() if not str(v).startswith("not tried")
            )
            t.append(f"  no GPUs{': ' + why if why else ''}"[: max(10, width - len(host) - 16)], style="dim")
        elif detailed:
            t.append(clip(_node_summary(devs), width - 1 - cell_len(t.plain.rsplit("\n", 1)[-1])), style="dim")
            cols, bw = per_gpu_cols, 8 if per_gpu_cols == 2 else min(20, max(6, width - 30))
            if only is not None and cols == 1 and 2 + len(devs) > max_lines:  # one node, a small pane
                cols, bw = 2, 0
            for i in range(0, len(devs), cols):
                t.append("\n")
                for j, d in enumerate(devs[i : i + cols]):
                    t.append(("  " if bw else "") if j == 0 else "   ")
                    t.append_text(_gpu_cell(d, bw) if bw else _gpu_cell_short(d))
        else:
            t.append(" VRAM ")
            for d in devs:
                t.append_text(level(_vram_frac(d)))
            utils = [d.get("util_pct") for d in devs]
            if width >= 44 and any(u is not None for u in utils):
                t.append(" util ")
                for u in utils:
                    t.append_text(level(float(u) / 100 if u is not None else None))
            if width >= 70:
                t.append(_node_summary(devs), style="dim")
        mem = _node_mem(state, node)
        if mem and (detailed or width >= 90):
            t.append(f"\n  {mem}"[: width - 1], style="dim")
    t.append("\n")
    t.append_text(comm(state))
    return t


def unavailable_lines(tel: dict[str, Any], width: int) -> Text:
    """Why a telemetry source gives nothing. On a machine without a GPU that is expected: one dim
    ``skip`` line, as the doctor says it; a GPU source that fails while sampling is a ``✗`` line."""
    t = Text()
    unavailable = tel.get("unavailable") or {}
    failing = {k: v for k, v in unavailable.items() if str(v).startswith("sampling failed")}
    if tel.get("backend") == "cpu" and not failing:
        if unavailable:
            line = f" skip  GPU telemetry ({', '.join(unavailable)}): no GPU on this machine, a CPU run"
            t.append("\n" + clip(line, width - 2), style="dim")
        return t
    for name, why in unavailable.items():
        line = clip(f" {'✗' if name in failing else '-'} {name}: {why}", max(10, width - 2))
        t.append("\n" + line, style=themed("$text-warning") if name in failing else "dim")
    return t


def devices(state: RunState, width: int = 60, max_lines: int = 8) -> Text:
    if len(state.nodes) > 1 or any(n > 0 for n in state.nodes):
        return node_devices(state, width, max_lines)
    t = Text()
    tel = state.telemetry or {}
    backend = tel.get("backend")
    t.append("Devices", style="bold underline")
    t.append(f"  telemetry: {backend or 'none yet'}", style="bold" if backend else "dim")
    if state.ended:  # nothing samples an ended run: no stale RSS, CPU or "not reported yet" lines
        t.append("\n (the run has ended: no live samples)", style="dim")
        t.append_text(per_device(state, width))
        t.append("\n")
        t.append_text(comm(state))
        return t
    t.append_text(unavailable_lines(tel, width))
    devs = tel.get("devices") or []
    for d in devs:
        used, total = d.get("vram_used_mb"), d.get("vram_total_mb")
        frac = (float(used) / float(total)) if used is not None and total else None
        t.append(f"\n GPU{d.get('index', '?')} ")
        name = str(d.get("name") or "")[:16]
        if name and width >= 70:
            t.append(f"{name:<16} ", style="dim")
        t.append("VRAM ")
        t.append_text(bar(frac, 10 if width < 100 else 20))
        t.append(f" {_mb(used)}/{_mb(total)}")
        if d.get("util_pct") is not None:
            t.append(f"  util {float(d['util_pct']):.0f}%")
        if d.get("temp_c") is not None:
            t.append(f"  {float(d['temp_c']):.0f}°C")
        if d.get("power_w") is not None:
            t.append(f"  {float(d['power_w']):.0f} W")
    ranks = tel.get("ranks") or []
    if ranks and not devs:
        for r in ranks:
            t.append(f"\n rank{r.get('rank')} pid {r.get('pid')}  RSS {_mb(r.get('rss_mb'))}")
            if r.get("cpu_pct") is not None:
                t.append(f"  CPU {float(r['cpu_pct']):.0f}%")
            if r.get("alive") is False:
                t.append("  exited", style=themed("$text-error"))
    elif not devs and state.mem:
        for rank, m in sorted(state.mem.items()):
            t.append(f"\n rank{rank} RSS {_mb((m or {}).get('rss_mb'))} (from the last step)")
    elif not devs and not ranks:
        t.append("\n (no device samples yet)", style="dim")
    if devs and state.mem:
        alloc = [
            f"r{k} {_mb((m or {}).get('allocated_mb'))}"
            for k, m in sorted(state.mem.items())
            if (m or {}).get("allocated_mb") is not None
        ]
        if alloc:
            t.append("\n torch allocated: " + "  ".join(alloc), style="dim")
    t.append_text(per_device(state, width))
    t.append("\n")
    t.append_text(comm(state))
    return t


def per_device(state: RunState, width: int) -> Text:
    """The latest step's tokens/s, samples/s and MFU per device (``follow.per_device_words``) on one line
    of ``width`` (tighter, then without samples/s, when narrow), and the peak MFU is a share of when it
    fits; before the first step only "peak unknown" (or nothing)."""
    label = "Per device "
    for fields, sep in ((state.per_device, "  "), (state.per_device, " "), (_without_samples(state.per_device), " ")):
        words = per_device_words(fields, state.flops, sep)
        if len(label) + len(words) <= width - 2:
            break
    if not words:
        return Text()
    t = Text("\n")
    t.append(label, style="bold")
    t.append(words)
    peak = peak_short(state.flops or {})
    if peak and state.per_device.get("mfu") is not None and t.cell_len + len(peak) <= width - 2:
        t.append(f" {peak}", style="dim")
    return t


def _without_samples(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k != "samples_per_s_per_device"}


def comm(state: RunState) -> Text:
    c = state.comm
    t = Text("Comm ", style="bold")
    if not c:
        ws = state.world_size or 1
        t.append("gloo / single process" if ws <= 1 else f"world size {ws} (no comm report yet)", style="dim")
        return t
    status = str(c.get("status") or "?")
    t.append(f"{c.get('backend') or '?'} {c.get('version') or ''}".strip())
    t.append(f"  world {c.get('world_size') or '?'}  ")
    t.append(status, style=themed("$text-success" if status in ("ok", "healthy") else "$text-warning"))
    details = c.get("details")
    flight = dict(details).get("flight") if isinstance(details, dict) else None
    if details:
        shown = {k: v for k, v in dict(details).items() if k != "flight"} if flight else details
        t.append(
            f"  {shown if isinstance(shown, str) else ', '.join(f'{k}={v}' for k, v in dict(shown).items())}"[:200],
            style="dim",
        )
    if flight:  # the flight recorder's dumps: the collective each rank was in (docs/rocm.md item 10)
        from cockpit.comm.flight import words

        t.append("\n  in flight at the timeout: ", style=themed("bold $text-warning"))
        t.append(words(flight)[:300])
    return t


def alerts(state: RunState, limit: int = 3) -> Text:
    t = Text()
    n = len(state.alerts)
    t.append(f"Alerts ({n})" if n else "Alerts", style="bold underline")
    if not n:
        t.append("  none", style="dim")
    for a in list(state.alerts)[-limit:]:
        lvl = str(a.get("level") or "info")
        t.append(f"\n[{lvl}] ", style=themed(LEVEL_STYLE.get(lvl, "")))
        t.append(f"{a.get('code')}: {a.get('message')}")
        if a.get("rank") is not None:
            t.append(f" (rank {a['rank']})", style="dim")
        for r in (a.get("remedies") or [])[:2]:
            t.append(f"\n  → {r}", style="dim")
    if hang_alert(state) is not None:
        t.append("\n  r: stop and relaunch with these settings", style=themed("bold $text-warning"))
    mem_alert = memory_alert(state)
    if mem_alert is not None:
        change = mem_alert.get("remedy_set") or mem_alert.get("remedy_env") or {}
        what = ", ".join(
            f"{k.replace('per_device_train_batch_size', 'micro-batch').replace('gradient_accumulation_steps', 'accum')} {v}"
            for k, v in change.items()
        )
        t.append(f"\n  m: stop at a checkpoint, resume with {what}", style=themed("bold $text-warning"))
    if state.checkpoints:
        ck = state.checkpoints[-1]
        t.append(f"\ncheckpoint: step {ck.get('step')}", style=themed("$text-primary"))
    for phase in ("before", "after"):
        p = state.probes.get(phase)
        if p:
            sets = p.get("sets") or {}
            counts = (
                " · ".join(f"{n} {c.get('passed')}/{c.get('total')}" for n, c in sets.items())
                if sets
                else f"{p.get('passed')}/{p.get('total')}"
            )
            t.append(f"\nprobes {phase}: {counts} pass")
    if state.failed:
        t.append(f"\nFAILED: {state.failed.get('reason')}", style=themed("bold $text-error"))
        for line in (state.failed.get("log_tail") or [])[-3:]:
            t.append(f"\n | {line}", style=themed("$text-error"))
    return t


# -- grpo's sampled completions (the Live screen's completions pane) ------------------------------
_CONTROL = str.maketrans({chr(c): " " for c in (*range(32), 127) if c != 10})
COMPLETION_LINES = 3  # lines of a completion's text at most (the pane scrolls; the event holds 600 characters)


def _one_line(text: Any) -> str:
    return " ⏎ ".join(line.strip() for line in str(text or "").translate(_CONTROL).strip().split("\n"))


def _wrapped(text: str, width: int, most: int) -> list[str]:
    """``text`` wrapped to ``width`` cells, ``most`` lines at most (the last ends in an ellipsis when cut)."""
    import textwrap

    lines = textwrap.wrap(text, max(8, width), break_long_words=True, break_on_hyphens=False) or [""]
    if len(lines) > most:
        lines = lines[:most]
        lines[-1] = clip(lines[-1] + " …", width) if len(lines[-1]) + 2 <= width else clip(lines[-1], width - 1) + "…"
    return [clip(line, width) for line in lines]


def _reward_num(value: Any) -> str:
    try:
        return f"{float(value):.2f}"
    except (TypeError, ValueError):
        return "-"


def completions_title(state: RunState, hint: str = "") -> str:
    """The completions pane's title: the newest step and how many samples it holds, then ``hint``."""
    steps = [s.get("step") for s in state.completions if isinstance(s.get("step"), int)]
    parts = ["Completions"] + ([f"step {max(steps)}"] if steps else []) + [f"{len(state.completions)} newest first"]
    return " · ".join(parts) + (f"  ({hint})" if hint else "")


def completions(state: RunState, width: int = 80) -> Text:
    """The latest sampled completions (grpo), newest first, grouped by step and prompt: the prompt, then
    each completion with its total reward, whether it beat its group (the advantage's sign: ▲ / ▼) and each
    reward function's value. Wrapped to ``width`` cells (no line longer), a completion to a few lines."""
    t = Text(no_wrap=True, overflow="ellipsis")
    samples = list(state.completions)[::-1]
    if not samples:
        t.append("no completions yet: one set per logging step", style="dim")
        return t
    pad = 9  # "  0.85 ▲ ": the reward column, then the completion
    group: tuple[Any, str] | None = None
    for s in samples:
        prompt = _one_line(s.get("prompt"))
        if (s.get("step"), prompt) != group:
            group = (s.get("step"), prompt)
            head = f"step {s.get('step')} " if s.get("step") is not None else ""
            lines = _wrapped(prompt, width - len(head), 2)
            t.append(("\n" if t.plain else "") + head, style=themed("$text-primary"))
            t.append(lines[0], style="bold")
            for line in lines[1:]:
                t.append("\n" + " " * len(head) + line, style="bold")
        advantage = s.get("advantage")
        sign, style = "·", "dim"
        if isinstance(advantage, (int, float)) and advantage:
            sign, style = ("▲", "$text-success") if advantage > 0 else ("▼", "$text-error")
        t.append(f"\n{_reward_num(s.get('reward')):>6} ", style="bold")
        t.append(sign + " ", style=themed(style) if style.startswith("$") else style)
        for i, line in enumerate(_wrapped(_one_line(s.get("completion")) or "(empty)", width - pad, COMPLETION_LINES)):
            t.append(("\n" + " " * pad if i else "") + line)
        parts = [f"{k} {_reward_num(v)}" for k, v in (s.get("rewards") or {}).items()]
        if isinstance(advantage, (int, float)):
            parts.append(f"adv {advantage:+.2f}")
        if parts:
            t.append("\n" + " " * pad + clip(" · ".join(parts), width - pad), style="dim")
    return t


# -- Setup: texts for the modals (pure functions of CLI JSON) ------------------------------------
def launch_ranks(data: Any) -> Text:
    """``cockpit preview CONFIG --json`` -> every rank's exact command and environment."""
    import shlex

    t = Text()
    if not isinstance(data, dict) or not data.get("ranks"):
        problems = data.get("problems") if isinstance(data, dict) else None
        t.append("per-rank launch: no preview\n", style=themed("$text-error"))
        for p in problems or []:
            t.append(f"  {p}\n", style=themed("$text-error"))
        return t
    t.append(
        f"# strategy {data.get('strategy')}, world size {data.get('world_size')} "
        f"(RUN_DIR/RUN_ID are filled at launch); this node:\n",
        style="dim",
    )
    t.append((data.get("command_shell") or "") + "\n", style="bold")
    for r in data["ranks"]:
        numa = f", NUMA node {r['numa_node']}" if r.get("numa_node") is not None else ""
        t.append(
            f"\n# rank {r.get('rank')} (local {r.get('local_rank')}, node {r.get('node_rank')}{numa}):\n", style="dim"
        )
        t.append(shlex.join(str(a) for a in r.get("command") or []) + "\n")
        for k, v in (r.get("env") or {}).items():
            t.append(f"  {k}={v}\n", style=themed("$text-primary"))
    for node in data.get("nodes") or []:
        if node.get("node_rank") != data.get("node_rank"):
            t.append(f"\n# on node {node.get('node_rank')}: {node.get('shell')}\n", style="dim")
    for note in data.get("notes") or []:
        t.append(f"# note: {note}\n", style=themed("$text-warning"))
    return t


def blocking_checks(checks: list[Any]) -> Text:
    """Doctor checks that stop a launch (``cockpit.doctor.Check``), each with its fix."""
    t = Text()
    t.append("cockpit doctor found problems that matter for this config:\n", style="bold")
    for c in checks:
        t.append(f"\n✗ {c.title} ", style=themed("bold $text-error"))
        t.append(f"({c.status})\n", style=themed("$text-error"))
        t.append(f"  {c.seen}\n")
        for i, line in enumerate((c.fix or "").splitlines()):
            t.append(("  fix: " if i == 0 else "       ") + line + "\n", style=themed("$text-warning"))
    return t


def tune_table(data: dict[str, Any]) -> Text:
    """``cockpit tune --json``: the trials, the chosen micro-batch / accumulation marked."""
    t = Text()
    chosen = data.get("chosen") or {}
    if data.get("message"):
        t.append(str(data["message"]) + "\n", style="bold" if data.get("ok") else themed("bold $text-error"))
    for p in data.get("problems") or []:
        t.append(f"  {p}\n", style=themed("$text-error"))
    if data.get("cap_gb") is not None:
        t.append(f"memory cap {float(data['cap_gb']):g} GB per device\n", style="dim")
    t.append(f"\n  {'micro-batch':>11} {'accum':>6} {'tokens/s':>10} {'peak GB':>8}  result\n", style="bold")
    key = (chosen.get("per_device_train_batch_size"), chosen.get("gradient_accumulation_steps"))
    for tr in data.get("trials") or []:
        mb = tr.get("per_device_train_batch_size", tr.get("micro_batch"))
        acc = tr.get("gradient_accumulation_steps", tr.get("accumulation"))
        tps, peak = tr.get("tokens_per_s"), tr.get("peak_gb")
        result = tr.get("status") or tr.get("result") or ("ok" if tr.get("ok", True) else "failed")
        mark = "→ " if (mb, acc) == key else "  "
        line = (
            f"{mark}{mb if mb is not None else '-':>11} {acc if acc is not None else '-':>6} "
            f"{f'{tps:,.0f}' if isinstance(tps, (int, float)) else '-':>10} "
            f"{f'{peak:.1f}' if isinstance(peak, (int, float)) else '-':>8}  {result}\n"
        )
        t.append(
            line,
            style=themed("bold $text-success")
            if mark.strip()
            else (themed("$text-error") if "fail" in str(result) or "oom" in str(result).lower() else ""),
        )
    if chosen:
        t.append(f"\nchosen: micro-batch {key[0]}, accumulation {key[1]}", style=themed("bold $text-success"))
    return t


# an expert's load level (cockpit/store/expert_load.py LEVELS, 0 nearly unused .. 4 fair .. 9 six times fair) as a bar
LOAD_BARS = dict(zip("0123456789", "·▁▂▃▄▅▆▇██", strict=True))


def _uneven(load: dict[str, Any], i: int) -> float:
    hot, cold = (load.get("hot") or [])[i], (load.get("cold") or [])[i]
    return float(hot[1]) / max(float(cold[1]), 0.01)


def expert_load(state: RunState, width: int, max_lines: int) -> Text:
    """The expert-load pane: a title, then a line per MoE layer (the most uneven first kept, shown in
    layer order): each expert's load as a bar (· nearly unused, ▄ its fair share, █ six times it) when
    the row fits, and the hottest / coldest expert as a multiple of the fair share."""
    load = state.expert_load or {}
    layers = list(load.get("layers") or [])
    rows = load.get("rows") or []
    hot, cold = load.get("hot") or [], load.get("cold") or []
    if not layers or len(hot) != len(layers) or len(cold) != len(layers):
        return Text("")
    keep = sorted(range(len(layers)), key=lambda i: -_uneven(load, i))[: max(1, max_lines - 1)]
    t = Text()
    shown = "" if len(keep) == len(layers) else f"; the {len(keep)} most uneven of {len(layers)} layers"
    t.append(
        clip(
            f"expert load at step {state.expert_load_step} (top-{load.get('top_k')} of {load.get('experts')})"
            f"{shown}: · unused ▄ fair █ 6x",
            width,
        ),
        style="bold",
    )
    label = max(len(str(x)) for x in layers) + 1
    for i in sorted(keep):
        figures = f"  hot {hot[i][0]} {float(hot[i][1]):.1f}x  cold {cold[i][0]} {float(cold[i][1]):.2f}x"
        row = rows[i] if i < len(rows) else ""
        bar = (
            "".join(LOAD_BARS.get(c, "?") for c in row) if row and label + 2 + len(row) + len(figures) <= width else ""
        )
        line = Text(f"\nL{layers[i]:<{label}}")
        line.append(bar + (" " if bar else ""))
        warn = (
            float(hot[i][1]) > 4.0 or float(cold[i][1]) < 0.1
        )  # what the expert_idle / expert_overloaded alert watches
        line.append(figures.lstrip() if not bar else figures.strip(), style=themed("$text-warning") if warn else "")
        line.truncate(width)
        t.append_text(line)
    return t
