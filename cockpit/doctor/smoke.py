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


SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION")


def _sdpa_once(backend: Any, q: Any, ref: Any) -> dict[str, Any]:
    """One tiny causal forward + backward with only ``backend`` allowed, against the math reference."""
    import warnings

    import torch
    from torch.nn.attention import sdpa_kernel

    x = q.detach().clone().requires_grad_(True)
    with warnings.catch_warnings(record=True) as said, sdpa_kernel([backend]):
        warnings.simplefilter("always")
        try:
            out = torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)
            out.float().sum().backward()
        except Exception as exc:  # a backend that cannot run here is the answer
            why = [str(w.message).splitlines()[0] for w in said if "ignored" not in str(w.message)]
            return {"ok": False, "note": (why[0] if why else f"{type(exc).__name__}: {exc}")[:200]}
    rel = float((out.detach().float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
    return {"ok": rel < 5e-2, "rel_err": rel, "note": "" if rel < 5e-2 else f"wrong results (rel err {rel:.2g})"}


def attention_backends(device: str) -> dict[str, dict[str, Any]]:
    """Which attention kernels run on ``device`` (docs/rocm.md item 9): each of SDPA's backends alone, and
    FlashAttention-2 (ROCm: CK, or Triton with FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE) when installed."""
    import importlib.util

    import torch
    from torch.nn.attention import SDPBackend

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    q = torch.randn(1, 2, 64, 64, device=device, dtype=dtype)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), q.float(), q.float(), is_causal=True)
    out = {name.lower(): _sdpa_once(getattr(SDPBackend, name), q, ref) for name in SDPA_BACKENDS}
    if importlib.util.find_spec("flash_attn") is None:
        out["fa2"] = {"ok": False, "note": "flash-attn not installed"}
    elif device == "cpu":
        out["fa2"] = {"ok": False, "note": "a GPU kernel"}
    else:
        out["fa2"] = _fa2_once(q, ref)
    return out


def _fa2_once(q: Any, ref: Any) -> dict[str, Any]:
    import importlib

    try:
        flash_attn_func = importlib.import_module("flash_attn").flash_attn_func
        x = q.transpose(1, 2).contiguous().requires_grad_(True)  # (batch, seq, heads, dim)
        got = flash_attn_func(x, x, x, causal=True)
        got.float().sum().backward()
    except Exception as exc:  # an fa2 that cannot run on this target is the answer
        return {"ok": False, "note": f"{type(exc).__name__}: {exc}"[:200]}
    rel = float((got.detach().transpose(1, 2).float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
    return {"ok": rel < 5e-2, "rel_err": rel}


def attention_words(backends: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{k.replace('_attention', '')} {'ok' if v.get('ok') else 'no'}" for k, v in backends.items())


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
    attention = next((r["attention"] for r in results if r.get("attention")), None)
    if attention:
        data["attention"] = attention  # docs/rocm.md item 9
        seen += f"; attention on {results[0].get('matmul', {}).get('device', '?')}: {attention_words(attention)}"
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
        if rank == 0:
            out["attention"] = attention_backends(device)
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
