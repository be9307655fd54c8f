"""Private memory at load, per rank: DDP vs ZeRO-3 vs FSDP2 on the same model, side by side.

    python bench/sharded_load_memory.py [--layers 28] [--hidden 512] [--malloc default,1MiB] [--only zero3,fsdp2] [--dtype bf16] [--trace]

A random Llama (fp32 safetensors; 28 x 512 is about 0.5 GB) is put in an offline HF cache under a
hub id, as the GPU presets name their models, and trained one step on 2 gloo ranks per strategy
through the real CLI. Each rank reports in its ``rank_memory`` event of phase ``loaded`` (the model
built, placed and sharded, before the first step) its sampled RssAnon peak (private memory: what
fills a node) and its VmHWM (which also counts the mapped checkpoint's shared page cache).
``--malloc 1MiB`` runs every strategy again with ``MALLOC_MMAP_THRESHOLD_=1048576`` (glibc's
dynamic threshold otherwise keeps zero.Init's freed full-size construction tensors in the heap).
Prints MiB per rank and the saving vs DDP as a share of the model. ``--trace`` also prints each
rank's RssAnon (now, and its peak so far) at the load's steps (``cockpit.train.private_memory.trace``).
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

ROOT = Path(__file__).resolve().parent.parent
HUB_ID = "cockpit-bench/llama-random"
COMMIT = "b" * 40
STRATEGIES = {
    "ddp": {},
    "zero3": {"zero_stage": 3},
    "fsdp2": {"fsdp": "full_shard auto_wrap"},
}


def write_model(out: Path, layers: int, hidden: int, dtype: str = "fp32") -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from cockpit.models.embedded import ensure_embedded_model

    tok = AutoTokenizer.from_pretrained(str(ensure_embedded_model(log=lambda *_: None)))
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    snap = out / ("models--" + HUB_ID.replace("/", "--")) / "snapshots" / COMMIT
    model = LlamaForCausalLM(cfg)
    (model.to(torch.bfloat16) if dtype == "bf16" else model).save_pretrained(snap)
    tok.save_pretrained(snap)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text(COMMIT)
    return snap


def run_one(tmp: Path, name: str, keys: dict, env: dict, trace: bool = False) -> dict[int, dict]:
    cfg = {
        "model_name_or_path": HUB_ID,
        "dataset": "cockpit_identity",
        "use_cpu": True,
        "finetuning_type": "lora",
        "nproc_per_node": 2,
        "per_device_train_batch_size": 1,
        "max_steps": 1,
        "cutoff_len": 32,
        "probes": None,
        "save_strategy": "no",
        "logging_steps": 1,
        "telemetry_interval_s": 0,
        "numa_bind": "off",
        "comm_probe": False,
        "env": env,
        **keys,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp / f"runs-{name}"
    full_env = {**os.environ, **env, "OMP_NUM_THREADS": "1"}
    trace_file = tmp / f"{name}.trace"
    if trace:
        full_env["COCKPIT_TRACE_RSS"] = str(trace_file)
    res = subprocess.run(
        [sys.executable, "-m", "cockpit.cli", "train", str(path), "--runs-dir", str(runs)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=str(ROOT),
        timeout=1800,
    )
    if res.returncode != 0:
        raise SystemExit(f"{name}: exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    if trace and trace_file.exists():
        print(f"\n{name}: RssAnon at the load's steps (MiB)\n" + trace_file.read_text(), end="")
    run = next(d for d in runs.iterdir() if d.is_dir())
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]
    return {e["rank"]: e for e in events if e["kind"] == "rank_memory" and e["phase"] == "loaded"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--malloc", default="default", help="comma list of default | 1MiB")
    ap.add_argument("--only", default=",".join(STRATEGIES), help="comma list of " + " | ".join(STRATEGIES))
    ap.add_argument(
        "--dtype",
        default="fp32",
        choices=("fp32", "bf16"),
        help="the checkpoint's dtype; bf16 (as hub models ship) is read into the fp32 CPU run: every rank converts",
    )
    ap.add_argument("--trace", action="store_true", help="print each rank's RssAnon at the load's steps")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cockpit-bench-load-") as d:
        tmp = Path(d)
        snap = write_model(tmp / "hub", a.layers, a.hidden, a.dtype)
        model_mb = sum(f.stat().st_size for f in snap.glob("*.safetensors")) / 2**20
        if a.dtype == "bf16":
            model_mb *= 2  # what a rank holds: the fp32 model it trains
        print(f"model: {model_mb:.0f} MiB in fp32 ({a.dtype} safetensors), {a.layers} layers x {a.hidden}; 2 gloo ranks, LoRA")
        for malloc in a.malloc.split(","):
            env = {"HF_HUB_CACHE": str(tmp / "hub"), "HF_HUB_OFFLINE": "1"}
            if malloc == "1MiB":
                env["MALLOC_MMAP_THRESHOLD_"] = str(2**20)
            chosen = {"ddp", *a.only.split(",")}  # the savings are against DDP
            got = {
                name: run_one(tmp, f"{name}-{malloc}", keys, env, a.trace) for name, keys in STRATEGIES.items() if name in chosen
            }
            print(
                f"\nmalloc: {malloc}  (MiB at 'loaded'; saved = DDP's RssAnon peak - this one's, as a share of the model)"
            )
            print(f"{'strategy':9} {'rank':>4} {'RssAnon peak':>13} {'VmHWM':>8} {'saved':>8}")
            for name, ranks in got.items():
                for rank in sorted(ranks):
                    anon, hwm = ranks[rank]["rss_anon_peak_mb"], ranks[rank]["vmhwm_mb"]
                    saved = (got["ddp"][rank]["rss_anon_peak_mb"] - anon) / model_mb
                    print(f"{name:9} {rank:>4} {anon:>13.0f} {hwm:>8.0f} {saved:>7.0%}")


if __name__ == "__main__":
    main()
