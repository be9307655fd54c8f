"""Compare runs: their curves, the config keys that differ, their summaries side by side.

Pure (no torch, no textual): ``cockpit compare`` prints it, the TUI's compare screen draws it.
Everything comes from the run dirs (``events.jsonl``, ``config.yaml``, ``summary.json``,
``status.json``); a resumed run keeps the latest value per step, as every reader does.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from cockpit.cells import fit
from cockpit.store.events import EventReader
from cockpit.store.rundir import RunDir

# step-event fields that are bookkeeping, not a curve worth overlaying
_NOT_CURVES = frozenset(
    {
        "v",
        "t",
        "kind",
        "step",
        "total_steps",
        "epoch",
        "tokens_seen",
        "mem",
        "samples_per_s",
        "lr",
        "samples_per_s_per_device",
        "tokens_per_s_per_device",
        "model_tflops_per_device",
    }
)
# config keys that differ between any two runs without saying anything about the training
_NOISE_KEYS = frozenset({"master_port", "run_name", "output_dir"})

SUMMARY_ROWS = (  # (key, label); what decides between runs first (80x24 shows the first rows)
    ("state", "state"),
    ("last_loss", "final loss"),
    ("eval_loss", "final eval loss"),
    ("probes", "probes"),
    ("held_out_reward", "held-out reward"),
    ("reward", "final reward"),
    ("tokens_per_s", "tokens/s"),
    ("mfu", "MFU"),
    ("peak_mem_mb", "peak memory"),
    ("runtime_s", "runtime"),
    ("steps", "steps"),
    ("first_loss", "first loss"),
    ("tokens_per_s_per_device", "tokens/s/device"),
    ("samples_per_s_per_device", "samples/s/device"),
)

STAGE_ROWS = frozenset({"held_out_reward", "reward"})  # grpo's: left out when no run has them
# MFU and per-device throughput: left out when no run has them (runs from before they existed)
THROUGHPUT_ROWS = frozenset({"mfu", "tokens_per_s_per_device", "samples_per_s_per_device"})


def summary_rows(summaries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """:data:`SUMMARY_ROWS` the runs fill: a stage's own rows and the throughput ones only when a run has them;
    grpo's held-out reward followed by a row per reward function (``held_out_reward:<name>``)."""
    rows = []
    for key, label in SUMMARY_ROWS:
        if key in STAGE_ROWS | THROUGHPUT_ROWS and all(fmt_cell(key, s) == "-" for s in summaries):
            continue
        rows.append((key, label))
        if key == "held_out_reward":
            names = dict.fromkeys(n for s in summaries for n in ((s.get(key) or {}).get("by_function") or {}))
            rows += [(f"{key}:{n}", f"  {n}") for n in names]
    return rows


_STAMP = re.compile(r"^\d{8}-\d{6}-")


def short_name(run_id: str) -> str:
    """The run id without its timestamp: ``cpu-demo-0c80`` (``cockpit attach`` takes it too)."""
    return _STAMP.sub("", run_id) or run_id


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def read_curves(run: RunDir) -> dict[str, Any]:
    """Per step: tokens seen, and every numeric metric of the step and eval events.
    Returns {"steps": [...], "tokens": [...], "curves": {name: [value | None per step]},
    "peak_mem_mb": max over ranks and steps or None}."""
    by_step: dict[int, dict[str, float]] = {}
    tokens: dict[int, float] = {}
    peak: float | None = None
    reader = EventReader(run.events_path)
    while True:
        offset = reader.offset
        events = reader.read_new(4 << 20)
        if reader.offset == offset:
            break
        for ev in events:
            kind, step = ev.get("kind"), ev.get("step")
            if kind not in ("step", "eval") or not isinstance(step, int):
                continue
            row = by_step.setdefault(step, {})
            for name, figures in (ev.get("rewards") or {}).items() if kind == "step" else ():  # grpo
                f = _finite((figures or {}).get("mean")) if isinstance(figures, dict) else None
                if f is not None:
                    row[f"reward/{name}"] = f
            for key, value in ev.items():
                f = _finite(value)
                if f is None or key in _NOT_CURVES:
                    continue
                row[key if kind == "step" or key.startswith("eval_") else f"eval_{key}"] = f
            if kind == "step":
                if _finite(ev.get("tokens_seen")) is not None:
                    tokens[step] = float(ev["tokens_seen"])
                for m in (ev.get("mem") or {}).values():
                    for k in ("peak_mb", "rss_mb"):
                        f = _finite((m or {}).get(k))
                        if f is not None:
                            peak = f if peak is None else max(peak, f)
    steps = sorted(by_step)
    names = sorted({k for row in by_step.values() for k in row}, key=lambda k: (k != "loss", k != "eval_loss", k))
    return {
        "steps": steps,
        "tokens": [tokens.get(s) for s in steps],
        "curves": {n: [by_step[s].get(n) for s in steps] for n in names},
        "peak_mem_mb": peak,
    }


