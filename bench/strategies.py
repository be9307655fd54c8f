"""Tokens/s of the distributed strategies on the same job, side by side in one invocation.

    python bench/strategies.py [--model smollm2-135m-instruct] [--steps 8] [--only one,ddp,z2,z3,fsdp]

Every strategy trains the same model, data, cutoff, global batch (1 rank x micro-batch 4, or 2
ranks x micro-batch 2), seed and steps (fp32 on the CPU, gloo), through the real CLI (`cockpit
train`: detached supervisor, torchrun, events). Throughput = non-padding tokens seen (all ranks)
/ Trainer's train time, from summary.json: process start-up and model loading are excluded.
Prints a table with the ratio to 1 rank and the largest per-step loss gap to the 1-rank run.

On a 2-core machine two ranks share the cores with each other (and OMP_NUM_THREADS=1 per rank),
so the ratios say what each strategy costs on the CPU path, not what it gains on GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from jobs import DEMO_LORA_JOB  # bench/jobs.py (scripts run as `python bench/NAME.py`)

ROOT = Path(__file__).resolve().parent.parent

JOB = dict(DEMO_LORA_JOB, logging_steps=1, telemetry_interval_s=0, comm_probe=False, numa_bind="off")

STRATEGIES = {
    "one": ("1 rank", {"nproc_per_node": 1, "per_device_train_batch_size": 4}),
    "ddp": ("DDP x2", {"nproc_per_node": 2, "per_device_train_batch_size": 2}),
    "z2": ("ZeRO-2 x2", {"nproc_per_node": 2, "per_device_train_batch_size": 2, "zero_stage": 2}),
    "z3": ("ZeRO-3 x2", {"nproc_per_node": 2, "per_device_train_batch_size": 2, "zero_stage": 3}),
    "fsdp": ("FSDP2 x2", {"nproc_per_node": 2, "per_device_train_batch_size": 2, "fsdp": "full_shard auto_wrap"}),
}


def run_one(tmp: Path, key: str, model: str, steps: int) -> dict:
    cfg = {"model_name_or_path": model, **JOB, "max_steps": steps, **STRATEGIES[key][1]}
    from cockpit.config.schema import SCHEMA

    cfg = {k: v for k, v in cfg.items() if k in SCHEMA}  # a key another branch has not added yet
    path = tmp / f"{key}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp / f"runs-{key}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions")}
    res = subprocess.run([sys.executable, "-m", "cockpit.cli", "train", str(path), "--runs-dir", str(runs)], capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=3600)
    run = next((d for d in runs.iterdir() if d.is_dir()), None) if runs.is_dir() else None
    if run is None:  # refused before a run dir existed (cockpit check's verdict)
        return {"key": key, "ok": False, "tokens_per_s": None, "train_s": None, "losses": [], "run": "no run dir",
                "err": (res.stderr or res.stdout)[-500:]}
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    events = [json.loads(l) for l in (run / "events.jsonl").read_text().splitlines() if l.strip()]
    losses = [e["loss"] for e in events if e.get("kind") == "step"]
    return {"key": key, "ok": res.returncode == 0, "tokens_per_s": summary.get("tokens_per_s"), "train_s": summary.get("train_runtime_s"), "losses": losses, "run": str(run), "err": res.stderr[-500:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--only", default=",".join(STRATEGIES))
    args = ap.parse_args(argv)
    keys = [k for k in args.only.split(",") if k in STRATEGIES]
    results = []
    with tempfile.TemporaryDirectory(prefix="cockpit-bench-strategies-") as td:
        for key in keys:
            print(f"running {STRATEGIES[key][0]} ...", flush=True)
            results.append(run_one(Path(td), key, args.model, args.steps))
    base = next((r for r in results if r["key"] == "one" and r["ok"]), None)
    print()
    print(f"model {args.model}, {args.steps} steps, global batch 4, cutoff {JOB['cutoff_len']}, fp32 CPU (gloo)")
    print(f"{'strategy':<12} {'tokens/s':>10} {'vs 1 rank':>10} {'train s':>9} {'max loss gap':>13}")
    for r in results:
        label = STRATEGIES[r["key"]][0]
        if not r["ok"] or not r["tokens_per_s"]:
            print(f"{label:<12} {'failed':>10}   {r['err'].strip().splitlines()[-1] if r['err'].strip() else r['run']}")
            continue
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        gap = "-"
        if base and len(base["losses"]) == len(r["losses"]) and r is not base:
            gap = f"{max(abs(a - b) / abs(b) for a, b in zip(r['losses'], base['losses'])):.1e}"
        print(f"{label:<12} {r['tokens_per_s']:>10.1f} {ratio:>10} {r['train_s']:>9.1f} {gap:>13}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
