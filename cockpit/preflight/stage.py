"""``cockpit check`` for the non-SFT stages: the same static / device / model checks as SFT,
then the stage's data read and tokenized the way its trainer will (no model weights loaded).
Imports transformers (the tokenizer) lazily; never imported by the UI process."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from cockpit.errors import InputError, Problem

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def _preview(tokenizer: Any, stage: str, sample: dict[str, Any]) -> dict[str, Any]:
    """The first sample as text pieces (trained or not); pairs also side by side."""
    if stage == "pt":
        return {"source": sample["source"], "pieces": [{"text": sample["text"][:2000], "trained": True}]}
    prompt = tokenizer.apply_chat_template(sample["prompt"], tokenize=False, add_generation_prompt=True)
    answer = sample.get("chosen", sample.get("completion", ""))
    if stage == "grpo":  # the answers are sampled in training; the columns the rewards read instead
        answer = json.dumps(sample.get("columns", {}), ensure_ascii=False)[:2000]
    out: dict[str, Any] = {
        "source": sample["source"],
        "pieces": [{"text": prompt, "trained": False}, {"text": answer, "trained": True}],
    }
    if "rejected" in sample:
        out["pair"] = {"chosen": sample["chosen"], "rejected": sample["rejected"]}
    if "label" in sample:
        out["kto_tag"] = sample["label"]
    return out


def grpo_checks(cfg: RunConfig) -> None:
    """Stage grpo: vLLM where ``use_vllm`` asks for it (a GPU, the package); the reward functions built (a user's
    file imported, its function found) before any rank starts."""
    import importlib.util

    if cfg.use_vllm:
        import torch

        why = []
        if importlib.util.find_spec("vllm") is None:
            why.append("vllm is not installed (pip install vllm)")
        if not (torch.cuda.is_available() and torch.cuda.device_count()):
            why.append("no GPU is visible on this machine")
        if why:
            raise InputError(Problem(f"{'; '.join(why)}: unset use_vllm to generate with HF generate", key="use_vllm"))
    from cockpit.data.rewards import build_reward_funcs

    build_reward_funcs(cfg)


def check_stage(cfg: RunConfig, log=print, with_devices: bool = True, gpus: int | None = None):
    from cockpit.data.media import image_report
    from cockpit.data.stage_data import collect_stage_samples, prepare_stage_data
    from cockpit.models.resolve import config_model, load_model_config, load_tokenizer
    from cockpit.models.vlm import refuse_unhonoured
    from cockpit.preflight.checks import (
        CheckResult,
        check_moe_keys,
        device_checks,
        image_probe_problems,
        static_checks,
    )

    warnings = static_checks(cfg, gpus)
    loaded = collect_stage_samples(cfg)  # every bad row, before any model is loaded
    if with_devices:
        warnings += device_checks(cfg)
    ref = config_model(cfg, log=log)
    tok = load_tokenizer(cfg, ref, log=log)
    mcfg = load_model_config(cfg, ref)
    check_moe_keys(cfg, mcfg)
    warnings += refuse_unhonoured(cfg, mcfg)  # the vision-language keys: each with an effect on this model
    if probe_problems := image_probe_problems(cfg, mcfg):
        raise InputError(probe_problems)
    hidden = getattr(mcfg, "hidden_size", None)
    if cfg.finetuning_type == "lora" and hidden and cfg.lora_rank > hidden:
        raise InputError(
            Problem(f"lora_rank {cfg.lora_rank} exceeds the model's hidden size {hidden}", key="lora_rank")
        )
    if cfg.stage in ("dpo", "kto", "rm", "grpo"):
        try:
            import trl  # noqa: F401
        except ImportError:
            raise InputError(Problem(f"stage {cfg.stage} needs TRL: pip install 'trl>=1.16,<2'", key="stage")) from None
    if cfg.stage == "grpo":
        grpo_checks(cfg)
    prepared = prepare_stage_data(cfg, tok, loaded)
    if prepared.report.emptied:
        warnings.append(f"cutoff_len {cfg.cutoff_len}: {prepared.report.lines()[-1].removeprefix('warning: ')}")
    return CheckResult(
        cfg=cfg,
        report=prepared.report,
        formats=loaded.formats,
        bad_rows=loaded.problems,
        warnings=warnings,
        samples=len(prepared.kept),  # what the ranks train on (survives_cutoff)
        model_path=ref.path,
        preview=_preview(tok, cfg.stage, loaded.samples[0]),
        images=image_report(prepared.kept),  # dpo's pairs with images (issue 63)
    )
