"""The Live screen's devices pane for any number of nodes (pure: state -> Rich text).

:func:`devices` picks the finest form that fits the pane:

1. one node (or none): ``formatting.devices``, a line per GPU;
2. a few nodes: ``formatting.node_devices``, a line per GPU under each node, else a line per node;
3. many nodes (a 64-node x 8-GPU job): a node x GPU heatmap, VRAM beside utilisation, several
   nodes to a line: a cell per GPU, its height the level (readable without colour);
4. a small pane: a cell per node (its fullest GPU's VRAM, its least busy GPU's utilisation).

The hottest GPU and the least busy one are marked (reverse video) and named under the map. The
drill-down (``n`` / ``N`` / ``o`` on the Live screen) shows one node's GPUs in the detailed form,
power included (``only``).
"""

from __future__ import annotations

from typing import Any

from rich.style import Style as RichStyle
from rich.text import Text

from cockpit.cells import clip
from cockpit.store.node_grid import ranges
from cockpit.ui import formatting
from cockpit.ui.palette import theme_name, themed
from cockpit.ui.state import RunState, hang_alert

DRILL_HINT = "n/N: next/previous node, o: the least busy, a: all"
GRID_HINT = "n: a node"


def _devs(ev: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for d in ev.get("devices") or [] if isinstance(d, dict)]


def marks(state: RunState) -> dict[str, tuple[int, int, float]]:
    """ "hottest" (highest temperature) and "least busy" (lowest utilisation) -> (node, GPU index,
    value), over every node's latest figures."""
    out: dict[str, tuple[int, int, float]] = {}
    temps = [
        (float(d["temp_c"]), n, int(d.get("index") or 0))
        for n, ev in state.nodes.items()
        for d in _devs(ev)
        if d.get("temp_c") is not None
    ]
    utils = [
        (float(d["util_pct"]), n, int(d.get("index") or 0))
        for n, ev in state.nodes.items()
        for d in _devs(ev)
        if d.get("util_pct") is not None
    ]
    if temps:
        v, n, i = max(temps, key=lambda x: (x[0], -x[1], -x[2]))
        out["hottest"] = (n, i, v)
    if utils:
        v, n, i = min(utils, key=lambda x: (x[0], x[1], x[2]))
        out["least busy"] = (n, i, v)
    return out


def least_busy_node(state: RunState) -> int | None:
    found = marks(state).get("least busy")
    return found[0] if found else None


def _util_style(frac: float) -> Any:
    return themed("$warning" if frac < 0.3 else "$primary")


def _cell(frac: float | None, util: bool, marked: bool) -> tuple[str, Any]:
    """One GPU's (or node's) cell: a block of the value's height and its style (appended as a string:
    a Text per cell made the 1024 cells of a 64-node map several times slower)."""
    if frac is None:
        return "·", "dim"
    frac = max(0.0, min(1.0, frac))
    style = _util_style(frac) if util else formatting.fill_style(frac)
    if marked:
        style = f"{style} reverse" if isinstance(style, str) else style + RichStyle(reverse=True)
    return formatting.LEVELS[max(1, round(frac * 8))], style


class Runs:
    """Pieces of text with their styles, neighbours of one style joined: one ``Text.append`` per run
    of equal cells instead of one per cell (most of a 512-GPU map's drawing time otherwise)."""

    def __init__(self) -> None:
        self.parts: list[tuple[list[str], Any]] = []

    def add(self, text: str, style: Any = "") -> None:
        if self.parts and self.parts[-1][1] == style:
            self.parts[-1][0].append(text)
        else:
            self.parts.append(([text], style))

    def into(self, t: Text) -> None:
        for texts, style in self.parts:
            t.append("".join(texts), style=style)


_node_pieces: dict[tuple[int, bool], tuple[dict[str, Any], frozenset[int], str, list[tuple[str, Any]]]] = {}


