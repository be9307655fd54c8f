"""``--gpu-smoke``: a matmul on each GPU and a small all-reduce across them.

Everything runs in subprocesses, one per rank, exactly like training ranks, each with a
timeout, so a hang (the classic RCCL failure) or a crashing kernel becomes a failed check
and the doctor itself never holds a GPU context:

    python -m cockpit.doctor.smoke RANK WORLD BACKEND INIT_FILE

Each rank checks a float32 matmul against the CPU (and times a bf16 matmul on a GPU), then,
with WORLD >= 2, all-reduces rank+1 and expects WORLD*(WORLD+1)/2.

GPU build: one rank per visible GPU (at most 8), backend ``nccl`` (RCCL on ROCm).
CPU-only build (decision: run, not skip): 2 CPU ranks, backend ``gloo`` over loopback. That
proves process-group bootstrap works here and keeps this code path tested without a GPU.
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

TIMEOUT_S = 180.0  # all ranks together: torch import, first kernel load, all-reduce
MAX_RANKS = 8
TAGS = frozenset({"gpu", "multi_gpu"})


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


def run_ranks(
    ctx: Context, world: int, backend: str, timeout: float | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """Start ``world`` ranks, collect each one's JSON line. (results, hung)."""
    timeout = TIMEOUT_S if timeout is None else timeout
    results: list[dict[str, Any]] = []
    hung = False
    with tempfile.TemporaryDirectory(prefix="cockpit-doctor-") as tmp:
        init_file = os.path.join(tmp, "init")
        procs = []
        for rank in range(world):
            log = open(os.path.join(tmp, f"rank{rank}.log"), "w+")
            argv = [sys.executable, "-m", "cockpit.doctor.smoke", str(rank), str(world), backend, init_file]
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                text=True,
                env=_worker_env(ctx, backend),
                cwd=tmp,
            )
            procs.append((rank, proc, log))
        deadline = time.monotonic() + timeout
        for rank, proc, log in procs:
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung = True
                proc.kill()
                out, _ = proc.communicate()
            try:
                results.append(json.loads((out or "").strip().splitlines()[-1]))
            except (ValueError, IndexError):
                log.seek(0)
                tail = [ln for ln in log.read().splitlines() if ln.strip()][-1:]
                why = (
                    "killed after the timeout"
                    if proc.returncode in (-9, 137)
                    else (tail[0] if tail else f"exit {proc.returncode}")
                )
                results.append({"rank": rank, "ok": False, "error": why})
            log.close()
    return results, hung


def check_smoke(ctx: Context, run: bool) -> Check:
    title = "GPU smoke test"
    f = ctx.facts
    if not run:
        return Check("smoke", title, SKIP, "not run (cockpit doctor --gpu-smoke)", matters_for=TAGS)
    if not f.importable:
        return Check("smoke", title, SKIP, "torch does not import", matters_for=TAGS)
    gpu = f.build in ("rocm", "cuda") and f.device_count > 0
    world, backend = (min(f.device_count, MAX_RANKS), "nccl") if gpu else (2, "gloo")
    results, hung = run_ranks(ctx, world, backend)
    data: dict[str, Any] = {"backend": backend, "world": world, "ranks": results}
    notes = []
    if hung:
        notes.append(f"ranks hung for {TIMEOUT_S:g} s ({backend}, {world} ranks)")
    for r in results:
        mm = r.get("matmul") or {}
        if r.get("error"):
            notes.append(f"rank {r['rank']}: {r['error']}")
        elif not mm.get("ok"):
            notes.append(f"matmul on {mm.get('device')} is wrong (rel err {mm.get('rel_err', float('nan')):.2g})")
        elif world >= 2 and not (r.get("all_reduce") or {}).get("ok"):
            notes.append(
                f"rank {r['rank']}: all-reduce gave {(r.get('all_reduce') or {}).get('value')}, want {world * (world + 1) / 2:g}"
            )
    if notes:
        comm_trouble = hung or any("all-reduce" in n or "init_process_group" in n or "NCCL" in n for n in notes)
        fix = (
            "see the comm_env and rccl checks; rerun with NCCL_DEBUG=INFO to see where it stops"
            if comm_trouble
            else "see the torch_arch and gpu_visible checks"
        )
        return Check("smoke", title, FAIL, "; ".join(notes), fix, TAGS, data)
    speed = [
        f"{r['matmul']['device']} {r['matmul']['bf16_tflops']} TFLOP/s"
        for r in results
        if "bf16_tflops" in r.get("matmul", {})
    ]
    seen = f"matmul ok on {world} GPU(s)" if gpu else "CPU-only torch: matmul on the CPU ok"
    if speed:
        seen += " (bf16: " + ", ".join(speed) + ")"
    if world >= 2:
        seen += f"; all-reduce over {world} ranks ({backend}) ok"
    return Check("smoke", title, PASS, seen, matters_for=TAGS, data=data)


def _worker(rank: int, world: int, backend: str, init_file: str) -> int:
    from datetime import timedelta

    import torch

    out: dict[str, Any] = {"rank": rank, "ok": False}
    try:
        device = "cpu"
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = f"cuda:{rank}"
        out["matmul"] = matmul_on(device)
        if world >= 2:
            import torch.distributed as dist

            dist.init_process_group(
                backend,
                init_method=f"file://{init_file}",
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=TIMEOUT_S),
            )
            t = torch.full((1 << 20,), float(rank + 1), device=device)
            dist.all_reduce(t)
            ok = bool(torch.all(t == world * (world + 1) / 2).item())
            out["all_reduce"] = {"ok": ok, "value": float(t[0].item())}
            dist.destroy_process_group()
        out["ok"] = out["matmul"]["ok"] and (world < 2 or out["all_reduce"]["ok"])
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(_worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]))
