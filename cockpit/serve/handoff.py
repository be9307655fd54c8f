"""Hand a run's adapter to a running vLLM server: check the base model, load the adapter at
runtime, check it is listed, ask both models a probe prompt. No torch."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from cockpit.errors import InputError
from cockpit.serve.artifacts import RunArtifacts
from cockpit.serve.vllm import VLLMClient, VLLMError

FINGERPRINT_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)


def _fingerprint(folder: str) -> dict[str, Any] | None:
    try:
        model_config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return {k: model_config.get(k) for k in FINGERPRINT_KEYS}


def _same_path(a: str, b: str) -> bool:
    try:
        return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))
    except (TypeError, ValueError):
        return False


def check_base(models: list[dict[str, Any]], art: RunArtifacts, base_id: str | None = None) -> tuple[str, str]:
    """(served base model id, how it was matched); raises VLLMError('base_mismatch') when the
    server serves another model, and ('base_unknown') when it cannot tell (use --force)."""
    from cockpit.models.embedded import HUB_ID, is_embedded

    bases = [m for m in models if not m.get("parent")]
    if base_id:
        bases = [m for m in bases if m.get("id") == base_id]
        if not bases:
            raise VLLMError(
                "no_model",
                f"the server has no base model {base_id!r}; it serves: {', '.join(m.get('id', '?') for m in models)}",
            )
    if not bases:
        raise VLLMError("no_model", "the server lists no base model")
    ours_dir = art.base_model_dir()
    names = {art.base_model, ours_dir, str(art.adapter_config.get("base_model_name_or_path") or "")} - {""}
    if is_embedded(art.base_model):
        names.add(HUB_ID)
    ours_fp = _fingerprint(ours_dir)
    served_desc = []
    for m in bases:
        served = [m.get("root") or "", m.get("id") or ""]
        served_desc.append(f"{m.get('id')} (root {m.get('root')})")
        if any(s and any(_same_path(s, n) for n in names) for s in served):
            return m["id"], "same path"
        if any(s and s in names for s in served):
            return m["id"], "same name"
        for s in served:
            fp = _fingerprint(s) if s and os.path.isdir(s) else None
            if fp and ours_fp:
                if fp == ours_fp:
                    return m["id"], "same architecture (config.json)"
                diff = {k: (ours_fp[k], fp[k]) for k in FINGERPRINT_KEYS if ours_fp[k] != fp[k]}
                raise VLLMError(
                    "base_mismatch",
                    f"the server serves {m.get('id')}, but {art.run_id} was trained on {art.base_model}: they differ in "
                    + ", ".join(f"{k} ({a} vs {b})" for k, (a, b) in diff.items())
                    + ". Start vLLM with the run's base model (`cockpit serve RUN` prints the command).",
                )
    raise VLLMError(
        "base_unknown",
        f"cannot tell whether the server's model {', '.join(served_desc)} is {art.run_id}'s base model {art.base_model}; "
        "if it is, pass --base-id ID --force",
    )


def handoff(
    art: RunArtifacts,
    client: VLLMClient,
    name: str,
    server_path: str | None = None,
    replace: bool = False,
    force: bool = False,
    base_id: str | None = None,
    log=print,
) -> dict[str, Any]:
    """Load the adapter and verify it is served. Returns a record (also written to RUN/serve.json)."""
    if not art.is_lora or art.config.finetuning_type == "oft":
        raise InputError(
            f"{art.run_id} has no LoRA adapter ({art.config.finetuning_type} run; vLLM loads LoRA adapters "
            "only): serve its model with `cockpit serve RUN --merged`"
        )
    models = client.models()
    try:
        base, how = check_base(models, art, base_id)
    except VLLMError as err:
        if not (force and err.code == "base_unknown"):
            raise
        base = base_id or [m for m in models if not m.get("parent")][0]["id"]
        how = "unverified (--force)"
        log(f"warning: {err}")
    log(f"server base model: {base} ({how})")
    path = server_path or str(art.adapter_dir)
    listed = {m.get("id"): m for m in models}
    if name in listed and not listed[name].get("parent"):
        raise VLLMError("name_conflict", f"{name!r} is the name of a base model on the server; choose another --name")
    if name in listed and not replace:
        log(f"an adapter named {name!r} is already served (not reloaded; --replace reloads it)")
    else:
        t0 = time.perf_counter()
        msg = client.load_lora(name, path, rank=art.lora_rank, inplace=name in listed)
        log(f"loaded adapter {name!r} from {path} in {time.perf_counter() - t0:.1f}s: {msg}")
    after = {m.get("id"): m for m in client.models()}
    if name not in after:
        raise VLLMError("not_listed", f"the server accepted the adapter but /v1/models does not list {name!r}")
    record = {
        "url": client.url,
        "model": name,
        "base_model_id": base,
        "lora_path": path,
        "lora_rank": art.lora_rank,
        "loaded": round(time.time(), 3),
        "mode": "runtime-lora",
    }
    from cockpit.store.rundir import atomic_write_json

    atomic_write_json(art.run.path / "serve.json", record)
    return record


def read_serve_record(art: RunArtifacts) -> dict[str, Any]:
    try:
        return json.loads((art.run.path / "serve.json").read_text())
    except (OSError, ValueError):
        return {}