def read_config(run: RunDir) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(run.config_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def config_diff(configs: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Only the keys whose values differ between the runs. A key a run's config.yaml lacks (a
    run from before the key existed) has the schema's default, as it had then."""
    from cockpit.config.schema import SCHEMA

    def value(c: dict[str, Any], k: str) -> Any:
        return c[k] if k in c else (SCHEMA[k].default if k in SCHEMA else None)

    keys = sorted({k for c in configs for k in c} - _NOISE_KEYS)
    table = {k: [value(c, k) for c in configs] for k in keys}
    return {k: vs for k, vs in table.items() if len({json.dumps(v, sort_keys=True, default=str) for v in vs}) > 1}


def _last(values: list[float | None]) -> float | None:
    return next((v for v in reversed(values) if v is not None), None)


def run_summary(run: RunDir, curves: dict[str, Any]) -> dict[str, Any]:
    summary, status = run.read_summary(), run.read_status()
    loss = curves["curves"].get("loss", [])
    pb, pa = summary.get("probes_before") or {}, summary.get("probes_after") or {}
    return {
        "state": summary.get("state") or status.get("state"),
        "steps": summary.get("steps", status.get("step")),
        "total_steps": summary.get("total_steps") or status.get("total_steps"),
        "runtime_s": summary.get("runtime_s"),
        "tokens_per_s": summary.get("tokens_per_s"),
        "tokens_per_s_per_device": summary.get("tokens_per_s_per_device"),
        "samples_per_s_per_device": summary.get("samples_per_s_per_device"),
        "mfu": summary.get("mfu"),
        "peak_tflops": summary.get("peak_tflops"),
        "tokens_seen": summary.get("tokens_seen") or _last(curves["tokens"]),
        "peak_mem_mb": curves["peak_mem_mb"],
        "first_loss": summary.get("first_loss", next((v for v in loss if v is not None), None)),
        "last_loss": summary.get("last_loss", _last(loss)),
        "eval_loss": _last(curves["curves"].get("eval_loss", [])),
        "probes_before": pb or None,
        "probes_after": pa or None,
        "reward": _last(curves["curves"].get("reward", [])),  # grpo: the last step's mean total reward
        "held_out_reward": held_out_rewards(summary),
    }


def held_out_rewards(summary: dict[str, Any]) -> dict[str, Any] | None:
    """grpo's held-out mean reward before and after training (summary.json), each function's (``by_function``:
    name -> before, after, fell: summary.json ``held_out_fell`` names it), or None."""
    before, after = summary.get("held_out_before") or {}, summary.get("held_out_after") or {}
    if "mean_reward" not in before and "mean_reward" not in after:
        return None
    fell = {f.get("reward") for f in summary.get("held_out_fell") or [] if isinstance(f, dict)}
    names = dict.fromkeys([*(before.get("rewards") or {}), *(after.get("rewards") or {})])
    by_function = {
        n: {
            "before": _finite((before.get("rewards") or {}).get(n)),
            "after": _finite((after.get("rewards") or {}).get(n)),
            "fell": n in fell,
        }
        for n in names
    }
    return {
        "before": _finite(before.get("mean_reward")),
        "after": _finite(after.get("mean_reward")),
        "by_function": by_function,
    }


def compare(runs: list[RunDir]) -> dict[str, Any]:
    """Everything ``cockpit compare --json`` prints."""
    curves = [read_curves(r) for r in runs]
    configs = [read_config(r) for r in runs]
    return {
        "runs": [
            {
                "run_id": r.run_id,
                "name": short_name(r.run_id),
                "run_dir": str(r.path),
                "summary": run_summary(r, c),
                **c,
            }
            for r, c in zip(runs, curves)
        ],
        "config_diff": config_diff(configs),
    }


# -- text for the terminal (the CLI and the TUI's tables share these cells) -----------------------
def fmt_cell(key: str, summary: dict[str, Any]) -> str:
    from cockpit.run.follow import fmt_duration

    v = summary.get(key)
    if key.startswith("held_out_reward:"):  # one reward function's held-out mean, a fall marked
        each = ((summary.get("held_out_reward") or {}).get("by_function") or {}).get(key.partition(":")[2])
        if not each:
            return "-"
        cell = " → ".join("-" if each[k] is None else f"{each[k]:.3f}" for k in ("before", "after"))
        return cell + (" ▼ fell" if each.get("fell") else "")
    if key == "probes":
        b, a = summary.get("probes_before"), summary.get("probes_after")
        if not (a or b):
            return "-"

        def side(p: dict[str, Any] | None) -> str:
            return f"{p.get('passed')}/{p.get('total')}" if p else "-"

        sets = (a or {}).get("sets") or {}
        extra = "".join(f" ({n} {s.get('passed')}/{s.get('total')})" for n, s in sets.items())
        return f"{side(b)} → {side(a)}{extra}"
    if v is None:
        return "-"
    if key == "held_out_reward":
        return " → ".join("-" if v[k] is None else f"{v[k]:.3f}" for k in ("before", "after"))
    if key == "steps":
        return f"{v}/{summary.get('total_steps') or '?'}"
    if key == "runtime_s":
        return fmt_duration(v)
    if key in ("tokens_per_s", "tokens_per_s_per_device"):
        return f"{v:,.0f}"
    if key == "samples_per_s_per_device":
        return f"{v:.2f}"
    if key == "mfu":
        from cockpit.run.follow import percent

        return percent(v)
    if key == "peak_mem_mb":
        return f"{v / 1024:.2f} GiB" if v >= 1024 else f"{v:.0f} MiB"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def fmt_value(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)


def text_report(data: dict[str, Any], width: int = 100) -> str:
    """Summaries side by side, the differing config keys, loss at a few steps."""
    runs = data["runs"]
    names = [r["name"] for r in runs]
    col = max(12, min(28, (width - 18) // max(1, len(runs))))

    def row(label: str, cells: list[str]) -> str:
        return f"{label:<17}" + "".join(f" {fit(c, col)}" for c in cells).rstrip()

    out = [row("", names), row("", ["─" * min(col, len(n)) for n in names])]
    for key, label in summary_rows([r["summary"] for r in runs]):
        out.append(row(label, [fmt_cell(key, r["summary"]) for r in runs]))
    diff = data["config_diff"]
    out.append("")
    out.append(f"config: {len(diff)} key(s) differ" + ("" if diff else " (the same config)"))
    for key, values in diff.items():
        out.append(row(f"  {key}", [fmt_value(v) for v in values]))
    per_reward = sorted({n for r in runs for n in r["curves"] if n.startswith("reward/")})
    for name in ("loss", "reward", *per_reward):  # reward, reward/<function>: grpo's
        out.extend(by_step_rows(name, [dict(zip(r["steps"], r["curves"].get(name, []))) for r in runs], row))
    return "\n".join(out)


def by_step_rows(name: str, series: list[dict[int, float | None]], row: Any) -> list[str]:
    """A metric's value at 6 steps spread over the runs' steps, one column per run (none without it)."""
    steps = sorted({s for d in series for s, v in d.items() if v is not None})
    if not steps:
        return []
    picks = sorted({steps[round(i * (len(steps) - 1) / 5)] for i in range(6)})
    rows = [row(f"  step {s}", [f"{d[s]:.4f}" if d.get(s) is not None else "-" for d in series]) for s in picks]
    return ["", f"{name} by step", *rows]


def resolve_all(refs: list[str], runs_dir: Path) -> list[RunDir]:
    """Run ids, unique prefixes/suffixes or run dir paths -> run dirs (LookupError names the bad one)."""
    from cockpit.store.rundir import resolve_run

    return [resolve_run(ref, runs_dir) for ref in refs]
