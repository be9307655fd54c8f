"""Peak live tensors of a bf16 LoRA step at Llama-3.1-8B's layer width, measured on the CPU.

The issue-35 job (Llama-3.1-8B, LoRA r8 on all 7 linears, micro-batch 2 x 2048 tokens, bf16,
gradient checkpointing) cannot run here whole, but its per-layer memory can: this builds a
random Llama with 8B's layer shapes (hidden 4096, MLP 14336, 32 heads, 8 KV heads) and a few
layers, wraps it the way the training rank does (per-sample SDPA for the padding-free row,
``with_lora_adapter``: fp32 adapters over the bf16 base), and runs real HF Trainer steps under
bf16 autocast while ``cockpit.plan.measure`` counts every live tensor. Beside it, the planner's
tensor peak for the same config: the two must agree, and the difference between layer counts is
what one more layer costs.

Rows, side by side in one process:
  peft cast    PEFT's fp32 copy of every adapted input (what LLaMA-Factory and PEFT do)
  cockpit      the training rank's default (cockpit.train.adapter_input_cast)

    python bench/lora_layer_memory.py                 # 1 and 2 layers, 2 x 2048 tokens
    python bench/lora_layer_memory.py --layers 1 --cutoff 512   # quick
Takes ~35 s per layer and row at 2048 tokens on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

LLAMA_8B_LAYER = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 512,  # the loss is not what this measures (bench/chunked_loss_memory.py does)
    "tie_word_embeddings": False,
    "max_position_embeddings": 8192,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cutoff", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    import torch

    from memory_fit import rank_prepare

    from cockpit.plan import plan
    from cockpit.plan.measure import measure_training_peak
    from cockpit.train.trainer import CockpitTrainer

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    rows = []
    print(f"{'layers':>6} {'row':10} {'measured MiB':>12} {'planned MiB':>11} {'error %':>8} {'s':>5}")
    for layers in args.layers:
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump({**LLAMA_8B_LAYER, "num_hidden_layers": layers}, f)
            run_cfg = {
                "model_name_or_path": folder,
                "finetuning_type": "lora",
                "lora_rank": 8,
                "lora_alpha": 16,
                "lora_target": "all",
                "bf16": True,
                "gradient_checkpointing": True,
                "per_device_train_batch_size": args.micro_batch,
                "cutoff_len": args.cutoff,
            }
            planned = plan(run_cfg).estimate.tensor_peak
            for name, skip in (("peft cast", False), ("cockpit", True)):
                t0 = time.time()
                measured = measure_training_peak(
                    folder, run_cfg, steps=2, prepare=rank_prepare(run_cfg, skip), trainer_class=CockpitTrainer
                )
                row = {
                    "layers": layers,
                    "row": name,
                    "measured_mib": round(measured["peak_bytes"] / 2**20, 1),
                    "planned_mib": round(planned / 2**20, 1),
                    "seconds": round(time.time() - t0, 1),
                }
                row["error_pct"] = round(100 * (row["planned_mib"] / row["measured_mib"] - 1), 1)
                rows.append(row)
                print(
                    f"{layers:>6} {name:10} {row['measured_mib']:>12.1f} {row['planned_mib']:>11.1f} "
                    f"{row['error_pct']:>+8.1f} {row['seconds']:>5.0f}",
                    flush=True,
                )
    by = {(r["layers"], r["row"]): r["measured_mib"] for r in rows}
    for layers in args.layers:
        print(f"{layers} layer(s): the fp32 input copies cost {by[(layers, 'peft cast')] - by[(layers, 'cockpit')]:.1f} MiB")
    if len(args.layers) > 1:
        a, b = args.layers[0], args.layers[-1]
        per = (by[(b, "cockpit")] - by[(a, "cockpit")]) / (b - a)
        print(f"one more layer (weights + its saved input + adapter states): {per:.1f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
