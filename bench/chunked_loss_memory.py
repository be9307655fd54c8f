"""Peak memory of one training step with the full fp32 logits vs the chunked LM loss, on the CPU.

    python bench/chunked_loss_memory.py [--vocab 128256] [--tokens 2048] [--hidden 256] [--layers 2]

A small random Llama (fp32, untied head) with a large vocabulary, one row of ``--tokens`` tokens
(micro-batch 1, every position labelled: a pretraining row or a long answer, where the logits are
largest), full fine-tuning, one forward + backward through ``CockpitTrainer.training_step``: with
``chunked_loss`` off (today's path: the model's own loss on the full logits) and on
(``cockpit/train/chunked_loss.py``). Each variant runs in its own process and reports:

- the step's peak of live tensor bytes above what was alive before it (``cockpit/plan/measure.py``'s
  tracker: every storage an ATen op returns, forward and backward);
- the step's peak resident memory above the resident memory before it (``VmHWM`` reset through
  ``/proc/self/clear_refs`` right before the step, minus ``VmRSS``).

Prints both variants, their ratio, and the planner's logits term (``cockpit/plan/estimate.py``:
12 B x vocab x tokens) beside the measured saving.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def one(a: argparse.Namespace) -> dict:
    """One variant, in this process."""
    sys.path.insert(0, str(ROOT))
    import gc

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

    from cockpit.plan.measure import live_tensor_bytes
    from cockpit.train.trainer import CockpitTrainer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=2 * a.hidden,
                      num_hidden_layers=a.layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=a.tokens, tie_word_embeddings=False, use_cache=False)  # fmt: skip
    model = LlamaForCausalLM(cfg).train()
    ids = torch.randint(3, a.vocab, (1, a.tokens))
    batch = {"input_ids": ids, "labels": ids.clone()}
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=1, max_steps=1, report_to=[],
                                 use_cpu=True, disable_tqdm=True, save_strategy="no")  # fmt: skip
        trainer = CockpitTrainer(model=model, args=args)
        trainer.chunked_loss = a.variant == "chunked"
        trainer.create_optimizer()
        trainer.current_gradient_accumulation_steps = 1  # set by the training loop, which this step skips
        gc.collect()
        mode = live_tensor_bytes()
        with mode:
            mode.track_existing(list(model.parameters()) + list(model.buffers()) + list(batch.values()))
            before = mode.live
            mode.reset_peak()
            rss_before = _status("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            t0 = time.perf_counter()
            loss = trainer.training_step(model, dict(batch))
            seconds = time.perf_counter() - t0
            hwm = _status("VmHWM")
        chunked = trainer._chunked_head not in (None, False)
        assert chunked == (a.variant == "chunked"), trainer.chunked_loss_why_not
    return {
        "variant": a.variant,
        "live_peak_bytes": mode.peak - before,
        "rss_peak_bytes": hwm - rss_before,
        "seconds": round(seconds, 2),
        "loss": float(loss),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--variant", choices=["full", "chunked"], help=argparse.SUPPRESS)  # one variant, in-process
    a = ap.parse_args()
    if a.variant:
        print(json.dumps(one(a)))
        return
    results = {}
    for variant in ("full", "chunked"):
        cmd = [sys.executable, __file__, "--variant", variant, "--vocab", str(a.vocab), "--tokens", str(a.tokens),
               "--hidden", str(a.hidden), "--layers", str(a.layers)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
        if done.returncode:
            sys.exit(f"{variant} failed:\n{done.stderr[-3000:]}")
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    full, chunked = results["full"], results["chunked"]
    print(f"random Llama: vocab {a.vocab}, hidden {a.hidden}, {a.layers} layers, fp32, full fine-tuning; "
          f"1 row x {a.tokens} tokens, every position labelled; one forward + backward")  # fmt: skip
    for name, r in results.items():
        print(f"  {name:8s} live tensors peak {r['live_peak_bytes'] / MiB:8.0f} MiB   resident peak "
              f"{r['rss_peak_bytes'] / MiB:8.0f} MiB   {r['seconds']:6.2f} s   loss {r['loss']:.6f}")  # fmt: skip
    for key, label in (("live_peak_bytes", "live tensors"), ("rss_peak_bytes", "resident")):
        saved = full[key] - chunked[key]
        print(f"  {label}: chunked / full {chunked[key] / full[key]:.3f}, saved {saved / MiB:.0f} MiB")
    planner = 12 * a.vocab * a.tokens
    print(f"  planner's logits term (12 B x vocab x tokens): {planner / MiB:.0f} MiB")
    print(f"  loss |full - chunked| / full: {abs(full['loss'] - chunked['loss']) / abs(full['loss']):.2e}")


if __name__ == "__main__":
    main()
