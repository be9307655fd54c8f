"""Loading a model for a sharded strategy without a full copy on every rank.

- ZeRO-3: the DeepSpeed config is registered (``TrainingArguments(deepspeed=...)`` keeps an
  ``HfDeepSpeedConfig`` alive) before the model is built, so transformers builds it under
  ``deepspeed.zero.Init`` (partitioned at construction), without transformers' random init of
  weights the checkpoint then replaces; every rank then reads only its own partition of each
  parameter from the safetensors files (shared page cache) into its ``ds_tensor``: no gather,
  no broadcast, no rank holding more than one tensor's partition at a time.
- FSDP2: every rank builds the model on the meta device (buffers such as RoPE's ``inv_freq``
  stay real: accelerate's ``init_empty_weights(include_buffers=False)``), wraps it with the same
  PEFT adapter, ``fully_shard``s it, allocates only its own shards (``to_empty``), and receives
  the weights group by group from rank 0 through ``set_model_state_dict(full_state_dict=True,
  broadcast_from_rank0=True)``. The LoRA initial values come from rank 0 building the model the
  one-rank way (transformers maps an fp32 safetensors file without reading it), seeded as every
  run is, so a sharded run starts from the same weights as a one-rank run.

``peak_rss_mb`` (``VmHWM``) is what the ranks report in their ``rank_memory`` events.
"""

from __future__ import annotations

import gc
import json
import struct
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cockpit.models.weights import Weights, sharded_load_mode, weights_of

GROUP_BYTES = 64 * 2**20  # one group of tensors read at a time (a tensor larger than this is a group alone)
PEFT_PREFIX = "base_model.model."


def peak_rss_mb(status_path: str = "/proc/self/status") -> float | None:
    """This process's peak resident set size (``VmHWM``) in MiB, or None where /proc is absent."""
    from cockpit.train.private_memory import status_mb

    return status_mb("VmHWM", status_path)


def safetensors_files(model_dir: str | Path) -> list[Path]:
    d = Path(model_dir)
    return sorted(d.glob("*.safetensors")) if d.is_dir() else []


def _header(path: Path) -> dict[str, Any]:
    """The safetensors header (names, dtypes, shapes, offsets): 8-byte length + JSON, no tensor read."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        head = json.loads(f.read(n))
    head.pop("__metadata__", None)
    return head


def checkpoint_groups(model_dir: str | Path, group_bytes: int = GROUP_BYTES) -> list[tuple[Path, list[str]]]:
    """(file, tensor names) groups in file order, each about ``group_bytes``; the same on every
    rank (read from the headers only), so every rank makes the same collective calls."""
    groups: list[tuple[Path, list[str]]] = []
    for path in safetensors_files(model_dir):
        head = _header(path)
        names = sorted(head, key=lambda k: head[k]["data_offsets"][0])
        cur: list[str] = []
        size = 0
        for name in names:
            a, b = head[name]["data_offsets"]
            if cur and size + (b - a) > group_bytes:
                groups.append((path, cur))
                cur, size = [], 0
            cur.append(name)
            size += b - a
        if cur:
            groups.append((path, cur))
    return groups


def canonical(key: str) -> str:
    """A model state-dict key as the checkpoint names it (PEFT's wrapper prefix and ``base_layer`` removed)."""
    key = key.removeprefix(PEFT_PREFIX)
    return key.replace(".base_layer.", ".")


def read_group(path: Path, names: list[str], dtype: Any) -> dict[str, Any]:
    """The named tensors, copied out of the file (whose mapping closes on return), in ``dtype``."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="pt") as f:
        for name in names:
            t = f.get_tensor(name)
            out[name] = t.to(dtype) if (t.is_floating_point() and t.dtype != dtype) else t.clone()
            del t
    return out


# -- FSDP2 -------------------------------------------------------------------------------------
def streamed_config(
    cfg: Mapping[str, Any], folder: str | Path, load_kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """The model config a streamed load builds from, with the options ``from_pretrained`` would get
    (``load_kwargs``: :func:`cockpit.train.variants.model_load_kwargs`): RoPE scaling set on the
    config, the attention kernel returned as ``from_config``'s argument."""
    from transformers import AutoConfig

    opts = dict(load_kwargs)
    attn = opts.pop("attn_implementation", None)
    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=bool(cfg["trust_remote_code"]), **opts)
    return config, ({"attn_implementation": attn} if attn else {})


