"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the training ranks, on GPU and CPU alike.

Why not HF Trainer's own ``fsdp=`` path: on the CPU, accelerate 1.15 silently turns the FSDP
request into plain DDP (parameters replicated, nothing sharded) and FSDP1 refuses the CPU. The
cockpit never reports FSDP when parameters are not sharded, so it shards the model itself:

1. every module whose class is in ``model._no_split_modules`` (the decoder layer, found
   automatically), then the root, with ``fully_shard`` over a device mesh of all ranks
   (gloo on the CPU, RCCL/NCCL on GPUs); ``hybrid_shard`` shards within a node and replicates
   across nodes (2-D mesh);
2. marks the model ``is_distributed_loading_by_transformers``: transformers then lets the
   model own placement and gradient reduction (no DDP wrap, no re-shard), and defers the
   reduce-scatter over gradient accumulation;
3. :class:`FSDP2Trainer` gathers the full model and optimizer state dicts (collectives on every
   rank) when saving a checkpoint, and scatters the optimizer state back into the shards on resume.

Options (the ``fsdp`` key): ``full_shard`` (reshard parameters after forward: ZeRO-3 like),
``shard_grad_op`` (keep them gathered between forward and backward: ZeRO-2 like), ``hybrid_shard``,
``offload`` (parameters, gradients and optimizer state on the CPU: ``CPUOffloadPolicy``; a no-op
for a CPU run), ``auto_wrap`` (accepted; wrapping per decoder layer is always done).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MIN_TORCH = (2, 1)
FSDP2_TORCH = (2, 6)  # fully_shard public in torch.distributed.fsdp


def torch_version() -> tuple[int, int]:
    import torch

    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def check_torch() -> str | None:
    """A reason FSDP cannot run with this torch, or None."""
    v = torch_version()
    if v < MIN_TORCH:
        return f"FSDP needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}, this is {v[0]}.{v[1]}"
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return (
            f"torch {v[0]}.{v[1]} has no torch.distributed.fsdp.fully_shard (FSDP2, torch >= {FSDP2_TORCH[0]}.{FSDP2_TORCH[1]}); "
            "the cockpit only runs FSDP2, which shards on GPUs and the CPU alike: upgrade torch or use deepspeed/zero_stage"
        )
    return None


def options(text: str | None) -> set[str]:
    return set((text or "").split())


def layer_classes(model: Any) -> set[str]:
    """Decoder layer class names from ``_no_split_modules`` (through PEFT wrappers)."""
    seen: set[str] = set()
    stack = [model]
    while stack:
        m = stack.pop()
        names = getattr(m, "_no_split_modules", None)
        if names:
            seen.update(names)
        for attr in ("base_model", "model"):
            sub = getattr(m, attr, None)
            if sub is not None and sub is not m and not isinstance(sub, (str, int)):
                stack.append(sub)
        if len(seen) > 0:
            break
    return seen


