"""Issue 35's job for real: Llama-3.1-8B's shapes, LoRA r8 on all linear layers, micro-batch 2 x 2048
tokens, bf16, gradient checkpointing, run by ``cockpit train`` on a GPU, beside ``cockpit plan``.

The weights are random (no hub here), the shapes are Llama-3.1-8B's (the planner's catalogue entry,
128,256-token vocabulary, untied head). Every sample is longer than cutoff_len, so every micro-batch
holds 4096 trained tokens: the planner's worst case. Per variant it reports what the planner says
(allocated: the tensors alone; peak: with the runtime's context) beside what the run's own step
events measured (``max_memory_allocated`` and ``memory_reserved`` of the rank), tokens/s and MFU.

Variants (``--variants``, comma-separated):
  lora        the job with Cockpit's defaults (chunked loss, input embedding in host memory)
  unsloth_gc  the same with ``use_unsloth_gc: true`` (checkpoints offloaded to host memory)
  qlora       the same over a 4-bit NF4 base (``quantization_bit: 4``; needs bitsandbytes)
Levers, each alone on top of the defaults (issue 53: the defaults are chosen by this table, measured):
  liger       ``enable_liger_kernel: true`` (Liger's RMSNorm, SwiGLU, RoPE, fused linear cross-entropy; needs
              liger-kernel and Triton on a GPU)
  compile     ``torch_compile: true`` (each decoder layer compiled alone; the warm-up steps' time is left out of
              tokens/s as every run's first steps are)
  fused_adamw ``optim: adamw_torch_fused``
  no_gc       ``gradient_checkpointing: false`` (no recompute: more memory, fewer FLOPs)

    python bench/gpu_8b_job.py --out /tmp/job8b --json job8b.json        # on a GPU, ~1 min a variant
    python bench/gpu_8b_job.py --out /tmp/job8b --variants lora,levers   # the defaults and each lever alone
    python bench/gpu_8b_job.py --out /tmp/jt --shape tiny --cpu           # the same flow on the CPU (fp32)
    python bench/gpu_8b_job.py --out /tmp/jt --shape tiny --dry-run       # all but the training: plans, table
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TINY = {
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
VARIANTS = {
    "lora": {},
    "unsloth_gc": {"use_unsloth_gc": True},
    "qlora": {"quantization_bit": 4},
    "liger": {"enable_liger_kernel": True},
    "compile": {"torch_compile": True},
    "fused_adamw": {"optim": "adamw_torch_fused"},
    "no_gc": {"gradient_checkpointing": False},
}
LEVERS = "liger,compile,fused_adamw,no_gc"


def model_config(shape: str) -> dict:
    from cockpit.plan.catalogue import CATALOGUE

    config = dict(CATALOGUE["meta-llama/Llama-3.1-8B-Instruct"])
    if shape == "tiny":
        config.update(TINY, max_position_embeddings=4096)
    return config


def build_model(folder: Path, shape: str, tokenizer_dir: str, device: str) -> None:
    """A random bf16 model of ``shape`` saved in ``folder`` with the tokenizer of ``tokenizer_dir``
    (its ids are below the model's vocabulary, as for any padded vocabulary)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if (folder / "config.json").exists():
        return
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    spec = model_config(shape)
    model_type = spec.pop("model_type")
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = AutoConfig.for_model(model_type, **spec, **ids)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model


def write_data(folder: Path, rows: int, words: int) -> None:
    """``rows`` alpaca samples of ``words`` random lower-case words each: every one longer than 2048
    tokens, so truncation leaves each sample exactly cutoff_len long."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    with open(folder / "long.jsonl", "w") as f:
        for _ in range(rows):
            text = " ".join(
                "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8)))
                for _ in range(words)
            )
            f.write(json.dumps({"instruction": "Repeat the words.", "output": text}) + "\n")
    (folder / "dataset_info.json").write_text(json.dumps({"long": {"file_name": "long.jsonl"}}))


def job_yaml(path: Path, model: Path, data: Path, steps: int, cpu: bool, extra: dict) -> Path:
    import yaml

    cfg = {
        "model_name_or_path": str(model),
        "template": "chatml",
        "stage": "sft",
        "finetuning_type": "lora",
        "lora_rank": 8,
        "lora_alpha": 16,
        "lora_target": "all",
        "dataset": "long",
        "dataset_dir": str(data),
        "cutoff_len": 2048,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "gradient_checkpointing": True,
        # bf16 on a GPU; the CPU flow check trains in fp32 (bf16 on a CPU without AMX takes minutes a
        # step at this vocabulary: the tiny shape never finished 2 steps in 240 s on a loaded CI box)
        "bf16": not cpu,
        "learning_rate": 1.0e-4,
        "max_steps": steps,
        "logging_steps": 1,
        "save_steps": 10000,
        "use_cpu": cpu,
        **extra,
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def cockpit(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cockpit.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=str(ROOT)
    )


def planned(cfg: Path) -> dict:
    done = cockpit("plan", str(cfg), "--json", timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"cockpit plan failed: {done.stderr[-2000:]}")
    doc = json.loads(done.stdout)
    return {
        "planned_allocated_gib": round(doc["tensor_peak_bytes"] / 2**30, 2),
        "planned_peak_gib": doc["peak_gib"],
        "planned_host_gib": round((doc.get("host_bytes_per_rank") or 0) / 2**30, 2),
    }


def trained(cfg: Path, runs: Path, timeout: float) -> dict:
    """``cockpit train`` (detached, as a user starts it), then the figures its run directory holds."""
    started = cockpit("train", str(cfg), "--runs-dir", str(runs), "--detach", "--json", timeout=300)
    if started.returncode != 0:
        return {"state": "not started", "error": (started.stderr or started.stdout)[-2000:]}
    run = Path(json.loads(started.stdout)["run_dir"])
    deadline = time.time() + timeout
    state = None
    while time.time() < deadline:
        state = json.loads((run / "status.json").read_text()).get("state")
        if state in ("finished", "failed", "stopped", "lost"):
            break
        time.sleep(2)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]
    steps = [e for e in events if e["kind"] == "step"]
    mem = [(e.get("mem") or {}).get("0") or {} for e in steps]
    timed = [e for e in steps if not e.get("warmup")]
    log = run / "logs" / "rank0.log"
    log_text = log.read_text(errors="replace") if log.exists() else ""
    out = {
        "state": state,
        "run_dir": str(run),
        "steps": len(steps),
        "losses": [e.get("loss") for e in steps],
        "measured_max_allocated_gib": _gib(max((m.get("peak_mb") or 0) for m in mem) if mem else None),
        "measured_max_reserved_gib": _gib(max((m.get("reserved_mb") or 0) for m in mem) if mem else None),
        "capacity_gib": _gib(mem[-1].get("capacity_mb") if mem else None),
        "tokens_per_s_per_device": _median(e.get("tokens_per_s_per_device") for e in timed),
        "mfu": _median(e.get("mfu") for e in timed),
        "hfu": _median(e.get("hfu") for e in timed),
        "host_embedding_line": next((ln.strip() for ln in log_text.splitlines() if "input embedding" in ln), None),
    }
    if state != "finished":
        out["log_tail"] = log_text[-3000:]
        alerts = [e for e in events if e["kind"] in ("alert", "summary", "run_failed")]
        out["alerts"] = alerts[-3:]
    return out


def not_trained(cfg: Path, runs: Path) -> dict:
    """``--dry-run``: the command ``trained`` would run, not run (a lent GPU's minutes are for the GPU work)."""
    argv = [sys.executable, "-m", "cockpit.cli", "train", str(cfg), "--runs-dir", str(runs), "--detach", "--json"]
    return {"state": "dry run", "train_command": " ".join(argv)}


def _gib(mb: float | None) -> float | None:
    return round(mb / 1024, 2) if mb else None


def _median(values) -> float | None:
    got = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(got), 4) if got else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="a working folder (the model, data, runs)")
    ap.add_argument("--shape", choices=("8b", "tiny"), default="8b")
    ap.add_argument("--cpu", action="store_true", help="train on the CPU (the tiny shape: a check of the flow)")
    ap.add_argument("--variants", default="lora,unsloth_gc,qlora")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the embedded model's)")
    ap.add_argument("--run-timeout", type=float, default=240.0)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="every step but the training: model, data, each variant's YAML (the GPU's: bf16, use_cpu false) and its "
        "plan, the table; the train command printed (scripts/gpu_lent.sh --cpu-dry-run, on the CPU)",
    )
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = args.tokenizer
    if tokenizer is None:
        from cockpit.models.embedded import ensure_embedded_model

        tokenizer = str(ensure_embedded_model(log=lambda *_: None))
    import torch

    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    t0 = time.time()
    build_model(out / f"model-{args.shape}", args.shape, tokenizer, device)
    write_data(out / "data", rows=2 * args.steps + 8, words=1500)
    print(
        f"model and data ready in {time.time() - t0:.0f} s ({device}: "
        f"{torch.cuda.get_device_name(0) if device == 'cuda' else 'cpu'})",
        flush=True,
    )
    rows = []
    for name in args.variants.replace("levers", LEVERS).split(","):
        on_cpu = device == "cpu" and not args.dry_run  # a dry run writes and plans the GPU's YAML
        cfg = job_yaml(
            out / f"{name}.yaml", out / f"model-{args.shape}", out / "data", args.steps, on_cpu, VARIANTS[name]
        )
        t0 = time.time()
        ran = not_trained(cfg, out / "runs") if args.dry_run else trained(cfg, out / "runs", args.run_timeout)
        row = {"variant": name, "shape": args.shape, **planned(cfg), **ran}
        row["seconds"] = round(time.time() - t0, 1)
        if row.get("measured_max_allocated_gib"):
            row["allocated_error_pct"] = round(
                100 * (row["planned_allocated_gib"] / row["measured_max_allocated_gib"] - 1), 1
            )
        if row.get("measured_max_reserved_gib"):
            row["peak_error_pct"] = round(100 * (row["planned_peak_gib"] / row["measured_max_reserved_gib"] - 1), 1)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("log_tail", "losses")}), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print(
        f"{'variant':11} {'plan alloc':>10} {'measured':>9} {'err %':>6} {'plan peak':>9} {'reserved':>9} "
        f"{'tok/s':>8} {'MFU':>6} state"
    )
    for r in rows:
        print(
            f"{r['variant']:11} {r['planned_allocated_gib']:>10} {r.get('measured_max_allocated_gib')!s:>9} "
            f"{r.get('allocated_error_pct')!s:>6} {r['planned_peak_gib']:>9} {r.get('measured_max_reserved_gib')!s:>9} "
            f"{r.get('tokens_per_s_per_device')!s:>8} {r.get('mfu')!s:>6} {r['state']}"
        )
    return 0 if all(r["state"] == ("dry run" if args.dry_run else "finished") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
