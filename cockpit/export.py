"""Export a run: the LoRA adapter as saved (PEFT format), or merged into the base model.

The merged folder is safetensors + tokenizer + chat template, loadable by
``AutoModelForCausalLM.from_pretrained`` and by vLLM. A QLoRA run merges into the
unquantized base weights (never into 4-bit ones). ``cockpit_export.json`` records what the
export was made from.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from cockpit.errors import InputError
from cockpit.rundir import RunDir


def adapter_checksum(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.glob("adapter_model.*")) or sorted(folder.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def export_run(run: RunDir, out: Path | None = None, merge: bool = False, log=print) -> dict[str, Any]:
    import torch

    cfg = yaml.safe_load(run.config_path.read_text(encoding="utf-8"))
    summary = run.read_summary()
    adapter = Path(summary.get("adapter_dir") or run.output_dir() / "adapter")
    if not adapter.is_dir():
        raise InputError(f"{run.run_id} has no saved adapter/model at {adapter} (state: {run.read_status().get('state')})")
    is_lora = (adapter / "adapter_config.json").exists()
    out = Path(out) if out else run.output_dir() / ("merged" if merge else "export")
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out} exists and is not empty; choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    notes: list[str] = []
    try:
        if merge and is_lora:
            from peft import PeftModel
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from cockpit.models.resolve import resolve_model

            ref = resolve_model(cfg["model_name_or_path"], log=log)
            if cfg.get("quantization_bit"):
                notes.append("QLoRA run: the adapter is merged into the unquantized base weights (bf16), not into 4-bit weights")
            dtype = torch.bfloat16 if (cfg.get("bf16") or cfg.get("quantization_bit")) else torch.float32
            base = AutoModelForCausalLM.from_pretrained(ref.path, dtype=dtype, trust_remote_code=bool(cfg.get("trust_remote_code")), **ref.kwargs())
            model = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
            model.save_pretrained(tmp, safe_serialization=True)
            tok = AutoTokenizer.from_pretrained(str(adapter))
            tok.save_pretrained(tmp)
            kind = "merged"
        else:
            shutil.copytree(adapter, tmp, dirs_exist_ok=True)
            kind = "adapter" if is_lora else "model"
            if merge and not is_lora:
                notes.append(f"a {cfg.get('finetuning_type')} run saves the whole model: nothing to merge")
        record = {
            "kind": kind,
            "run_id": run.run_id,
            "base_model": cfg.get("model_name_or_path"),
            "finetuning_type": cfg.get("finetuning_type"),
            "adapter_dir": str(adapter),
            "adapter_sha256": adapter_checksum(adapter) if is_lora else None,
            "template": cfg.get("template"),
            "notes": notes,
        }
        (tmp / "cockpit_export.json").write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    record["path"] = str(out)
    return record
