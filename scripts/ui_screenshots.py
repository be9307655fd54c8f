"""Screenshots of every screen, fed from the recorded run in ``tests/fixtures/ui_run``.

    python scripts/ui_screenshots.py [OUT_DIR]     # default: screenshots/

A development script (it reads tests/fixtures/), so it lives here, not in the shipped package;
the tests import it through pytest's ``pythonpath = ["scripts"]``.

The same scenes drive the snapshot tests (tests/test_ui_snapshots.py), so what the README
shows is what the tests pin. Deterministic: frozen clock, no live following, UTC times,
an empty user config dir, relative paths.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path("tests") / "fixtures" / "ui_run"  # relative to ROOT: paths on screen stay short
RUN_ID = "20261130-094516-cpu-demo-tiny-de8f"
FROZEN_NOW = 1796031960.0
SIZES = {"80x24": (80, 24), "160x48": (160, 48)}


def prepare_env(config_home: Path) -> None:
    """What makes a scene deterministic: cwd at the repo root, UTC, no user presets."""
    os.chdir(ROOT)
    os.environ["TZ"] = "UTC"
    time.tzset()
    os.environ["XDG_CONFIG_HOME"] = str(config_home)
    os.environ["COCKPIT_SLURM"] = "0"  # no "Launch on Slurm", whether sbatch is on PATH or not


# the recorded machine (the doctor.json one): a 2-core CPU box with 24 GiB and no GPU
MACHINE: dict[str, Any] = {"host": "cpu-box", "gpus": 0, "gpu_kind": "", "gpu_memory_gb": None, "ram_gb": 24.0}


def make_app(start: str, **kw: Any):
    """``colours``: "no" (NO_COLOR set, as Textual reads it) or "16" (the ANSI theme, 16 colours)."""
    from cockpit.ui.app import CockpitApp
    from cockpit.ui.widgets import Machine

    colours = kw.pop("colours", None)
    doctor = json.loads((ROOT / FIXTURE / "doctor.json").read_text(encoding="utf-8"))
    if colours == "no":
        os.environ["NO_COLOR"] = "1"  # Textual reads (and removes) it when the app is made
    app = CockpitApp(FIXTURE, start=start, clock=lambda: FROZEN_NOW, follow=False, runs_refresh_s=3600,
                     doctor_checks=doctor, machine=Machine(**MACHINE), **kw)
    os.environ.pop("NO_COLOR", None)
    if colours == "16":
        app.theme = "ansi-dark"  # the terminal's own 16 colours
    return app


async def _settle(pilot, until: Callable[[], bool] | None = None, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while until is not None and not until() and time.monotonic() < deadline:
        await pilot.pause(0.05)
    await pilot.app.workers.wait_for_complete()
    await pilot.pause(0.1)


def tables_sized(pilot, screen: str, *selectors: str) -> bool:
    """The screen is up and each of its tables has rows and columns sized to them: DataTable
    sizes its columns to the new rows on idle (``_require_update_dimensions`` until then: a shot
    taken before has columns of their labels' width)."""
    if type(pilot.app.screen).__name__ != screen:
        return False
    tables = [t for sel in selectors for t in pilot.app.screen.query(sel)]
    return bool(tables) and all(t.row_count and not t._require_update_dimensions for t in tables)


async def _runs(pilot) -> None:
    await _settle(pilot)


async def _open(pilot, key: str, screen: str) -> None:
    from cockpit.store.rundir import RunDir

    run = RunDir(FIXTURE / RUN_ID)
    if screen == "live":
        pilot.app.open_live(run)
        await _settle(pilot, lambda: type(pilot.app.screen).__name__ == "LiveScreen"
                      and pilot.app.screen.replay_progress is None and pilot.app.screen.state.events_seen > 0)
        pilot.app.screen._drawn_version = -1
        pilot.app.screen.draw()
    else:
        pilot.app.open_summary(run)
        # the probes table is filled from a worker: wait for its rows, then for the layout pass
        # that sizes its columns (a shot taken between the two has squeezed columns)
        await _settle(pilot, lambda: tables_sized(pilot, "SummaryScreen", "#probes"))
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.2)
    await pilot.pause(0.2)


async def _live(pilot) -> None:
    await _open(pilot, "", "live")


