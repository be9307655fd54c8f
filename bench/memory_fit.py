"""Validate the memory planner against real training steps on this CPU.

For each point of a grid (tiny random Llama and the SmolLM2-135M size; LoRA / full; gradient
checkpointing off / on; micro-batch 1 / 4; cutoff 128 / 512) this runs the training rank's
``CockpitTrainer`` (its chunked loss on labelled positions) over the rank's model (per-sample SDPA
for padding-free rows, its LoRA adapter) and HF's training loop (forward with labels, backward,
fused AdamW step, grad clipping; fp32 on CPU), and measures
the peak of live tensor bytes with ``cockpit.plan.measure.live_tensor_bytes``: a
TorchDispatchMode that sees every op below autograd (forward, the backward the engine runs,
the optimizer) and counts each output's storage once, freed when a weakref on the storage
fires. It then compares with the planner's tensor peak (the prediction without the GPU runtime
overhead term, which has no CPU counterpart).

The first optimizer step runs on 16-token sequences: it creates the AdamW states cheaply; the
second step, at full length, carries them, as every step after the first does in a real run.

    python bench/memory_fit.py            # full grid (32 points)
    python bench/memory_fit.py --quick    # tiny grid + 4 SmolLM2 points
    python bench/memory_fit.py --smoke    # two tiny points: the suite's check that it runs
Exit 1 if any point is off by more than --tolerance (15 %).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 32000,
        "tie_word_embeddings": False, "max_position_embeddings": 2048}
SMOL_DIR = "/tmp/smol"


def model_sources(tmp: str) -> dict[str, str]:
    tiny_dir = os.path.join(tmp, "tiny-llama")
    os.makedirs(tiny_dir, exist_ok=True)
    with open(os.path.join(tiny_dir, "config.json"), "w") as f:
        json.dump(TINY, f)
    smol = SMOL_DIR if os.path.isfile(os.path.join(SMOL_DIR, "config.json")) else None
    if smol is None:  # random init from the catalogue numbers
        from cockpit.plan.catalogue import SMOLLM2_135M

        smol = os.path.join(tmp, "smollm2-135m")
        os.makedirs(smol, exist_ok=True)
        with open(os.path.join(smol, "config.json"), "w") as f:
            json.dump(SMOLLM2_135M, f)
    return {"tiny": tiny_dir, "smollm2": smol}


def rank_prepare(run_cfg: dict, skip_cast: bool = True):
    """The training rank's model over a base (``cockpit.train.model.over_base``); ``skip_cast``
    False: PEFT's fp32 copy of each adapted input is kept (as PEFT and LLaMA-Factory run)."""
    from cockpit.config.run_config import RunConfig
    from cockpit.config.schema import default_config
    from cockpit.train.model import over_base

    return over_base(RunConfig.from_mapping({**default_config(), **run_cfg}), peft_input_cast=not skip_cast)


def grid(quick: bool, smoke: bool = False) -> list[tuple[str, str, bool, int, int]]:
    if smoke:  # the suite's check that the script runs: two tiny points (an activations peak, a gradients peak)
        return [("tiny", "lora", False, 1, 128), ("tiny", "full", True, 1, 128)]
    pts = []
    for model in ("tiny", "smollm2"):
        for ft, ck, mb, s in itertools.product(("lora", "full"), (False, True), (1, 4), (128, 512)):
            if quick and model == "smollm2" and (mb, s) != (1, 128):
                continue
            pts.append((model, ft, ck, mb, s))
    return pts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny grid + SmolLM2 at micro-batch 1, cutoff 128")
    ap.add_argument("--smoke", action="store_true", help="two tiny points: that the script runs (the suite)")
    ap.add_argument("--tolerance", type=float, default=15.0, help="allowed |error| in percent")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    import torch

    from cockpit.plan import plan
    from cockpit.plan.measure import measure_training_peak
    from cockpit.train.trainer import CockpitTrainer

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    rows = []
    t_all = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        srcs = model_sources(tmp)
        hdr = f"{'model':8} {'method':5} {'ckpt':4} {'mb':>2} {'cutoff':>6}  {'predicted MB':>12} {'measured MB':>11} {'error %':>8}  {'peak moment':<26} {'s':>5}"
        print(hdr)
        print("-" * len(hdr))
        for model, ft, ck, mb, s in grid(args.quick, args.smoke):
            cfg = {"model_name_or_path": srcs[model], "finetuning_type": ft, "gradient_checkpointing": ck,
                   "per_device_train_batch_size": mb, "cutoff_len": s, "lora_rank": 8, "lora_alpha": 16,
                   "lora_target": "all"}
            t0 = time.time()
            meas = measure_training_peak(
                srcs[model], cfg, steps=2, prepare=rank_prepare(cfg), trainer_class=CockpitTrainer
            )["peak_bytes"]
            est = plan(cfg).estimate
            pred = est.tensor_peak
            err = 100.0 * (pred / meas - 1.0)
            row = {"model": model, "finetuning_type": ft, "gradient_checkpointing": ck, "micro_batch": mb,
                   "cutoff_len": s, "predicted_mb": round(pred / 2**20, 2), "measured_mb": round(meas / 2**20, 2),
                   "error_pct": round(err, 2), "moment": est.moment, "seconds": round(time.time() - t0, 1)}
            rows.append(row)
            print(f"{model:8} {ft:5} {'on' if ck else 'off':4} {mb:>2} {s:>6}  {row['predicted_mb']:>12.1f} "
                  f"{row['measured_mb']:>11.1f} {err:>+8.1f}  {est.moment[:26]:<26} {row['seconds']:>5.0f}", flush=True)
    worst = max(rows, key=lambda r: abs(r["error_pct"]))
    bad = [r for r in rows if abs(r["error_pct"]) > args.tolerance]
    print(f"\n{len(rows)} points in {time.time() - t_all:.0f} s; worst error {worst['error_pct']:+.1f}% "
          f"({worst['model']} {worst['finetuning_type']} ckpt={worst['gradient_checkpointing']} "
          f"mb={worst['micro_batch']} cutoff={worst['cutoff_len']}); "
          f"{len(bad)} outside +-{args.tolerance:g}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
