"""Where a model's weights lie on this machine, and so how the ranks load them.

One answer for the ranks (:mod:`cockpit.train.sharded_load`) and the planner's host line
(:mod:`cockpit.plan.host`): under ZeRO-3 and FSDP2 each rank reads its own part of every tensor
from a folder of safetensors files, so no rank holds a full copy (a vision-language model's tensors under the
names transformers renames them to as it loads: :data:`STREAMED_VLM`); anything else is loaded whole on every rank, and both say why:
a GGUF file (dequantised as it loads), ``.bin``-only weights (pickles: no header to read a part
from), or a hub id that is neither in this machine's Hugging Face cache nor downloadable.

A hub id (``model_revision`` included) is resolved to its cache snapshot folder: the GPU presets
name hub ids, and that is the case that fills a node. The ranks fetch a missing snapshot's
safetensors first (``fetch=True``: huggingface_hub's file locks let every rank of a node ask at
once, one downloads), then stream it; the planner does not download, and plans a hub id it cannot
see as the ranks will load it once fetched (``pending``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

INDEX = "model.safetensors.index.json"
MODES = ("full", "zero3", "fsdp_meta")


@dataclass(frozen=True)
class Weights:
    folder: str | None  # the folder whose *.safetensors files a sharded load streams; None: loaded whole
    why_whole: str = ""  # when folder is None: why, in words a user can act on
    pending: bool = False  # a hub id not on this machine: the ranks fetch it first (the planner's view)

    @property
    def streams(self) -> bool:
        return self.folder is not None or self.pending


# what a streamed load reads besides the weights; the weights themselves only as safetensors
FETCHED = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja", "*.py"]


def hub_snapshot(repo_id: str, revision: str | None = None, *, fetch: bool = False) -> str | None:
    """The HF cache's snapshot folder of ``repo_id`` at ``revision`` (a branch, tag or commit);
    with ``fetch``, its config, tokenizer and safetensors files are downloaded first where they are
    missing (nothing when ``HF_HUB_OFFLINE`` is set). None when the cache does not hold it."""
    from huggingface_hub import snapshot_download

    if fetch:
        try:
            return str(snapshot_download(repo_id, revision=revision, allow_patterns=FETCHED))
        except (
            OSError,
            ValueError,
        ):  # offline, unreachable, gated: the cache's copy if any, else from_pretrained's own error
            pass
    try:
        return str(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except (OSError, ValueError):  # LocalEntryNotFoundError, a bad revision, an unreadable cache: not here
        return None


def missing_shards(folder: Path) -> list[str]:
    """The safetensors files the folder's index names but the folder lacks (a partial download)."""
    index = folder / INDEX
    if not index.is_file():
        return []
    try:
        files = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
    except (OSError, ValueError, KeyError, AttributeError):
        return []
    return sorted(f for f in files if not (folder / f).is_file())


def weights_of(ref: Any, *, fetch: bool) -> Weights:
    """Where ``ref``'s (a :class:`cockpit.models.resolve.ModelRef`) weights are, for a streamed
    load; ``fetch``: download a hub id's missing files first (the ranks), or plan them (the planner)."""
    if ref.gguf_file:
        return Weights(None, f"{ref.gguf_file} is a GGUF file: every rank dequantises it whole as it loads")
    folder = ref.path
    if ref.hub:
        snap = hub_snapshot(ref.path, ref.revision, fetch=fetch and not getattr(ref, "local_only", False))
        if snap is None and not fetch:
            return Weights(None, pending=True)
        if snap is None:
            at = f" at {ref.revision}" if ref.revision else ""
            return Weights(None, f"{ref.path}{at} is not in this machine's Hugging Face cache and cannot be fetched")
        folder = snap
    d = Path(folder)
    if not any(d.glob("*.safetensors")):
        if any(d.glob("*.bin")) or any(d.glob("*.pt")):
            return Weights(
                None, f"{d} holds .bin weights only: every rank loads them whole; save as safetensors to stream them"
            )
        return Weights(
            None,
            f"{d} holds no weight files yet: every rank downloads and loads them whole"
            if ref.hub
            else f"{d} holds no safetensors weights: every rank loads the model whole",
        )
    lacking = missing_shards(d)
    if lacking:
        return Weights(None, f"{d} lacks {len(lacking)} of its safetensors shards (e.g. {lacking[0]}): loaded whole")
    composite = composite_model_type(d)
    if composite and composite not in STREAMED_VLM:
        return composite_whole(d, composite)
    if experts_stored_apart(d):
        return Weights(
            None,
            f"{d} stores each expert's weights apart and transformers fuses them as it loads (a mixture-of-experts "
            "model): every rank loads it whole, partitioned (ZeRO-3) or sharded (FSDP2) after",
        )
    return Weights(str(d))


_EXPERT_KEY = re.compile(r"\.experts\.\d+\.")