def empty_skeleton(cfg: Mapping[str, Any], folder: str | Path, dtype: Any, load_kwargs: dict[str, Any]) -> Any:
    """The model with parameters on the meta device and real buffers."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    config, build = streamed_config(cfg, folder, load_kwargs)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, trust_remote_code=bool(cfg["trust_remote_code"]), **build
        )
    return model


def not_in_checkpoint(model: Any, model_dir: str | Path) -> dict[str, Any]:
    """The model's state-dict entries the checkpoint files do not hold (LoRA adapters), cloned."""
    names = {n for path in safetensors_files(model_dir) for n in _header(path)}
    return {
        k: v.detach().clone()
        for k, v in model.state_dict().items()
        if canonical(k) not in names and v.device.type != "meta"
    }


def fsdp2_materialise_and_load(
    model: Any, model_dir: str | Path, extras: dict[str, Any], *, rank: int, device: Any, dtype: Any, log=print
) -> dict[str, Any]:
    """After ``fully_shard`` on the meta skeleton: allocate this rank's shards, then fill them from
    rank 0 (``extras`` first: the adapters; then the checkpoint, group by group). Collective."""
    import torch
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name in buffers:
                b.copy_(buffers[name])
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    by_file_key: dict[str, list[str]] = {}
    for key in model.state_dict():
        by_file_key.setdefault(canonical(key), []).append(key)
    in_files = {n for path in safetensors_files(model_dir) for n in _header(path)}
    loaded: set[str] = {
        key for keys in by_file_key.values() for key in keys if canonical(key) not in in_files
    }  # rank 0's extras
    if rank == 0 and set(extras) != loaded:
        raise ValueError(
            f"sharded loading: the adapter tensors differ from the skeleton's: {sorted(set(extras) ^ loaded)[:3]}"
        )
    set_model_state_dict(model, dict(extras) if rank == 0 else {}, options=opts)
    for names in fsdp2_fill(model, model_dir, rank=rank, dtype=dtype):
        for name in names:
            loaded.update(by_file_key.get(name, []))
    missing = [n for n, _ in model.named_parameters() if n not in loaded]
    if missing:
        raise ValueError(
            f"sharded loading: {len(missing)} parameters are in neither the checkpoint nor the adapter, e.g. {missing[:3]}"
        )
    return {"groups": len(checkpoint_groups(model_dir)), "adapter_tensors": len(extras)}


