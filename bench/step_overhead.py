"""Where cockpit's time per training step goes, against a bare HF Trainer, in one process.

    python bench/step_overhead.py [--rounds 2] [--steps 14] [--fp32] [--no-checkpointing] [--model NAME]

Issue 16's job (LoRA r8 on all linear layers, bf16 autocast, gradient checkpointing, cutoff 256,
micro-batch 4, on the CPU) on the embedded SmolLM2-135M-Instruct and cockpit's demo data, trained
by four trainers that add cockpit's parts one at a time:

  bare       Trainer + DataCollatorForSeq2Seq, the TrainingArguments a short script would write
  +args      Trainer with cockpit's TrainingArguments (``train/arguments.py``: token counting, ...)
  +collator  ... and cockpit's collator (``data/packing.py``)
  cockpit    CockpitTrainer + CockpitCallback writing events into a run dir (what a rank runs)

Every variant trains a fresh adapter (same seed) on the same rows in the same order; the time per
step is the median of the steps after the first two (warm-up). The variants run alternately,
``--rounds`` times. Ratios to ``bare`` are the result (above 1: slower than bare).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jobs import DEMO_LORA_JOB  # noqa: E402

VARIANTS = ("bare", "+args", "+collator", "cockpit")


def job(a: argparse.Namespace):
    """The job as a validated RunConfig (``a.model``: the embedded model unless a folder is named)."""
    from cockpit.config import validate

    raw = dict(DEMO_LORA_JOB, model_name_or_path=getattr(a, "model", None) or "smollm2-135m-instruct", lora_rank=8, lora_alpha=16, per_device_train_batch_size=4,
               gradient_accumulation_steps=1, max_steps=a.steps, logging_steps=5, bf16=not a.fp32,
               gradient_checkpointing=not a.no_checkpointing, telemetry_interval_s=0)
    return validate(raw)


def step_times(trainer) -> list[float]:
    from transformers import TrainerCallback

    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if not marks:
                marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

    trainer.add_callback(Clock())
    trainer.train()
    return [b - a for a, b in zip(marks, marks[1:])]


def build(variant: str, cfg, ref, tok, rows: list[dict], tmp: Path):
    import torch
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    from cockpit.data.packing import build_collator
    from cockpit.train.arguments import ListDataset, training_arguments
    from cockpit.train.model import build_model

    model = build_model(cfg, ref, True, 0)

    class InOrder(Trainer):
        def _get_train_sampler(self, *a, **k):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    plain_collator = DataCollatorForSeq2Seq(tok, padding=True, label_pad_token_id=-100)
    if variant == "bare":
        args = TrainingArguments(output_dir=str(tmp / variant), per_device_train_batch_size=4, learning_rate=1e-3,
                                 max_steps=cfg.max_steps, bf16=cfg.bf16, gradient_checkpointing=cfg.gradient_checkpointing,
                                 gradient_checkpointing_kwargs={"use_reentrant": False}, save_strategy="no", report_to=[],
                                 use_cpu=True, seed=cfg.seed, remove_unused_columns=False, disable_tqdm=True, logging_steps=5)
        return InOrder(model=model, args=args, train_dataset=ListDataset(rows), data_collator=plain_collator)
    args = training_arguments(cfg, {"checkpoints": tmp / variant}, True, 1)
    collator = plain_collator if variant == "+args" else build_collator(cfg, tok, model)
    if variant in ("+args", "+collator"):
        return InOrder(model=model, args=args, train_dataset=ListDataset(rows), data_collator=collator)
    from cockpit.store.events import EventWriter
    from cockpit.store.rundir import create_run_dir
    from cockpit.train.callbacks import CockpitCallback
    from cockpit.train.trainer import CockpitTrainer

    class CockpitInOrder(CockpitTrainer):
        def _get_train_sampler(self, *a, **k):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    run = create_run_dir(tmp / "runs", f"bench-{len(list((tmp).glob('runs/*')))}")
    writer = EventWriter(run.events_path)
    callback = CockpitCallback(run, cfg, 0, 1, writer)
    return CockpitInOrder(model=model, args=args, train_dataset=ListDataset(rows), data_collator=collator, callbacks=[callback])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--fp32", action="store_true", help="fp32 instead of bf16 autocast")
    ap.add_argument("--no-checkpointing", action="store_true")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a model name or folder (the suite: a tiny random Llama)")
    a = ap.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from cockpit.data.prepare import prepare_dataset
    from cockpit.models.resolve import load_tokenizer, resolve_model

    cfg = job(a)
    ref = resolve_model(cfg.model_name_or_path)
    tok = load_tokenizer(cfg, ref)
    rows = [{"input_ids": r.input_ids, "labels": r.labels} for r in prepare_dataset(cfg, tok).rendered if r.target_kept > 0]
    print(f"job: LoRA r8 all-linear, {'fp32' if a.fp32 else 'bf16'}, checkpointing {not a.no_checkpointing}, "
          f"cutoff {cfg.cutoff_len}, batch 4, {a.steps} steps, {len(rows)} rows, torch threads {__import__('torch').get_num_threads()}")
    per: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
            for v in order:
                times = step_times(build(v, cfg, ref, tok, rows, Path(tmp)))
                per[v].append(statistics.median(times[2:]))
                print(f"round {r + 1} {v:10s} {per[v][-1]:.3f} s/step", flush=True)
    bare = statistics.median(per["bare"])
    print("\nvariant     s/step (median of rounds)   / bare")
    for v in VARIANTS:
        m = statistics.median(per[v])
        print(f"{v:10s}  {m:.3f}                       {m / bare:.3f}")


if __name__ == "__main__":
    main()