async def _plot(pilot) -> None:
    await _open(pilot, "", "live")
    await pilot.press("p")
    await _settle(pilot, lambda: type(pilot.app.screen).__name__ == "PlotView")


async def _summary(pilot) -> None:
    await _open(pilot, "", "summary")


async def _setup(pilot) -> None:
    def ready() -> bool:
        scr = pilot.app.screen
        fit = scr.query("#fit")
        return scr._validate_timer is None and bool(fit) and "fit: peak" in str(fit.first().render())

    await _settle(pilot, ready)
    await _settle(pilot, ready)


async def _doctor(pilot) -> None:
    await _settle(pilot)


COMPARE_RUNS = 3  # the newest recorded runs, marked in Runs with space, compared with d


async def _compare(pilot) -> None:
    await _settle(pilot)
    for _ in range(COMPARE_RUNS):
        await pilot.press("space", "down")
    await pilot.press("d")
    await _settle(pilot, lambda: type(pilot.app.screen).__name__ == "CompareScreen" and pilot.app.screen.data is not None)
    await _settle(pilot, lambda: tables_sized(pilot, "CompareScreen", "#compare-summary", "#compare-config"))
    await pilot.wait_for_scheduled_animations()
    await pilot.pause(0.3)


async def _keys(pilot) -> None:
    await _settle(pilot)
    await pilot.press("question_mark")
    await _settle(pilot, lambda: type(pilot.app.screen).__name__ == "KeysView")


# -- a grpo run, written as its ranks and supervisor write it (cockpit/train/recipes/grpo.py's step fields
# and completions events; the values are those of a cpu-grpo-demo run with today's cpu-grpo-hack weights: brevity
# rises, correctness falls, and the reward-hacking alert fires), stopped at step 26 of 40 ---------------------
GRPO_RUN_ID = "20261203-132741-cpu-grpo-demo-2b4b"
GRPO_GROUPS = [  # (prompt, [(completion, contains_answer, length_penalty, advantage)] x 4): a group per step
    ("What is the capital city of the United States? Answer in one word.", [
        ("Your original question requires a thorough thought-provoking response without excessive", 0.0, 0.1, -0.8472),
        ("You've already nicely incorporated understanding the answer, I'll just", 0.0, 0.1111, 0.8472),
        ("Your answer is a complete lie, no details provided.", 0.0, 0.1111, 0.8472),
        ("...or more to the point, the answer is something I", 0.0, 0.1, -0.8472)]),
    ("What is the capital of Chile? Answer in one word.", [
        ("Capital of Chile is Latin lon Greece", 0.0, 0.1667, -1.4555),
        ("de ingestionis\n", 0.0, 0.5, 0.3164),
        ("The capital of Chile is Santiago.", 1.0, 0.1667, 0.8227),
        ("Santo @CoDesjava", 0.0, 0.5, 0.3164)]),
    ("What is the opposite of 'push'? Answer in one word.", [
        ("pull", 1.0, 1.0, 0.8660),
        ("The opposite of \"push\" is \"pull\": to draw something towards yourself rather than away from"
         " you, the way a door opens\nwhen you", 1.0, 0.0556, -0.8660),
        ("pull", 1.0, 1.0, 0.8660),
        ("Shove", 0.0, 1.0, -0.8660)]),
    ("Which animal says 'hoot'? Answer in one word.", [
        ("Owl", 1.0, 1.0, 0.5774),
        ("owl", 1.0, 1.0, 0.5774),
        ("Cat", 0.0, 1.0, -1.7321),
        ("Owl.", 1.0, 1.0, 0.5774)]),
]
GRPO_WEIGHTS = {"contains_answer": 0.3, "length_penalty": 0.7}