def experts_stored_apart(folder: Path) -> bool:
    """A mixture-of-experts checkpoint in the per-expert layout (``mlp.experts.0.gate_proj.weight``, as
    transformers 5 still saves Qwen3-MoE / Mixtral) whose model fuses its experts (``mlp.experts.gate_up_proj``):
    a streamed load reads tensors by the model's names, so it cannot fill them (from_pretrained converts)."""
    names: list[str] = []
    index = folder / INDEX
    try:
        if index.is_file():
            names = list(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
        else:
            for path in sorted(folder.glob("*.safetensors"))[:1]:
                with open(path, "rb") as f:
                    size = int.from_bytes(f.read(8), "little")
                    names = list(json.loads(f.read(size)))
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return any(_EXPERT_KEY.search(n) for n in names)


# The vision-language model types whose checkpoints transformers 5.23 reads by renaming their keys alone (its
# conversion mapping: LLaVA's and Gemma 3's ``language_model.model.`` -> ``model.language_model.``, Qwen2-VL's
# and Qwen2.5-VL's ``model.`` -> ``model.language_model.`` and ``visual.`` -> ``model.visual.``, Qwen3-VL's
# names as saved): a streamed load renames them the same way (cockpit.train.sharded_load.checkpoint_names),
# checked for each family by tests/test_vlm_sharded_load.py. Another composite type loads whole.
STREAMED_VLM = ("llava", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3")


def composite_model_type(folder: Path) -> str | None:
    """The model type in the folder's config.json when it is a vision-language model Cockpit trains
    (:data:`cockpit.models.vlm.COMPOSITE`): transformers renames such a checkpoint's keys as it loads (LLaVA's
    ``language_model.model.layers`` -> ``model.language_model.layers``), which a streamed load does too for the
    types in :data:`STREAMED_VLM`."""
    from cockpit.models.vlm import COMPOSITE

    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return model_type if model_type in COMPOSITE else None


def composite_whole(folder: str | Path, model_type: str) -> Weights:
    """A vision-language model's weights that a streamed load has not been checked to read: loaded whole."""
    return Weights(
        None,
        f"{folder} is a vision-language model ({model_type}) whose checkpoint keys transformers renames as it "
        f"loads, and a streamed load is checked for {', '.join(STREAMED_VLM)} only: every rank loads it whole, "
        "partitioned (ZeRO-3) or sharded (FSDP2) after",
    )


def strategy_shards_load(*, world_size: int, quantized: bool, fsdp: bool, zero3: bool) -> bool:
    """Whether the strategy keeps a part of the model per rank (ZeRO-3, FSDP2), so the load can too."""
    return world_size > 1 and not quantized and (fsdp or zero3)


# the LoRA keys whose adapter init reads the base weights (DoRA's magnitudes, PiSSA's SVD, a trained
# adapter loaded or merged, modules_to_save's copies): FSDP2's rank 0 then builds the whole model
# the one-rank way, for the adapter alone (cockpit.train.sharded_load)
ADAPTER_INIT_READS_BASE = ("adapter_name_or_path", "use_dora", "pissa_init", "additional_target")


def adapter_init_reads_base(cfg: RunConfig) -> bool:
    return cfg.finetuning_type == "lora" and any(getattr(cfg, k) for k in ADAPTER_INIT_READS_BASE)


def sharded_load_mode(weights: Weights, *, world_size: int, quantized: bool, fsdp: bool, zero3: bool) -> str:
    """How the ranks build the base: ``fsdp_meta`` (FSDP2: meta skeleton, each rank filling its
    shards from the files), ``zero3`` (built partitioned under zero.Init, weights streamed) or ``full`` (whole on every
    rank: one rank, QLoRA, a strategy that keeps whole copies, or weights a sharded load cannot stream)."""
    if not weights.streams or not strategy_shards_load(
        world_size=world_size, quantized=quantized, fsdp=fsdp, zero3=zero3
    ):
        return "full"
    return "fsdp_meta" if fsdp else "zero3"


def planned_weights(cfg: RunConfig) -> Weights:
    """The planner's view of the run's weights: nothing downloaded, nothing converted (the
    embedded model's safetensors folder is where its conversion writes)."""
    from cockpit.errors import InputError
    from cockpit.models.embedded import embedded_model_dir, is_embedded
    from cockpit.models.embedded_vlm import embedded_vlm_dir, is_embedded_vlm
    from cockpit.models.resolve import resolve_model

    name = cfg.model_name_or_path
    if not isinstance(name, str):
        return Weights(None, "no model_name_or_path")
    if is_embedded(name):
        return Weights(str(embedded_model_dir()))
    if is_embedded_vlm(name):  # a LLaVA in safetensors (built on first use): streamed, as the ranks load it
        return Weights(str(embedded_vlm_dir()))
    try:
        ref = resolve_model(name, log=lambda *_: None, revision=cfg.model_revision)
    except InputError as exc:
        return Weights(None, str(exc))
    return weights_of(ref, fetch=False)
