"""``--gpu-smoke``: a matmul on each GPU and a small all-reduce across them.

On a GPU build: a float32 matmul checked against the CPU and a timed bf16 matmul on each
device, then (with 2+ GPUs) an all-reduce with the ``nccl`` backend (RCCL on ROCm), one
process per GPU, exactly like the training ranks. On a CPU-only build the same code runs a
CPU matmul and a 2-process ``gloo`` all-reduce over loopback: it proves that process-group
bootstrap works here, and keeps this path tested on machines without a GPU.

The all-reduce ranks run as ``python -m cockpit.doctor.smoke RANK WORLD BACKEND INIT_FILE``
subprocesses with a timeout, so a hang (the classic RCCL failure) becomes a failed check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cockpit.doctor.model import FAIL, PASS, SKIP, Check, Context

ALLREDUCE_TIMEOUT_S = 120.0
MAX_RANKS = 8
TAGS_GPU = frozenset({"gpu"})


def matmul_on(device: str) -> dict[str, Any]:
    """A correctness matmul (fp32, against the CPU) and, on a GPU, a bf16 throughput figure."""
    import torch

    torch.manual_seed(0)
    a = torch.randn(512, 512)
    b = torch.randn(512, 512)
    ref = a @ b
    got = (a.to(device) @ b.to(device)).cpu()
    rel = float((got - ref).abs().max() / ref.abs().max())
    out: dict[str, Any] = {"device": device, "rel_err": rel, "ok": rel < 1e-2}
    if device != "cpu":
        n, reps = 4096, 10
        x = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        y = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        x @ y  # warm-up (library load, kernel selection)
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            x @ y
        torch.cuda.synchronize(device)
        out["bf16_tflops"] = round(2 * n**3 * reps / (time.perf_counter() - t0) / 1e12, 1)
    return out


def _worker_env(ctx: Context, backend: str) -> dict[str, str]:
    env = dict(ctx.env)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if backend == "gloo":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: loopback
    return env


def all_reduce(ctx: Context, world: int, backend: str, timeout: float = ALLREDUCE_TIMEOUT_S) -> dict[str, Any]:
    """Run ``world`` ranks; each all-reduces rank+1. {'ok', 'note', 'ranks': [...]}."""
    with tempfile.TemporaryDirectory(prefix="cockpit-doctor-") as tmp:
        init_file = os.path.join(tmp, "init")
        procs = []
        for rank in range(world):
            log = open(os.path.join(tmp, f"rank{rank}.log"), "w+")
            argv = [sys.executable, "-m", "cockpit.doctor.smoke", str(rank), str(world), backend, init_file]
            procs.append((subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True, env=_worker_env(ctx, backend), cwd=tmp), log))
        deadline = time.monotonic() + timeout
        results: list[dict[str, Any]] = []
        hung = False
        for proc, log in procs:
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung = True
                proc.kill()
                out, _ = proc.communicate()
            line = (out or "").strip().splitlines()[-1:] or [""]
            try:
                results.append(json.loads(line[0]))
            except ValueError:
                log.seek(0)
                tail = [ln for ln in log.read().splitlines() if ln.strip()][-1:]
                results.append({"ok": False, "error": tail[0] if tail else f"exit {proc.returncode}"})
            log.close()
    if hung:
        return {"ok": False, "note": f"all-reduce over {world} ranks ({backend}) hung for {timeout:.0f} s", "ranks": results}
    bad = [r for r in results if not r.get("ok")]
    if bad:
        return {"ok": False, "note": f"all-reduce ({backend}) failed: {bad[0].get('error') or bad[0]}", "ranks": results}
    return {"ok": True, "note": f"all-reduce over {world} ranks ({backend}) ok", "ranks": results}


def check_smoke(ctx: Context, run: bool) -> Check:
    title = "GPU smoke test"
    f = ctx.facts
    if not run:
        return Check("smoke", title, SKIP, "not run (cockpit doctor --gpu-smoke)", matters_for=TAGS_GPU)
    if not f.importable:
        return Check("smoke", title, SKIP, "torch does not import", matters_for=TAGS_GPU)
    gpu = f.build in ("rocm", "cuda") and f.device_count > 0
    devices = [f"cuda:{d.index}" for d in f.devices] if gpu else ["cpu"]
    notes: list[str] = []
    data: dict[str, Any] = {"matmul": []}
    for dev in devices:
        try:
            res = matmul_on(dev)
        except Exception as exc:
            res = {"device": dev, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        data["matmul"].append(res)
        if not res["ok"]:
            notes.append(f"matmul on {dev} failed: {res.get('error') or 'rel err %.2g' % res.get('rel_err', float('nan'))}")
    speed = [f"{r['device']} {r['bf16_tflops']} TFLOP/s" for r in data["matmul"] if "bf16_tflops" in r]
    world, backend = (min(len(devices), MAX_RANKS), "nccl") if gpu else (2, "gloo")
    if world >= 2:
        reduce = all_reduce(ctx, world, backend)
        data["all_reduce"] = reduce
        if not reduce["ok"]:
            notes.append(reduce["note"])
    tags = frozenset({"gpu", "multi_gpu"})
    if notes:
        fix = "see the comm_env and rccl checks; rerun with NCCL_DEBUG=INFO to see where it stops" if any("all-reduce" in n for n in notes) else "see the torch_arch and gpu_visible checks"
        return Check("smoke", title, FAIL, "; ".join(notes), fix, tags, data)
    what = f"matmul ok on {len(devices)} GPU(s)" if gpu else "CPU-only torch: matmul on the CPU ok"
    if speed:
        what += " (bf16: " + ", ".join(speed) + ")"
    if "all_reduce" in data:
        what += "; " + data["all_reduce"]["note"]
    return Check("smoke", title, PASS, what, matters_for=tags, data=data)


def _worker(rank: int, world: int, backend: str, init_file: str) -> int:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    try:
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=ALLREDUCE_TIMEOUT_S))
        t = torch.full((1 << 20,), float(rank + 1), device=device)
        dist.all_reduce(t)
        want = world * (world + 1) / 2
        ok = bool(torch.all(t == want).item())
        dist.destroy_process_group()
        print(json.dumps({"rank": rank, "ok": ok, "value": float(t[0].item())}), flush=True)
    except Exception as exc:
        print(json.dumps({"rank": rank, "ok": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]))