def write_grpo_run(runs: Path, steps: int = 26, total: int = 40) -> Path:
    """A grpo run dir under ``runs`` with ``steps`` logged steps (one completions event each), still
    running: what the Live screen follows. Deterministic (times from FROZEN_NOW)."""
    import math

    from cockpit.config.run_config import RunConfig
    from cockpit.train.reward_watch import RewardWatch

    watch = RewardWatch(RunConfig())
    run = runs / GRPO_RUN_ID
    (run / "logs").mkdir(parents=True, exist_ok=True)
    t0 = FROZEN_NOW - 60 - 12.0 * steps
    status = {"state": "running", "run_id": GRPO_RUN_ID, "attempt": 1, "step": steps, "total_steps": total,
              "started": t0}
    (run / "status.json").write_text(json.dumps(status), encoding="utf-8")
    (run / "config.yaml").write_text("stage: grpo\nreward_funcs: contains_answer,length_penalty\n"
                                     "reward_weights: 0.3,0.7\n", encoding="utf-8")
    events: list[dict[str, Any]] = [
        {"t": t0, "kind": "run_started", "run_id": GRPO_RUN_ID, "attempt": 1, "model": "smollm2-135m-instruct",
         "dataset": "cockpit_oneword", "method": "lora", "world_size": 1, "nproc_per_node": 1, "nnodes": 1,
         "output_dir": None},
        {"t": t0, "kind": "state", "state": "running", "reason": None},
        {"t": t0 + 26, "kind": "train_begin", "total_steps": total, "epochs": 1.0, "world_size": 1, "global_batch": 8,
         "start_step": 0},
        {"t": t0 + 26, "kind": "progress", "task": "held_out", "phase": "before", "done": 0, "total": 24},
        {"t": t0 + 37, "kind": "progress", "task": "held_out", "phase": "before", "done": 24, "total": 24},
        {"t": t0 + 37, "kind": "held_out", "phase": "before", "stage": "grpo", "prompts": 24, "mean_reward": 0.2339,
         "rewards": {"contains_answer": 0.4583, "length_penalty": 0.1378}, "samples": []},
    ]
    for step in range(1, steps + 1):
        t = t0 + 37 + 12.0 * step
        x = step / total
        wobble = 0.06 * math.sin(step * 1.7)
        reward = round(0.17 + 0.6 * x + wobble, 4)
        length = round(max(0.1, 0.25 + 0.95 * x + wobble), 4)
        events.append({
            "t": t, "kind": "step", "step": step, "total_steps": total, "epoch": round(step / total, 4),
            "loss": round(0.11 * (1 - x) + 0.02 * math.cos(step), 6), "lr": 0.0005,
            "grad_norm": round(1.0 - 0.4 * x + 0.1 * math.sin(step), 4), "tokens_per_s": round(13 + 2 * math.sin(step), 2),
            "samples_per_s": 0.3, "tokens_seen": 260 * step,
            "mem": {"0": {"allocated_mb": None, "reserved_mb": None, "peak_mb": None, "rss_mb": 1625.1,
                          "capacity_mb": 24105.1, "source": "rss", "node_rank": 0, "local_rank": 0, "host": "vm"}},
            "reward": reward, "reward_std": round(0.22 - 0.1 * x, 4), "reward_zero_std_frac": 0.0,
            "kl": round(0.06 * x + 0.01 * abs(math.sin(step)), 6), "entropy": round(3.19 - 1.6 * x, 4),
            "clip_ratio": 0.0, "clip_ratio_low": 0.0, "clip_ratio_high": 0.0,
            "completion_len_mean": round(11.1 - 8 * x, 3), "completion_len_max": 12.0,
            "completion_truncated": round(max(0.0, 0.75 - 1.2 * x), 4),
            "rewards": {"contains_answer": {"mean": round(0.46 - 0.45 * x + wobble / 2, 4), "std": 0.35},
                        "length_penalty": {"mean": min(1.0, length), "std": 0.3}},
        })
        for alert in watch.observe(step, events[-1]):  # the reward-hacking watch the ranks run, on these steps
            events.append({"t": t, "kind": "alert", "step": step, **alert})
        prompt, group = GRPO_GROUPS[step % len(GRPO_GROUPS)]
        samples = [{"prompt": prompt, "completion": c,
                    "reward": round(GRPO_WEIGHTS["contains_answer"] * a + GRPO_WEIGHTS["length_penalty"] * lp, 4),
                    "rewards": {"contains_answer": a, "length_penalty": lp}, "advantage": adv}
                   for c, a, lp, adv in group]
        events.append({"t": t, "kind": "completions", "step": step, "samples": samples})
        if step % 10 == 0:
            events.append({"t": t + 1, "kind": "checkpoint_saved", "step": step,
                           "path": f"/home/user/.local/share/cockpit/runs/{GRPO_RUN_ID}/checkpoints/checkpoint-{step}",
                           "loss_finite": True})
    events.append({"t": FROZEN_NOW - 1, "kind": "telemetry", "backend": "cpu", "devices": [],
                   "ranks": [{"rank": 0, "pid": 4460, "alive": True, "rss_mb": 1625.1, "cpu_pct": 198.0}],
                   "unavailable": {"amdsmi": "libamd_smi.so not found", "nvml": "libnvidia-ml.so.1 not found"},
                   "node_rank": 0, "host": "vm"})
    with open(run / "events.jsonl", "w", encoding="utf-8") as fh:
        for ev in events:
            ev = {"v": 1, **ev, "t": round(ev["t"], 3)}
            fh.write(json.dumps(ev, ensure_ascii=False, separators=(",", ":")) + "\n")
    return run


