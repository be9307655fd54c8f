"""``cockpit check`` for the non-SFT stages: the same static / device / model checks as SFT,
then the stage's data read and tokenized the way its trainer will (no model weights loaded).
Imports transformers (the tokenizer) lazily; never imported by the UI process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cockpit.errors import InputError, Problem


def _preview(tokenizer: Any, stage: str, sample: dict[str, Any]) -> dict[str, Any]:
    """The first sample as text pieces (trained or not); pairs also side by side."""
    if stage == "pt":
        return {"source": sample["source"], "pieces": [{"text": sample["text"][:2000], "trained": True}]}
    prompt = tokenizer.apply_chat_template(sample["prompt"], tokenize=False, add_generation_prompt=True)
    answer = sample.get("chosen", sample.get("completion", ""))
    out: dict[str, Any] = {
        "source": sample["source"],
        "pieces": [{"text": prompt, "trained": False}, {"text": answer, "trained": True}],
    }
    if "rejected" in sample:
        out["pair"] = {"chosen": sample["chosen"], "rejected": sample["rejected"]}
    if "label" in sample:
        out["kto_tag"] = sample["label"]
    return out


def check_stage(cfg: Mapping[str, Any], log=print, with_devices: bool = True):
    from cockpit.data.stage_data import collect_stage_samples, prepare_stage_data
    from cockpit.models.resolve import config_model, load_model_config, load_tokenizer
    from cockpit.preflight.checks import CheckResult, device_checks, static_checks

    warnings = static_checks(cfg)
    loaded = collect_stage_samples(cfg)  # every bad row, before any model is loaded
    if with_devices:
        warnings += device_checks(cfg)
    ref = config_model(cfg, log=log)
    tok = load_tokenizer(cfg, ref, log=log)
    hidden = getattr(load_model_config(cfg, ref), "hidden_size", None)
    if cfg["finetuning_type"] == "lora" and hidden and cfg["lora_rank"] > hidden:
        raise InputError(
            Problem(f"lora_rank {cfg['lora_rank']} exceeds the model's hidden size {hidden}", key="lora_rank")
        )
    if cfg["stage"] in ("dpo", "kto", "rm"):
        try:
            import trl  # noqa: F401
        except ImportError:
            raise InputError(
                Problem(f"stage {cfg['stage']} needs TRL: pip install 'trl>=1.16,<2'", key="stage")
            ) from None
    prepared = prepare_stage_data(cfg, tok, loaded)
    if prepared.report.emptied:
        warnings.append(f"cutoff_len {cfg['cutoff_len']}: {prepared.report.lines()[-1].removeprefix('warning: ')}")
    return CheckResult(
        cfg=cfg,
        report=prepared.report,
        formats=loaded.formats,
        bad_rows=loaded.problems,
        warnings=warnings,
        samples=len(prepared.kept),  # what the ranks train on (survives_cutoff)
        model_path=ref.path,
        preview=_preview(tok, cfg["stage"], loaded.samples[0]),
    )
