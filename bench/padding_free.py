"""Padded vs padding-free micro-batches, forward + backward of the same samples, alternated.

    python bench/padding_free.py [--cutoffs 256,1024,2048] [--batch 4] [--synthetic] [--rounds 2] [--bf16] [--model DIR]

The numbers behind ``packing``'s auto rule (``cockpit/data/padding.py``): SmolLM2-135M-Instruct
(the embedded model, fp32), LoRA r8 on all linear layers, one process. Each cutoff builds
5 micro-batches of ``--batch`` samples and times them padded (``DataCollatorForSeq2Seq``, an
attention mask) and padding-free (``DataCollatorWithFlattening``: one row, position ids restarting
per sample, transformers' block-diagonal mask for SDPA) and padding-free with per-sample SDPA
(``cockpit/train/packed_attention.py``: what a rank trains with), alternately, ``--rounds`` times each.
Samples: LLaMA-Factory's ``alpaca_en_demo`` rows (from ``--lf-data``), cut at the cutoff, or with
``--synthetic`` random rows of a quarter to all of the cutoff (long packed rows: the mask's
square growth). ``--bf16``: under bf16 autocast (CPUs with AVX512-BF16 / AMX). Prints the fill
(real / padded tokens) and each padding-free variant's time / the padded time.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LF_DATA = Path("/work/shared/interop/llama-factory/data")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cutoffs", default="256,1024,2048")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--synthetic", action="store_true", help="random rows of cutoff/4 .. cutoff tokens")
    ap.add_argument("--lf-data", type=Path, default=LF_DATA)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (fp32 weights, as a rank on the CPU)")
    ap.add_argument("--model", help="a model folder (default: the embedded SmolLM2; the suite: a tiny random Llama)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, DataCollatorWithFlattening

    from cockpit.data.padding import PACKED_SDPA
    from cockpit.models.embedded import ensure_embedded_model
    from cockpit.train.packed_attention import register

    folder = a.model or str(ensure_embedded_model())
    tok = AutoTokenizer.from_pretrained(folder)
    real_rows: list[list[int]] = []
    if not a.synthetic:
        demo = a.lf_data / "alpaca_en_demo.json"
        if not demo.exists():
            raise SystemExit(f"{demo} missing: pass --lf-data or use --synthetic")
        for r in json.loads(demo.read_text(encoding="utf-8")):
            real_rows.append(tok(f"{r['instruction']}\n{r['input']}\n{r['output']}")["input_ids"])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.config.use_cache = False
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    register()
    variants = {  # name: (collator, attention)
        "padded": (DataCollatorForSeq2Seq(tok, padding=True, label_pad_token_id=-100), "sdpa"),
        "padding-free": (DataCollatorWithFlattening(return_position_ids=True, separator_id=-100), "sdpa"),
        "per-sample": (DataCollatorWithFlattening(return_position_ids=True, separator_id=-100, return_flash_attn_kwargs=True),
                       PACKED_SDPA),
    }

    def step(batch) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = model(**batch).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    print(f"{torch.get_num_threads()} threads; micro-batch {a.batch}; {'synthetic' if a.synthetic else 'alpaca_en_demo'} rows; "
          f"{'bf16 autocast' if a.bf16 else 'fp32'}")
    for cutoff in (int(c) for c in a.cutoffs.split(",")):
        rng = random.Random(0)
        batches = []
        for _ in range(6):
            rows = []
            for _ in range(a.batch):
                if a.synthetic:
                    ids = [rng.randrange(100, tok.vocab_size) for _ in range(rng.randint(cutoff // 4, cutoff))]
                else:
                    ids = rng.choice(real_rows)[:cutoff]
                rows.append({"input_ids": ids, "labels": list(ids)})
            batches.append(rows)
        times = {name: 0.0 for name in variants}
        for _ in range(a.rounds):
            for name, (collate, attention) in variants.items():
                model.base_model.model.set_attn_implementation(attention)
                step(collate(batches[0]))  # warm-up
                t0 = time.perf_counter()
                for rows in batches[1:]:
                    step(collate(rows))
                times[name] += time.perf_counter() - t0
        real = sum(len(r["input_ids"]) for rows in batches[1:] for r in rows)
        padded = sum(max(len(r["input_ids"]) for r in rows) * len(rows) for rows in batches[1:])
        longest = max(sum(len(r["input_ids"]) for r in rows) for rows in batches[1:])
        print(f"cutoff {cutoff}: fill {real / padded:.2f}, longest packed row {longest} tokens | padded "
              f"{times['padded']:.1f} s, padding-free {times['padding-free']:.1f} s, per-sample {times['per-sample']:.1f} s "
              f"| / padded: padding-free {times['padding-free'] / times['padded']:.3f}, per-sample "
              f"{times['per-sample'] / times['padded']:.3f}", flush=True)


if __name__ == "__main__":
    main()