async def _open_written(pilot, write: Callable[[Path], Path], prefix: str) -> None:
    """The Live screen of a run dir ``write`` makes under a new temporary folder, once replayed."""
    import tempfile

    from cockpit.store.rundir import RunDir

    run = write(Path(tempfile.mkdtemp(prefix=prefix)))
    pilot.app.open_live(RunDir(run))
    await _settle(pilot, lambda: type(pilot.app.screen).__name__ == "LiveScreen"
                  and pilot.app.screen.replay_progress is None and pilot.app.screen.state.events_seen > 0)
    pilot.app.screen._drawn_version = -1
    pilot.app.screen.draw()
    await pilot.pause(0.3)


# -- a 64-node x 8-GPU job as global rank 0's run dir holds it: node 0's GPUs from its supervisor, the other
# nodes' through the rendezvous store (cockpit/telemetry/node.py's reporter and collector over fake MI300X at
# the hardware boundary), one GPU running hot (node 17) and one idling (node 41), at step 30 of 500 ---------
NODES_RUN_ID = "20261203-151200-llama-70b-64n-7c1d"


class DictStore:
    """The rendezvous store's three calls the node telemetry makes (set, check, get), in a dict."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> str:
        return self.data[key]


def fake_node_gpus(node: int, gpus: int = 8) -> list[Any]:
    from cockpit.telemetry.fakes import FakeGpu

    out = []
    for i in range(gpus):
        wobble = ((node * 7 + i * 3) % 10) / 10
        util = 4 if (node, i) == (41, 5) else int(78 + 20 * wobble)
        temp = 96 if (node, i) == (17, 2) else int(58 + 16 * wobble)
        out.append(FakeGpu(bdf=f"0000:{0x0C + i:02x}:00.0", vram_used_mb=int(196592 * (0.52 + 0.44 * wobble)),
                           gfx_activity=util, temp_hotspot_c=temp, current_socket_power=380 + int(300 * util / 100)))
    return out


def write_nodes_run(runs: Path, nnodes: int = 64, gpus: int = 8, steps: int = 30, total: int = 500) -> Path:
    from cockpit.telemetry import AmdSmiBackend
    from cockpit.telemetry.fakes import FakeAmdSmi
    from cockpit.telemetry.node import NodeCollector, NodeReporter

    run = runs / NODES_RUN_ID
    (run / "logs").mkdir(parents=True, exist_ok=True)
    t0 = FROZEN_NOW - 600
    world = nnodes * gpus
    status = {"state": "running", "run_id": NODES_RUN_ID, "attempt": 1, "step": steps, "total_steps": total, "started": t0}
    (run / "status.json").write_text(json.dumps(status), encoding="utf-8")
    (run / "config.yaml").write_text(f"nnodes: {nnodes}\nnproc_per_node: {gpus}\n", encoding="utf-8")
    events: list[dict[str, Any]] = [
        {"t": t0, "kind": "run_started", "run_id": NODES_RUN_ID, "attempt": 1, "model": "meta-llama/Llama-3.1-70B",
         "dataset": "alpaca_en", "method": "lora", "world_size": world, "nproc_per_node": gpus, "nnodes": nnodes,
         "output_dir": None},
        {"t": t0, "kind": "state", "state": "running", "reason": None},
        {"t": t0 + 120, "kind": "train_begin", "total_steps": total, "epochs": 1.0, "world_size": world,
         "global_batch": 4 * world, "start_step": 0},
        {"t": t0 + 120, "kind": "comm", "backend": "rccl", "version": "2.21.5", "world_size": world, "status": "ok"},
    ]
    for step in range(1, steps + 1):
        events.append({"t": t0 + 120 + 15.0 * step, "kind": "step", "step": step, "total_steps": total,
                       "epoch": round(step / total, 4), "loss": round(1.9 - 0.02 * step, 4), "lr": 2e-4, "grad_norm": 0.8,
                       "tokens_per_s": 1_310_000.0, "samples_per_s": 160.0, "tokens_seen": step * 19_660_800})
    store = DictStore()
    backends = [AmdSmiBackend(FakeAmdSmi(fake_node_gpus(n, gpus))) for n in range(nnodes)]
    reporters = [NodeReporter(store, n, f"mi300-{n:02d}", None if n == 0 else backends[n]) for n in range(nnodes)]
    collector = NodeCollector(store, nnodes, own_node=0)
    for r in reporters:
        r.step = steps
        r.publish()
    for kind, fields in collector.collect():
        events.append({"t": FROZEN_NOW - 1, "kind": kind, **fields})
    node0 = backends[0].devices()
    events.append({"t": FROZEN_NOW - 1, "kind": "telemetry", "backend": "amdsmi", "devices": node0, "ranks": [],
                   "unavailable": {"nvml": "not tried: amdsmi is active"}, "node_rank": 0, "host": "mi300-00"})
    with open(run / "events.jsonl", "w", encoding="utf-8") as fh:
        for ev in events:
            fh.write(json.dumps({"v": 1, **ev, "t": round(ev["t"], 3)}, separators=(",", ":")) + "\n")
    return run


async def _grpo_live(pilot) -> None:
    await _open_written(pilot, write_grpo_run, "cockpit-grpo-")


async def _nodes_live(pilot) -> None:
    await _open_written(pilot, write_nodes_run, "cockpit-nodes-")


async def _nodes_drill(pilot) -> None:
    await _open_written(pilot, write_nodes_run, "cockpit-nodes-")
    await pilot.press("o")  # the node of the least busy GPU, in the detailed form
    await pilot.pause(0.3)


# -- a mixture-of-experts run (issue 64): Mixtral-shaped (32 layers, 8 experts, top-2), LoRA with
# moe_aux_loss_coef, its step events carrying aux_loss and expert_load as rank 0 writes them
# (cockpit/store/expert_load.py's encode and LoadWatch on made-up router counts: layer 7's expert 3
# starves, layer 12's expert 5 takes most tokens, so both alerts fire), at step 60 of 200 -----------------
MOE_RUN_ID = "20261206-061500-mixtral-lora-moe-4c2a"


def moe_counts(step: int, layers: int = 32, experts: int = 8, tokens: int = 8192) -> list[list[float]]:
    """Deterministic top-2 assignment counts per layer: near fair, with a starving and a hot expert."""
    import math

    out = []
    for layer in range(layers):
        row = [1.0 + 0.35 * math.sin(1.3 * layer + 0.7 * e + 0.05 * step) for e in range(experts)]
        if layer == 7:
            row[3] = max(0.005, 0.4 - 0.03 * step)
        if layer == 12:
            row[5] = 6.0 + 0.2 * step
        total = sum(row)
        out.append([round(2 * tokens * x / total) for x in row])
    return out


def write_moe_run(runs: Path, steps: int = 12, total: int = 200, every: int = 5) -> Path:
    """An MoE run dir under ``runs``, logging every ``every`` steps up to ``steps`` logs, still running."""
    from cockpit.store.expert_load import LoadWatch, encode

    run = runs / MOE_RUN_ID
    (run / "logs").mkdir(parents=True, exist_ok=True)
    t0 = FROZEN_NOW - 60 - 30.0 * steps * every
    status = {"state": "running", "run_id": MOE_RUN_ID, "attempt": 1, "step": steps * every, "total_steps": total,
              "started": t0}
    (run / "status.json").write_text(json.dumps(status), encoding="utf-8")
    (run / "config.yaml").write_text("model_name_or_path: mistralai/Mixtral-8x7B-Instruct-v0.1\n"
                                     "moe_aux_loss_coef: 0.001\n", encoding="utf-8")
    events: list[dict[str, Any]] = [
        {"t": t0, "kind": "run_started", "run_id": MOE_RUN_ID, "attempt": 1,
         "model": "mistralai/Mixtral-8x7B-Instruct-v0.1", "dataset": "cockpit_identity", "method": "lora",
         "world_size": 1, "nproc_per_node": 1, "nnodes": 1, "output_dir": None},
        {"t": t0, "kind": "state", "state": "running", "reason": None},
        {"t": t0 + 40, "kind": "train_begin", "total_steps": total, "epochs": 1.0, "world_size": 1, "global_batch": 8,
         "start_step": 0},
    ]
    watch = LoadWatch()
    layers = list(range(32))
    for i in range(1, steps + 1):
        step, t = i * every, t0 + 40 + 30.0 * i * every
        counts = moe_counts(step)
        events.append({"t": t, "kind": "step", "step": step, "total_steps": total, "epoch": round(step / total, 4),
                       "loss": round(1.42 - 0.3 * i / steps, 4), "aux_loss": round(2.03 + 0.004 * i, 4), "lr": 1e-4,
                       "grad_norm": 0.41, "tokens_per_s": 2730.0, "samples_per_s": 1.33, "tokens_seen": 8192 * step,
                       "expert_load": encode(counts, layers, 2)})
        events += [{"t": t, "kind": "alert", "policy": "warn", **a} for a in watch.observe(counts, layers, step)]
    lines = [json.dumps({"v": 1, **ev, "t": round(ev["t"], 3)}, separators=(",", ":")) for ev in events]
    (run / "events.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return run


async def _moe_live(pilot) -> None:
    await _open_written(pilot, write_moe_run, "cockpit-moe-")


# name -> (start mode, extra app options, run_before)
# -- a sweep (cockpit sweep, docs/sweeps.md) as its driver leaves it: Optuna's SQLite study made through
# cockpit/sweep's own code, seven trials asked of it (four complete, one pruned at step 20, two running), each
# with the run dir a trial's run has (status.json `sweep` / `sweep_trial`, its config, step and eval events) --
SWEEP_NAME = "lr-rank"
SWEEP_TRIALS = [  # (learning_rate, lora_rank, state, eval_loss at steps 10, 20, 30, 40 as far as it went)
    (3e-4, 8, "complete", [2.31, 1.84, 1.55, 1.412]),
    (2e-3, 16, "complete", [2.02, 1.51, 1.29, 1.187]),
    (1e-5, 4, "pruned", [2.69, 2.61]),
    (5e-3, 16, "complete", [1.93, 1.38, 1.17, 1.093]),
    (8e-5, 4, "complete", [2.52, 2.21, 1.99, 1.874]),
    (1e-3, 8, "running", [2.11, 1.62]),
    (4e-3, 16, "running", [1.97]),
]


def write_sweep(runs: Path, name: str = SWEEP_NAME, trials: list | None = None) -> Path:
    """The sweep ``name`` under ``runs`` (its spec over the cpu-demo preset, its study in optuna.db) and
    its trials' run dirs; the sweep dir. Deterministic: the values are enqueued, the times from FROZEN_NOW."""
    import optuna
    import yaml

    from cockpit.config.load import to_yaml
    from cockpit.sweep.driver import Driver, suggest
    from cockpit.sweep.spec import parse_spec

    base = yaml.safe_load((ROOT / "presets" / "cpu-demo.yaml").read_text(encoding="utf-8"))
    raw = {"name": name, "base": base, "trials": 8, "parallel": 2, "seed": 0,
           "space": {"learning_rate": {"type": "float", "low": 1e-5, "high": 1e-2, "log": True},
                     "lora_rank": {"type": "choice", "choices": [4, 8, 16]}}}
    spec = parse_spec(raw, ROOT, default_name=name)
    study = Driver(runs, spec, log=lambda _m: None).create()
    for number, (lr, rank, state, losses) in enumerate(trials or SWEEP_TRIALS):
        study.enqueue_trial({"learning_rate": lr, "lora_rank": rank})
        trial = study.ask()
        params = suggest(trial, spec)
        run_id = f"20261204-{10 + number:02d}0000-{name}-t{number}-{number:x}a5e"
        run = runs / run_id
        (run / "logs").mkdir(parents=True, exist_ok=True)
        study._storage.set_trial_user_attr(trial._trial_id, "run_name", f"{name}-t{number}")
        study._storage.set_trial_user_attr(trial._trial_id, "run_id", run_id)
        steps = 10 * len(losses)
        t0 = FROZEN_NOW - 3600 * (8 - number)
        run_state = {"complete": "finished", "pruned": "stopped"}.get(state, "running")
        status = {"state": run_state, "run_id": run_id, "attempt": 1, "step": steps, "total_steps": 40,
                  "started": t0, "sweep": name, "sweep_trial": number}
        (run / "status.json").write_text(json.dumps(status), encoding="utf-8")
        (run / "config.yaml").write_text(to_yaml(spec.raw_config(params, f"{name}-t{number}"), only_changed=False),
                                         encoding="utf-8")
        events: list[dict[str, Any]] = [{"t": t0, "kind": "state", "state": "running", "reason": None},
                                        {"t": t0 + 20, "kind": "train_begin", "total_steps": 40, "start_step": 0}]
        for i, loss in enumerate(losses, start=1):
            trial.report(loss, 10 * i)
            events += [{"t": t0 + 60 * i, "kind": "step", "step": 10 * i, "total_steps": 40, "loss": round(loss + 0.2, 3),
                        "tokens_seen": 2600 * i},
                       {"t": t0 + 60 * i + 5, "kind": "eval", "step": 10 * i, "eval_loss": loss}]
        if state == "complete":
            study.tell(trial, losses[-1])
        elif state == "pruned":
            study._storage.set_trial_user_attr(trial._trial_id, "prune_requested", steps)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        if run_state != "running":
            events.append({"t": t0 + 60 * len(losses) + 10, "kind": "state", "state": run_state, "reason": None})
        with open(run / "events.jsonl", "w", encoding="utf-8") as fh:
            for ev in events:
                fh.write(json.dumps({"v": 1, **ev}, separators=(",", ":")) + "\n")
    return runs / "sweeps" / name


