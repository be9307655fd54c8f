"""Cockpit vs a plain HF Trainer + PEFT script on the same LoRA job, run alternately.

    python bench/throughput.py [--rounds 2] [--steps 12] [--model smollm2-135m-instruct]
    python bench/throughput.py --telemetry      # cockpit with telemetry at 1 Hz vs off

Both sides train the same model, data (the rendered demo set), cutoff, micro-batch, steps and
dtype (fp32 on CPU). Cockpit goes through the real CLI (`cockpit train`: preflight, detached
supervisor, events, telemetry at 1 Hz); the plain side is a bare Trainer in this process'
child. Throughput for both = non-padding tokens seen / Trainer's train time, so model loading
and process start-up are excluded on both sides. Prints tokens/s per round and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from jobs import DEMO_LORA_JOB  # bench/jobs.py (scripts run as `python bench/NAME.py`)

ROOT = Path(__file__).resolve().parent.parent

JOB = dict(DEMO_LORA_JOB, per_device_train_batch_size=4, gradient_accumulation_steps=1, logging_steps=2)

PLAIN = r'''
import json, sys, time, torch, yaml
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer, TrainingArguments
from cockpit.config import load_config
from cockpit.data.prepare import prepare_dataset
from cockpit.models.resolve import resolve_model

cfg = load_config(sys.argv[1])
ref = resolve_model(cfg.model_name_or_path)
tok = AutoTokenizer.from_pretrained(ref.path)
rows = [{"input_ids": r.input_ids, "labels": r.labels} for r in prepare_dataset(cfg, tok).rendered]
model = AutoModelForCausalLM.from_pretrained(ref.path, dtype=torch.float32)
model = get_peft_model(model, LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules="all-linear", task_type="CAUSAL_LM"))
args = TrainingArguments(output_dir=sys.argv[2], per_device_train_batch_size=cfg.per_device_train_batch_size,
    learning_rate=cfg.learning_rate, lr_scheduler_type="constant", max_steps=cfg.max_steps, logging_steps=cfg.logging_steps,
    save_strategy="no", report_to=[], use_cpu=True, seed=cfg.seed, data_seed=cfg.seed, remove_unused_columns=False,
    include_num_input_tokens_seen="non_padding", disable_tqdm=True)
class DS(torch.utils.data.Dataset):
    def __len__(self): return len(rows)
    def __getitem__(self, i): return rows[i]
trainer = Trainer(model=model, args=args, train_dataset=DS(), data_collator=DataCollatorForSeq2Seq(tok, padding=True, label_pad_token_id=-100))
t = time.time(); trainer.train(); dt = time.time() - t
print(json.dumps({"tokens": trainer.state.num_input_tokens_seen, "seconds": dt}))
'''


def run_cockpit(cfg_path: Path, runs: Path) -> float:
    res = subprocess.run([sys.executable, "-m", "cockpit.cli", "train", str(cfg_path), "--runs-dir", str(runs)], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"cockpit train failed:\n{res.stdout}\n{res.stderr}")
    run = max((d for d in runs.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    summary = json.loads((run / "summary.json").read_text())
    return summary["tokens_seen"] / summary["train_runtime_s"]


def run_plain(cfg_path: Path, out: Path) -> float:
    res = subprocess.run([sys.executable, "-c", PLAIN, str(cfg_path), str(out)], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"plain trainer failed:\n{res.stderr[-3000:]}")
    data = json.loads(res.stdout.strip().splitlines()[-1])
    return data["tokens"] / data["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--telemetry", action="store_true", help="compare cockpit with telemetry at 1 Hz against telemetry off")
    a = ap.parse_args()
    import yaml

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cfg = dict(JOB, model_name_or_path=a.model, max_steps=a.steps)
        cfg_path = tmp / "job.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        if a.telemetry:
            off_path = tmp / "job-off.yaml"
            off_path.write_text(yaml.safe_dump(dict(cfg, telemetry_interval_s=0)))
            on_path = tmp / "job-on.yaml"
            on_path.write_text(yaml.safe_dump(dict(cfg, telemetry_interval_s=1.0)))
            first, second = (lambda: run_cockpit(on_path, tmp / "runs")), (lambda: run_cockpit(off_path, tmp / "runs"))
            names = ("telemetry 1 Hz", "telemetry off")
        else:
            first, second = (lambda: run_cockpit(cfg_path, tmp / "runs")), (lambda: run_plain(cfg_path, tmp / "plain"))
            names = ("cockpit", "plain HF Trainer+PEFT")
        ours, plain = [], []
        for r in range(a.rounds):
            ours.append(first())
            plain.append(second())
            print(f"round {r + 1}: {names[0]} {ours[-1]:.1f} tok/s   {names[1]} {plain[-1]:.1f} tok/s   ratio {ours[-1] / plain[-1]:.3f}", flush=True)
        mo, mp = statistics.median(ours), statistics.median(plain)
        print(f"median: {names[0]} {mo:.1f} tok/s, {names[1]} {mp:.1f} tok/s, ratio = {mo / mp:.3f}")

if __name__ == "__main__":
    main()