def _node_cells(node: int, ev: dict[str, Any], util: bool, marked: frozenset[int]) -> list[tuple[str, Any]]:
    """One node's cells in the map (a block per GPU, neighbours of one style joined), VRAM or
    utilisation: made again only when the node's record is another one (records are replaced, never
    changed in place: ``node_grid.fold``, ``RunState.apply``), its marked GPUs or the theme changed.
    Between two full grids only the outliers' nodes change: most of a 512-GPU map is kept."""
    theme = theme_name()
    kept = _node_pieces.get((node, util))
    if kept is not None and kept[0] is ev and kept[1] == marked and kept[2] == theme:
        return kept[3]
    cells = Runs()
    for d in _devs(ev):
        index = int(d.get("index") or 0)
        cells.add(*_cell(_util(d) if util else _vram(d), util, index in marked))
    pieces = [("".join(texts), style) for texts, style in cells.parts]
    _node_pieces[(node, util)] = (ev, marked, theme, pieces)
    return pieces


def _vram(d: dict[str, Any]) -> float | None:
    used, total = d.get("vram_used_mb"), d.get("vram_total_mb")
    return float(used) / float(total) if used is not None and total else None


def _util(d: dict[str, Any]) -> float | None:
    return float(d["util_pct"]) / 100 if d.get("util_pct") is not None else None


def _totals(state: RunState) -> str:
    devs = [d for ev in state.nodes.values() for d in _devs(ev)]
    used = sum(float(d.get("vram_used_mb") or 0) for d in devs)
    total = sum(float(d.get("vram_total_mb") or 0) for d in devs)
    utils = [float(d["util_pct"]) for d in devs if d.get("util_pct") is not None]
    power = sum(float(d["power_w"]) for d in devs if d.get("power_w") is not None)
    out = (
        f"  VRAM {used / 2**20:.1f}/{total / 2**20:.1f} TiB"
        if total >= 2**20
        else (f"  VRAM {formatting._mb(used)}/{formatting._mb(total)}" if total else "")
    )
    if utils:
        out += f"  util {sum(utils) / len(utils):.0f}% mean"
    if power:
        out += f"  {power / 1000:.1f} kW" if power >= 1000 else f"  {power:.0f} W"
    return out


def _marks_line(found: dict[str, tuple[int, int, float]], width: int) -> Text:
    t = Text()
    words = {"hottest": lambda v: f"{v:.0f}°C", "least busy": lambda v: f"util {v:.0f}%"}
    short = width < 70
    for key, (node, index, value) in found.items():
        if t.plain:
            t.append("  " if short else "   ")
        t.append(key, style="reverse")
        t.append(
            f" n{node} g{index} {value:.0f}{'°C' if key == 'hottest' else '%'}"
            if short
            else f" node {node} GPU {index} {words[key](value)}"
        )
    if not short and t.cell_len + len(GRID_HINT) + 3 < width:
        t.append(f"   {GRID_HINT}", style="dim")
    return Text(clip(t.plain, width - 1)) if t.cell_len > width - 1 else t


def _header(state: RunState, width: int) -> Text:
    t = Text()
    t.append("Devices", style="bold underline")
    nodes = state.nodes
    t.append(f"  {len(nodes)} nodes, {sum(len(_devs(e)) for e in nodes.values())} GPUs", style="bold")
    totals = _totals(state)
    if t.cell_len + len(totals) < width:
        t.append(totals, style="dim")  # the marks line says the key
    elif t.cell_len + len(GRID_HINT) + 2 < width:
        t.append(f"  {GRID_HINT}", style="dim")
    return t