def fsdp2_fill(model: Any, folder: str | Path, *, rank: int, dtype: Any) -> Iterator[list[str]]:
    """Fill an FSDP2-sharded model's shards from ``folder``'s safetensors, one group at a time read
    by rank 0 and broadcast (collective: every rank iterates); yields each group's tensor names."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    by_file_key: dict[str, list[str]] = {}
    for key in model.state_dict():
        by_file_key.setdefault(canonical(key), []).append(key)
    for path, names in checkpoint_groups(folder):
        part: dict[str, Any] = {}
        if rank == 0:
            for name, t in read_group(path, names, dtype).items():
                for key in by_file_key.get(name, []):
                    part[key] = t
        set_model_state_dict(model, part, options=opts)
        del part
        gc.collect()
        yield names


def fsdp2_full_resume(trainer_cls: type) -> type:
    """``trainer_cls`` (FSDP2's) resuming a full fine-tune: the checkpoint's model files are read by
    rank 0 group by group into the shards (the Trainer's own load copies plain tensors into DTensor
    parameters and fails); a PEFT model's adapter resumes the Trainer's way."""

    class FSDP2Resume(trainer_cls):  # type: ignore[misc,valid-type]
        def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
            if hasattr(self.model, "peft_config"):
                return super()._load_from_checkpoint(resume_from_checkpoint, model)
            import torch.distributed as dist

            dtype = next(self.model.parameters()).dtype
            groups = list(fsdp2_fill(self.model, resume_from_checkpoint, rank=dist.get_rank(), dtype=dtype))
            if not groups:
                raise ValueError(f"resume: {resume_from_checkpoint} holds no safetensors model files")
            return None

    return FSDP2Resume


# -- ZeRO-3 ------------------------------------------------------------------------------------
def zero3_stream_load(model: Any, model_dir: str | Path, *, rank: int, dtype: Any) -> int:
    """Fill a model built under ``zero.Init`` from the checkpoint: every rank reads only its own
    partition of each parameter from the safetensors files (their pages are the node's shared page
    cache) and writes it into the parameter's ``ds_tensor``, with no collective. Buffers load whole.
    DeepSpeed's layout: a parameter's flat elements padded to a multiple of the world size, rank
    ``r`` holding ``[r * size, (r + 1) * size)``. Returns the number of tensors read.

    (Before: rank 0 read groups of whole tensors and every rank gathered each module to copy them
    in, so rank 0 held a group in two dtypes and every rank a gathered module: the load's peak.)"""
    import deepspeed.comm as ds_comm
    from safetensors import safe_open

    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    prefix = getattr(model, "base_model_prefix", "") or ""
    read = 0
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                key = name if (name in params or name in buffers) else f"{prefix}.{name}"
                if key in params and not hasattr(params[key], "ds_tensor"):  # left whole by zero.Init
                    params[key].data.copy_(f.get_tensor(name).to(params[key].dtype))
                    read += 1
                elif key in params:
                    param = params[key]
                    part_rank = ds_comm.get_rank(group=getattr(param, "ds_process_group", None))
                    fill_partition(param.ds_tensor, f.get_slice(name), part_rank, param.ds_numel, dtype)
                    read += 1
                elif key in buffers:
                    buffers[key].data.copy_(f.get_tensor(name).to(buffers[key].dtype))
                    read += 1
    del rank  # every rank reads its own partition: no rank is special
    return read


def fill_partition(out: Any, tensor_slice: Any, part_rank: int, numel: int, dtype: Any) -> None:
    """``out`` (one rank's flat partition of ``len(out)`` elements) from a safetensors slice: the
    elements ``[part_rank * len(out), ...)`` of the tensor's flat view, zeros past its end. Reads
    only the rows that hold them."""
    size = out.numel()
    start, end = part_rank * size, min((part_rank + 1) * size, numel)
    if start >= end:
        out.zero_()
        return
    shape = tensor_slice.get_shape()
    if not shape:  # a scalar
        values = tensor_slice[()].reshape(-1)[start:end]
    else:
        cols = 1
        for d in shape[1:]:
            cols *= d
        first, last = start // cols, -(-end // cols)
        rows = tensor_slice[first:last]
        values = rows.reshape(-1)[start - first * cols : end - first * cols]
    out[: end - start].copy_(values.to(dtype))
    out[end - start :].zero_()


def iter_names(groups: list[tuple[Path, list[str]]]) -> Iterator[str]:
    for _path, names in groups:
        yield from names


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
LOAD_MMAP_THRESHOLD = 1 << 20  # during a ZeRO-3 load: tensors of 1 MiB and more get their own mapping
AFTER_MMAP_THRESHOLD = 32 << 20  # after it: glibc's own ceiling for its dynamic threshold (64-bit)


@contextmanager
def mapped_large_allocations() -> Iterator[None]:
    """glibc's malloc gives every allocation of 1 MiB or more its own mapping while the block runs,
    so memory freed is returned to the system at once. zero.Init builds each parameter whole and
    keeps its partition: with glibc's dynamic threshold the freed whole tensors stay in the heap as
    private memory no tensor holds (measured: bench/sharded_load_memory.py). Afterwards the
    threshold is glibc's ceiling, where its dynamic rule ends up in a training process. Nothing
    happens where glibc's mallopt is absent."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        yield
        return
    mallopt(M_MMAP_THRESHOLD, LOAD_MMAP_THRESHOLD)
    try:
        yield
    finally:
        mallopt(M_MMAP_THRESHOLD, AFTER_MMAP_THRESHOLD)


def ensure_deepspeed_comm() -> None:
    """DeepSpeed's own view of the process group, which ``zero.Init`` reads the world size from:
    without it a ZeRO-3 build on N ranks sees one ("train_batch_size ... 2 != 1 * 1 * 1")."""
    import deepspeed
    import torch.distributed as dist
    from deepspeed import comm as ds_comm

    if dist.is_initialized() and not ds_comm.is_initialized():
        deepspeed.init_distributed(dist_backend=dist.get_backend())


def sharded_base(cfg: Mapping[str, Any], folder: str | Path, dtype: Any, load: str, load_kwargs: dict[str, Any]) -> Any:
    """The base model for ``load`` = ``meta`` (FSDP2 skeleton) or ``zero3`` (partitioned, filled),
    built from ``folder``'s safetensors with the full load's options (``load_kwargs``)."""
    if load == "meta":
        return empty_skeleton(cfg, folder, dtype, load_kwargs)
    if load != "zero3":
        raise ValueError(f"unknown load mode {load!r}")
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    from transformers.integrations import is_deepspeed_zero3_enabled

    if not is_deepspeed_zero3_enabled():
        raise RuntimeError(
            "zero3 loading needs the DeepSpeed config registered first (TrainingArguments(deepspeed=...))"
        )
    ensure_deepspeed_comm()
    config, build = streamed_config(cfg, folder, load_kwargs)
    with mapped_large_allocations():
        with random_init_deferred() as deferred:
            model = AutoModelForCausalLM.from_config(
                config, dtype=dtype, trust_remote_code=bool(cfg["trust_remote_code"]), **build
            )  # zero.Init
        if not_all_parameters_in(model, folder):  # a parameter the checkpoint lacks gets transformers' init
            deferred(model)
        zero3_stream_load(model, folder, rank=dist.get_rank(), dtype=dtype)
    return model


@contextmanager
def random_init_deferred() -> Iterator[Any]:
    """transformers' ``from_config`` under ZeRO-3 gives every parameter its random init
    (``initialize_weights_zero3``: each module gathered whole on every rank, rank 0 drawing its
    values), all of which the streamed checkpoint then overwrites. Inside this block that init is
    not run; the block yields it, to run when a parameter is missing from the checkpoint. Measured
    (2 ranks, a 516 MiB model): the build's private-memory peak 804 -> 585 MiB per rank."""
    import transformers.integrations.deepspeed as hf_deepspeed

    original = getattr(hf_deepspeed, "initialize_weights_zero3", None)
    if original is None:  # a transformers that initialises another way: left as it is
        yield lambda model: None
        return

    def run_it(model: Any) -> None:
        original(model)
        model.tie_weights()

    hf_deepspeed.initialize_weights_zero3 = lambda model: None
    try:
        yield run_it
    finally:
        hf_deepspeed.initialize_weights_zero3 = original


def not_all_parameters_in(model: Any, model_dir: str | Path) -> list[str]:
    """The model's parameters (tied ones once) that the checkpoint files do not hold."""
    names = {n for path in safetensors_files(model_dir) for n in _header(path)}
    prefix = getattr(model, "base_model_prefix", "") or ""
    return [n for n, _ in model.named_parameters() if n not in names and n.removeprefix(f"{prefix}.") not in names]


def load_mode(cfg: Mapping[str, Any], ref: Any, zero3: bool, world_size: int) -> tuple[str, Weights]:
    """How this run's ranks build the base (:func:`cockpit.models.weights.sharded_load_mode`, the
    rule the planner's host line applies too), and where its weights are."""
    weights = weights_of(ref, fetch=True)
    return sharded_load_mode(weights, **strategy_facts(cfg, zero3, world_size)), weights


def strategy_facts(cfg: Mapping[str, Any], zero3: bool, world_size: int) -> dict[str, Any]:
    """What the load rule (:mod:`cockpit.models.weights`) asks of a run, from a rank's view of it."""
    return {
        "world_size": world_size,
        "quantized": bool(cfg.get("quantization_bit")),
        "fsdp": bool(cfg.get("fsdp")),
        "zero3": zero3,
    }