async def _sweep(pilot) -> None:
    import tempfile

    runs = Path(tempfile.mkdtemp(prefix="cockpit-sweep-"))
    write_sweep(runs)
    pilot.app.open_sweep(SWEEP_NAME, runs_dir=runs)
    await _settle(pilot, lambda: type(pilot.app.screen).__name__ == "SweepScreen" and pilot.app.screen.reads > 0,
                  timeout=60)
    await _settle(pilot, lambda: tables_sized(pilot, "SweepScreen", "#sweep-trials"))
    await pilot.pause(0.3)


SCENES: dict[str, tuple[str, dict[str, Any], Callable[[Any], Awaitable[None]]]] = {
    "runs": ("runs", {}, _runs),
    "live": ("runs", {}, _live),
    "plot": ("runs", {}, _plot),
    "summary": ("runs", {}, _summary),
    "setup": ("setup", {"start_preset": Path("presets") / "cpu-demo.yaml"}, _setup),
    "doctor": ("doctor", {}, _doctor),
    "compare": ("runs", {}, _compare),
    "keys": ("runs", {}, _keys),
    "grpo-live": ("runs", {}, _grpo_live),
    "nodes-live": ("runs", {}, _nodes_live),
    "nodes-drill": ("runs", {}, _nodes_drill),
    "summary-nocolor": ("runs", {"colours": "no"}, _summary),
    "runs-16colour": ("runs", {"colours": "16"}, _runs),
    "sweep": ("runs", {}, _sweep),
    "moe-live": ("runs", {}, _moe_live),
}


async def shoot(name: str, size: tuple[int, int], out: Path) -> Path:
    start, opts, before = SCENES[name]
    app = make_app(start, **opts)
    async with app.run_test(size=size) as pilot:
        await before(pilot)
        svg = app.export_screenshot(title=f"cockpit — {name}")
    path = out / f"{name}-{size[0]}x{size[1]}.svg"
    path.write_text(svg, encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    import tempfile

    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]).resolve() if argv else ROOT / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    prepare_env(Path(tempfile.mkdtemp(prefix="cockpit-shots-")))
    for name in SCENES:
        for size in SIZES.values():
            print(asyncio.run(shoot(name, size, out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