def gpu_grid(state: RunState, width: int, max_lines: int) -> Text | None:
    """Several nodes to a line, a cell per GPU: VRAM on the left, utilisation on the right; None
    when it does not fit in ``max_lines`` lines (title, column heads and the marks included)."""
    nodes = sorted(state.nodes.items())
    gpus = max((len(_devs(ev)) for _, ev in nodes), default=0)
    if not gpus:
        return None
    label = max(2, len(str(nodes[-1][0]))) + 2
    per_line = max(1, (width - 1 - label) // (2 * (gpus + 1)))
    rows = -(-len(nodes) // per_line)
    if rows + 3 > max_lines:
        return None
    found = marks(state)
    marked = {(n, i) for n, i, _ in found.values()}
    t = _header(state, width)
    span = per_line * (gpus + 1) - 1
    t.append("\n" + " " * label)
    t.append(f"{'VRAM, a cell per GPU':<{span}}"[:span] + "  ", style="dim")
    t.append(f"{'utilisation':<{span}}"[:span], style="dim")
    cells = Runs()
    for r in range(rows):
        chunk = nodes[r * per_line : (r + 1) * per_line]
        cells.add(f"\n{chunk[0][0]:>{label - 2}}  ", themed("$text-primary"))
        for util in (False, True):
            if util:
                cells.add("  " + " " * ((per_line - len(chunk)) * (gpus + 1)))
            for k, (node, ev) in enumerate(chunk):
                if k:
                    cells.add(" ")
                for text, style in _node_cells(node, ev, util, frozenset(i for n, i in marked if n == node)):
                    cells.add(text, style)
                cells.add(" " * (gpus - len(_devs(ev))))
    cells.into(t)
    t.append("\n")
    t.append_text(_marks_line(found, width))
    return t


def node_cells(state: RunState, width: int, max_lines: int) -> Text:
    """A cell per node, as many to a line as fit: its fullest GPU's VRAM, its least busy GPU's
    utilisation (the marked GPUs' nodes in reverse video)."""
    nodes = sorted(state.nodes.items())
    label = 5 + len(str(nodes[-1][0])) if nodes else 6
    per_line = max(8, width - 1 - label)
    per_line -= per_line % 8  # node numbers 0, 32, ... at the line starts
    found = marks(state)
    marked = {n for n, _, _ in found.values()}
    t = _header(state, width)
    cells = Runs()
    for util in (False, True):
        for start in range(0, len(nodes), per_line):
            head = ("util " if util else "VRAM ") if start == 0 else "     "
            cells.add(f"\n{head}{start:>{label - 5}} ", "dim" if start else "")
            for node, ev in nodes[start : start + per_line]:
                values = [v for v in ((_util(d) if util else _vram(d)) for d in _devs(ev)) if v is not None]
                value = (min(values) if util else max(values)) if values else None
                cells.add(*_cell(value, util, node in marked))
    cells.into(t)
    t.append("\n")
    t.append_text(_marks_line(found, width))
    return t


_drawn: dict[str, Any] = {"key": None, "version": None, "text": Text()}


def _map(state: RunState, width: int, max_lines: int, hold: bool) -> Text:
    """The map for the nodes' latest figures, drawn again only when they (``RunState.nodes_version``)
    or the pane's size changed: a step or a log line redraws the screen, not the 512-GPU map.
    ``hold``: keep the last map even if the figures changed (the pane's throttle)."""
    key = (id(state), width, max_lines)
    if _drawn["key"] != key or (_drawn["version"] != state.nodes_version and not hold):
        _drawn.update(
            key=key,
            version=state.nodes_version,
            text=gpu_grid(state, width, max_lines) or node_cells(state, width, max_lines),
        )
    text: Text = _drawn["text"]
    return text


def map_behind(state: RunState) -> bool:
    """The last map drawn is older than the nodes' figures."""
    return _drawn["version"] is not None and _drawn["version"] != state.nodes_version


def devices(state: RunState, width: int = 60, max_lines: int = 8, only: int | None = None, hold: bool = False) -> Text:
    """The devices pane: the finest form that fits ``width`` x ``max_lines`` (the comm line is
    added below it); ``only``: one node's GPUs in the detailed form; ``hold``: a many-node map
    already drawn stays as it is (the pane redraws it at most every few seconds)."""
    if len(state.nodes) <= 1 and not any(n > 0 for n in state.nodes):
        return formatting.devices(state, width, max_lines)
    if only is not None and only in state.nodes:
        return formatting.node_devices(
            state, width, max_lines, only=only, hint=DRILL_HINT if width >= 90 else "n/N/o/a"
        )
    per_gpu_cols = 2 if width >= 76 else 1
    detail = sum(2 + -(-len(_devs(e)) // per_gpu_cols) for e in state.nodes.values()) + 1
    if detail <= max_lines or len(state.nodes) + 1 <= max_lines:
        return formatting.node_devices(state, width, max_lines)
    silent = sorted((hang_alert(state) or {}).get("silent_nodes") or [])
    t = _map(state, width, max_lines - 1 - bool(silent), hold).copy()
    if silent:  # the hang alert's silent nodes: their cells are their last report's
        t.append(
            clip(f"\nSILENT (the map shows their last report): nodes {ranges(silent)}", width - 1),
            style=themed("bold $text-error"),
        )
    t.append_text(formatting.per_device(state, width))  # tokens/s and MFU per device, once the steps say them
    t.append("\n")
    t.append_text(formatting.comm(state))
    return t