def shard(
    model: Any, fsdp: str, *, use_cpu: bool, local_rank: int, nnodes: int, bf16: bool, fp16: bool
) -> dict[str, Any]:
    """fully_shard the model in place; returns what was done (for the event log)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    opts = options(fsdp)
    world = dist.get_world_size()
    device_type = "cpu" if use_cpu else "cuda"
    if not use_cpu and not any(p.is_meta for p in model.parameters()):  # a meta skeleton is materialised after sharding
        model.to(torch.device("cuda", local_rank))
    if "hybrid_shard" in opts and nnodes > 1 and world % nnodes == 0:
        mesh = init_device_mesh(device_type, (nnodes, world // nnodes), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": "shard_grad_op" not in opts}
    if (bf16 or fp16) and not use_cpu:
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if bf16 else torch.float16, reduce_dtype=torch.float32
        )
    if "offload" in opts and not use_cpu:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    classes = layer_classes(model)
    if not classes:
        raise ValueError("fsdp: the model declares no _no_split_modules, so its decoder layer class is unknown")
    wrapped = [m for m in model.modules() if type(m).__name__ in classes]
    if not wrapped:
        raise ValueError(f"fsdp: no module of class {sorted(classes)} in the model")
    for m in wrapped:
        fully_shard(m, **kwargs)
    root_kwargs = dict(kwargs)
    root_kwargs["reshard_after_forward"] = False  # the root is gathered again at once by backward
    fully_shard(model, **root_kwargs)
    mark_sharded_before_trainer(model)
    return {
        "layer_classes": sorted(classes),
        "wrapped_modules": len(wrapped),
        "mesh": list(mesh.shape),
        "reshard_after_forward": kwargs["reshard_after_forward"],
        "offload": "offload_policy" in kwargs,
        "mixed_precision": "mp_policy" in kwargs,
    }


def mark_sharded_before_trainer(model: Any) -> None:
    """Tell the Trainer the model is sharded already (it then neither moves nor wraps it).
    transformers 5 reads it through a read-only property of ``PreTrainedModel`` backed by
    ``_is_distributed_loading_by_transformers`` (a full fine-tune hands over the model itself); a
    PEFT wrapper takes a plain attribute."""
    if isinstance(getattr(type(model), "is_distributed_loading_by_transformers", None), property):
        model._is_distributed_loading_by_transformers = True
    else:
        model.is_distributed_loading_by_transformers = True


def shard_report(model: Any) -> dict[str, Any]:
    """Per-parameter local vs global numel and whether it is a DTensor."""
    from torch.distributed.tensor import DTensor

    params = []
    local_total = global_total = 0
    for name, p in model.named_parameters():
        is_dt = isinstance(p, DTensor)
        local = p.to_local().numel() if is_dt else p.numel()
        glob = p.numel()
        local_total += local
        global_total += glob
        params.append(
            {
                "name": name,
                "dtensor": is_dt,
                "local_numel": local,
                "global_numel": glob,
                "trainable": bool(p.requires_grad),
            }
        )
    return {
        "params": params,
        "local_numel": local_total,
        "global_numel": global_total,
        "all_dtensor": all(x["dtensor"] for x in params),
    }


def write_report(run_dir: str | os.PathLike[str], rank: int, info: dict[str, Any], report: dict[str, Any]) -> Path:
    path = Path(run_dir) / "logs" / f"fsdp.rank{rank}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"rank": rank, **info, **report}))
    os.replace(tmp, path)
    return path


def _inner(optimizer: Any) -> Any:
    """The torch optimizer under accelerate's ``AcceleratedOptimizer`` wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def trainer_class(base: type | None = None) -> type:
    """``base`` (default HF Trainer) whose checkpoints hold the FSDP2-sharded model and optimizer
    gathered into full, name-keyed state dicts (collectives: every rank joins; rank 0 writes), and
    whose resume scatters them back into each rank's shards. The stock Trainer would pickle
    rank 0's DTensor shards of the Adam moments only (rank 1 would resume with rank 0's moments),
    so optimizer state goes through ``torch.distributed.checkpoint.state_dict``'s
    ``get_optimizer_state_dict`` / ``set_optimizer_state_dict``; ``optimizer.pt`` is then a plain
    full state dict, independent of the world size it was saved with."""
    if base is None:
        from transformers import Trainer

        base = Trainer

    class FSDP2Trainer(base):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # The Trainer refuses optimizer checkpoints for a model sharded before it (it could
            # not write them); this class writes and reads them itself, so the check is passed
            # with save_only_model set and the configured value restored right after.
            targs = kwargs["args"] if "args" in kwargs else args[1]
            wanted, targs.save_only_model = targs.save_only_model, True
            try:
                super().__init__(*args, **kwargs)
            finally:
                targs.save_only_model = wanted

        def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
            if state_dict is None:
                from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

                # a collective: every rank joins; rank 0 receives the full tensors on the CPU. A PEFT
                # model saves its adapter only: gather the trainable tensors, not the frozen base
                # (a 70B base would otherwise be gathered into rank 0's host RAM at every save).
                adapter_only = hasattr(self.model, "peft_config")
                state_dict = get_model_state_dict(
                    self.model,
                    options=StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=adapter_only),
                )
            super()._save(output_dir, state_dict=state_dict)

        def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
            import torch
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
            from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME

            osd = get_optimizer_state_dict(
                self.model, _inner(self.optimizer), options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
            if self.args.should_save:
                torch.save(osd, os.path.join(output_dir, OPTIMIZER_NAME))
                torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

        def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
            if checkpoint is None:
                return
            import torch
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
            from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME

            optim_path = os.path.join(checkpoint, OPTIMIZER_NAME)
            sched_path = os.path.join(checkpoint, SCHEDULER_NAME)
            if not (os.path.isfile(optim_path) and os.path.isfile(sched_path)):
                return  # a model-only checkpoint (save_only_model): fresh optimizer, as the Trainer does
            # rank 0 reads the full state and broadcasts it tensor by tensor; each rank keeps its shard
            # (every rank reading the whole file costs a node ranks x the optimizer state of host RAM)
            rank0 = torch.distributed.get_rank() == 0
            osd = torch.load(optim_path, map_location="cpu", weights_only=True) if rank0 else {}
            set_optimizer_state_dict(
                self.model,
                _inner(self.optimizer),
                osd,
                options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
            )
            del osd
            self.lr_scheduler.load_state_dict(torch.load(sched_path, weights_only=True))

    return FSDP2Trainer


def gathered_root(model: Any):
    """A context in which the root's own parameters (embeddings, final norm, LoRA outside the
    layers) stay gathered: ``generate`` calls the inner model, not the root, so the root's
    pre-forward all-gather would never run. Every rank must enter it (a collective), and every
    rank must then run the same forwards (each decoder layer still gathers its own)."""
    import contextlib

    @contextlib.contextmanager
    def ctx():
        unshard = getattr(model, "unshard", None)
        if unshard is None:
            yield
            return
        unshard()
        try:
            yield
        finally:
            model.reshard()

    return ctx()
