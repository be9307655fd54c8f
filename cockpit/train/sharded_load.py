"""Loading a model for a sharded strategy without a full copy on every rank.

- ZeRO-3: the DeepSpeed config is registered (``TrainingArguments(deepspeed=...)`` keeps an
  ``HfDeepSpeedConfig`` alive) before the model is built, so transformers builds it under
  ``deepspeed.zero.Init`` (partitioned at construction), without transformers' random init of
  weights the checkpoint then replaces; every rank then reads only its own partition of each
  parameter from the safetensors files (shared page cache) into its ``ds_tensor``: no gather,
  no broadcast, no rank holding more than one tensor's partition at a time.
- FSDP2: every rank builds the model on the meta device (buffers such as RoPE's ``inv_freq``
  stay real: accelerate's ``init_empty_weights(include_buffers=False)``), wraps it with the same
  PEFT adapter, ``fully_shard``s it, allocates only its own shards (``to_empty``), and reads its
  own rows of every tensor from the safetensors files (no collective, no rank holding a whole
  tensor). The adapter is built real over the meta base on every rank, seeded as every run is,
  so a sharded run starts from the same weights as a one-rank run; where the adapter's init reads
  the base (DoRA, PiSSA, a trained adapter, modules_to_save) rank 0 builds the model the one-rank
  way instead and broadcasts the adapter.

Checkpoint tensors are read under the model's names for them as ``from_pretrained`` renames them
(:func:`checkpoint_names`: transformers' own conversion mapping, e.g. a LLaVA saved with
``language_model.model.layers`` into ``model.language_model.layers``); a tensor that transformers would
convert rather than rename (fused, split) cannot be read part by part: :class:`StreamRefused`, and the
ranks load the model whole.

``peak_rss_mb`` (``VmHWM``) is what the ranks report in their ``rank_memory`` events.
"""

from __future__ import annotations

import gc
import json
import math
import struct
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.models.weights import Weights, sharded_load_mode, weights_of

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

READ_BYTES = 16 * 2**20  # a rank reads its part of a tensor from the checkpoint this much at a time
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
        head: dict[str, Any] = json.loads(f.read(n))
    head.pop("__metadata__", None)
    return head


def canonical(key: str) -> str:
    """A model state-dict key as the checkpoint names it (PEFT's wrapper prefix and ``base_layer`` removed;
    nested ones too: LoRA on two fused expert tensors of one module wraps it twice, ``experts.base_layer.base_layer``)."""
    key = key.removeprefix(PEFT_PREFIX)
    while ".base_layer." in key:
        key = key.replace(".base_layer.", ".")
    return key


class StreamRefused(ValueError):
    """The checkpoint holds a tensor that transformers converts as it loads (fuses, splits): it cannot be
    read part by part under a name of the model, so the ranks load the model whole (the message says why)."""


def checkpoint_names(model: Any, model_dir: str | Path) -> dict[str, str]:
    """Each tensor name of the checkpoint files -> the model's name for it (a state-dict key, without PEFT's
    wrapping), renamed as ``from_pretrained`` renames it: transformers' conversion mapping for this model
    (``get_model_conversion_mapping``: its classes' and model types' renamings, scoped to their sub-models,
    and the legacy ones), its ``base_model_prefix`` added or dropped, and a name the model already has kept
    as it is. So a LLaVA saved with ``language_model.model.layers...`` and one saved with the model's own
    ``model.language_model.layers...`` read the same. A name the model lacks is left out (``from_pretrained``
    drops it too). Ask it of the model before ``fully_shard``, which renames its class.
    Raises :class:`StreamRefused` for a tensor transformers would convert rather than rename."""
    return checkpoint_renamer(model)(model_dir)


def checkpoint_renamer(model: Any) -> Callable[[str | Path], dict[str, str]]:
    """:func:`checkpoint_names` of any checkpoint folder for this model, its conversion mapping taken now
    (before ``fully_shard`` renames the model's class: a resumed checkpoint's names are read with it)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model's transformers model
    transforms = get_model_conversion_mapping(base)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    ours = {canonical(k): True for k, _ in [*base.named_parameters(remove_duplicate=False), *base.named_buffers()]}
    prefix = getattr(base, "base_model_prefix", "") or None

    def names(model_dir: str | Path) -> dict[str, str]:
        out: dict[str, str] = {}
        for path in safetensors_files(model_dir):
            for name in _header(path):
                renamed, converted = rename_source_key(name, renamings, converters, prefix, ours)
                if renamed not in ours and name in ours:  # from_pretrained's rule: a name the model has stays
                    renamed, converted = name, None
                if converted is not None:
                    raise StreamRefused(
                        f"{model_dir}: transformers converts {name!r} as it loads ({converted!r} -> {renamed!r}), "
                        "which a rank cannot read part by part: every rank loads the model whole"
                    )
                if renamed in ours:
                    out[name] = renamed
        return out

    return names


# -- FSDP2 -------------------------------------------------------------------------------------
def streamed_config(cfg: RunConfig, folder: str | Path, load_kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The model config a streamed load builds from, with the options ``from_pretrained`` would get
    (``load_kwargs``: :func:`cockpit.train.variants.model_load_kwargs`): RoPE scaling set on the
    config, the attention kernel returned as ``from_config``'s argument."""
    from transformers import AutoConfig

    opts = dict(load_kwargs)
    attn = opts.pop("attn_implementation", None)
    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=bool(cfg.trust_remote_code), **opts)
    return config, ({"attn_implementation": attn} if attn else {})


def auto_class(config: Any) -> Any:
    """The transformers Auto class a run loads this config's model with: a vision-language model's image-text
    head (:func:`cockpit.train.vlm.load_base`), else the causal LM."""
    from cockpit.models.vlm import composite_of

    if composite_of(config) is not None:
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM


def empty_skeleton(cfg: RunConfig, folder: str | Path, dtype: Any, load_kwargs: dict[str, Any]) -> Any:
    """The model with parameters on the meta device and real buffers. Raises :class:`StreamRefused` when the
    checkpoint cannot be read into it part by part (:func:`checkpoint_names`)."""
    from accelerate import init_empty_weights

    config, build = streamed_config(cfg, folder, load_kwargs)
    with init_empty_weights(include_buffers=False):
        model = auto_class(config).from_config(
            config, dtype=dtype, trust_remote_code=bool(cfg.trust_remote_code), **build
        )
    model.tie_weights()  # from_config leaves a meta skeleton's tied weights (lm_head, embeddings) apart
    checkpoint_names(model, folder)  # refused here, before any adapter or shard is built
    return model


def not_in_checkpoint(model: Any, model_dir: str | Path) -> dict[str, Any]:
    """The model's parameters the checkpoint files do not hold (LoRA adapters), cloned; a tied
    parameter once, under its first name."""
    names = set(checkpoint_names(model, model_dir).values())
    return {
        k: v.detach().clone()
        for k, v in model.named_parameters()
        if canonical(k) not in names and v.device.type != "meta"
    }


@contextmanager
def adapters_kept_real() -> Iterator[None]:
    """PEFT moves a new adapter onto its base layer's device, the meta device in a skeleton; inside
    this block a module with no meta parameter is never moved to the meta device (a dtype asked
    with it still applies), so every rank holds the seeded initial adapter a one-rank run makes,
    with no base weight read. Only for building a skeleton: nothing else moves modules to meta."""
    import torch

    original = torch.nn.Module.to

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        device, dtype, _non_blocking, _fmt = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "meta" and not any(p.is_meta for p in self.parameters()):
            return original(self, dtype=dtype) if dtype is not None else self
        return original(self, *args, **kwargs)

    torch.nn.Module.to = to
    try:
        yield
    finally:
        torch.nn.Module.to = original


def fsdp2_materialise_and_load(
    model: Any,
    model_dir: str | Path,
    extras: dict[str, Any],
    *,
    rank: int,
    device: Any,
    dtype: Any,
    names: Mapping[str, str],
    ties: Mapping[str, str] | None = None,
    extras_from_rank0: bool = False,
    log: Callable[[str], object] = print,
) -> dict[str, Any]:
    """After ``fully_shard`` on the meta skeleton: allocate this rank's shards, then fill them with
    its own part of every tensor: from ``extras`` (the adapters: every rank's own alike, or with
    ``extras_from_rank0`` rank 0's, broadcast: a collective) and from the checkpoint files, each
    rank reading only its own rows (:func:`fill_own_shards`: no collective). ``names``: the checkpoint's
    names -> the model's (:func:`checkpoint_names`), and ``ties``: the skeleton's tied names
    (:func:`tied_names`), both asked before sharding (``fully_shard`` renames the class and unties)."""
    ties = dict(ties or {})
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.to_empty(device=device)
    import torch

    with torch.no_grad():
        for name, b in model.named_buffers():
            if name in buffers:
                b.copy_(buffers[name])
    in_files = set(names.values())
    adapter_keys = {
        key for key, _ in model.named_parameters() if canonical(key) not in in_files and canonical(key) not in ties
    }
    if (rank == 0 or not extras_from_rank0) and set(extras) != adapter_keys:
        raise ValueError(
            f"sharded loading: the adapter tensors differ from the skeleton's: {sorted(set(extras) ^ adapter_keys)[:3]}"
        )
    if extras_from_rank0:
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
        set_model_state_dict(model, dict(extras) if rank == 0 else {}, options=opts)
        filled = set(adapter_keys)
    else:
        filled = fill_own_shards(model, extras.items())
    read: dict[str, int] = {}
    filled |= fill_own_shards_from_files(model, model_dir, dtype, ties, names=names, read=read)
    missing = [n for n, _ in model.named_parameters() if n not in filled]
    if missing:
        raise ValueError(
            f"sharded loading: {len(missing)} parameters are in neither the checkpoint nor the adapter, e.g. {missing[:3]}"
        )
    return {
        "files": len(safetensors_files(model_dir)),
        "adapter_tensors": len(adapter_keys),
        "collective": extras_from_rank0,
        "renamed": sum(1 for a, b in names.items() if a != b),  # checkpoint names transformers renames (a LLaVA's)
        **read,
    }


def own_part_index(tensor: Any) -> tuple[slice, ...] | None:
    """The index of this rank's part of a (DTensor) parameter in the whole tensor, or None when the
    rank holds none of it; a plain tensor is held whole."""
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        return tuple(slice(0, n) for n in tensor.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    if any(n == 0 for n in shape):
        return None
    return tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))


def copy_own_part(tensor: Any, source: Any, dtype: Any) -> int:
    """Copy this rank's part of ``source`` (a whole tensor, or a safetensors slice, read only there)
    into ``tensor``'s local storage, ``READ_BYTES`` of rows at a time; the number of elements read."""
    import torch
    from torch.distributed.tensor import DTensor

    index = own_part_index(tensor)
    if index is None:
        return 0
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor.data
    if not index:  # a scalar
        values = source if isinstance(source, torch.Tensor) else source[()]
        with torch.no_grad():
            local.copy_(values)
        return 1
    rows, rest = index[0], index[1:]
    row_bytes = max(1, local[:1].numel() * local.element_size())
    step = max(1, READ_BYTES // row_bytes)
    with torch.no_grad():
        for a in range(rows.start, rows.stop, step):
            b = min(a + step, rows.stop)
            values = source[(slice(a, b), *rest)]
            local[a - rows.start : b - rows.start].copy_(
                values.to(dtype if values.is_floating_point() else values.dtype)
            )
            del values
    return int(local.numel())


def fill_own_shards(model: Any, items: Any) -> set[str]:
    """Each (state-dict key, whole tensor) of ``items`` copied into this rank's part of the model's
    tensor of that key; the parameter names filled."""
    targets = dict(model.named_parameters(remove_duplicate=False))
    filled: set[str] = set()
    for key, value in items:
        if key in targets:
            copy_own_part(targets[key], value, targets[key].dtype)
            filled.add(key)
    return filled


def tied_names(model: Any) -> dict[str, str]:
    """Each tied parameter's other names (canonical) -> its first name (the one a checkpoint holds)."""
    first: dict[int, str] = {}
    ties: dict[str, str] = {}
    for key, p in model.named_parameters(remove_duplicate=False):
        name = canonical(key)
        if id(p) in first and first[id(p)] != name:
            ties[name] = first[id(p)]
        first.setdefault(id(p), name)
    return ties


def fill_own_shards_from_files(
    model: Any,
    model_dir: str | Path,
    dtype: Any,
    ties: Mapping[str, str] | None = None,
    names: Mapping[str, str] | None = None,
    read: dict[str, int] | None = None,
) -> set[str]:
    """This rank's part of every parameter and buffer the checkpoint holds, read from its
    safetensors files (the rows it holds only), a tied name's from its first name's; the
    parameter names filled. ``names``: the checkpoint's names -> the model's (:func:`checkpoint_names`;
    None: the same names). ``read``, when given, gets ``elements_read`` (this rank's) of
    ``elements_in_files``."""
    from safetensors import safe_open

    if names is None:
        names = {n: n for path in safetensors_files(model_dir) for n in _header(path)}
    in_files = set(names.values())
    by_name: dict[str, list[tuple[str, Any]]] = {}
    for key, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]:
        name = canonical(key)
        if name not in in_files and ties and name in ties:
            name = ties[name]
        by_name.setdefault(name, []).append((key, t))
    filled: set[str] = set()
    done, total = 0, 0
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                targets = by_name.get(names.get(name, ""), [])
                if targets:  # a tied tensor fills each of its names (fully_shard untied them): counted once
                    total += math.prod(f.get_slice(name).get_shape())
                    done += max(copy_own_part(t, f.get_slice(name), dtype) for _, t in targets)
                    filled.update(key for key, _ in targets)
    if read is not None:
        read.update(elements_read=done, elements_in_files=total)
    return filled


def fsdp2_full_resume(trainer_cls: type, names_of: Callable[[str | Path], dict[str, str]] | None = None) -> type:
    """``trainer_cls`` (FSDP2's) resuming a full fine-tune: every rank reads its own part of the
    checkpoint's model files into its shards (the Trainer's own load copies plain tensors into DTensor
    parameters and fails), under the model's names for them (``names_of``: :func:`checkpoint_renamer`, taken
    before sharding; transformers saves a LLaVA under other names than its own); a PEFT model's adapter resumes
    the Trainer's way."""

    class FSDP2Resume(trainer_cls):  # type: ignore[misc]  # a class only known at run time
        def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
            if hasattr(self.model, "peft_config"):
                super()._load_from_checkpoint(resume_from_checkpoint, model)  # the Trainer's own (returns None)
                return None
            dtype = next(self.model.parameters()).dtype
            names = names_of(resume_from_checkpoint) if names_of is not None else None
            if not fill_own_shards_from_files(self.model, resume_from_checkpoint, dtype, names=names):
                raise ValueError(f"resume: {resume_from_checkpoint} holds no safetensors model files")
            return None

    return FSDP2Resume


# -- ZeRO-3 ------------------------------------------------------------------------------------
def zero3_stream_load(
    model: Any,
    model_dir: str | Path,
    *,
    rank: int,
    dtype: Any,
    names: Mapping[str, str] | None = None,
    read_out: dict[str, int] | None = None,
) -> int:
    """Fill a model built under ``zero.Init`` from the checkpoint: every rank reads only its own
    partition of each parameter from the safetensors files (their pages are the node's shared page
    cache) and writes it into the parameter's ``ds_tensor``, with no collective. Buffers load whole.
    DeepSpeed's layout: a parameter's flat elements padded to a multiple of the world size, rank
    ``r`` holding ``[r * size, (r + 1) * size)``. ``names``: the checkpoint's names -> the model's
    (:func:`checkpoint_names`, asked when not given); ``read_out``, when given, gets ``elements_read``
    (this rank's part) of ``elements_in_files``. Returns the number of tensors read.

    (Before: rank 0 read groups of whole tensors and every rank gathered each module to copy them
    in, so rank 0 held a group in two dtypes and every rank a gathered module: the load's peak.)"""
    import deepspeed.comm as ds_comm
    from safetensors import safe_open

    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    names = checkpoint_names(model, model_dir) if names is None else names
    read, elements, total = 0, 0, 0
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                key = names.get(name, "")
                if key not in params and key not in buffers:
                    continue
                numel = math.prod(f.get_slice(name).get_shape())
                total += numel
                read += 1
                if key in params and hasattr(params[key], "ds_tensor"):
                    param = params[key]
                    part_rank = ds_comm.get_rank(group=getattr(param, "ds_process_group", None))
                    elements += fill_partition(param.ds_tensor, f.get_slice(name), part_rank, param.ds_numel, dtype)
                else:  # a buffer, or a parameter left whole by zero.Init
                    target = params[key] if key in params else buffers[key]
                    target.data.copy_(f.get_tensor(name).to(target.dtype))
                    elements += numel
    if read_out is not None:
        read_out.update(elements_read=elements, elements_in_files=total)
    del rank  # every rank reads its own partition: no rank is special
    return read


def fill_partition(out: Any, tensor_slice: Any, part_rank: int, numel: int, dtype: Any) -> int:
    """``out`` (one rank's flat partition of ``len(out)`` elements) from a safetensors slice: the
    elements ``[part_rank * len(out), ...)`` of the tensor's flat view, zeros past its end. Reads
    only the rows that hold them, ``READ_BYTES`` at a time. Returns the number of elements filled."""
    size = out.numel()
    start, end = part_rank * size, min((part_rank + 1) * size, numel)
    out[max(end - start, 0) :].zero_()
    if start >= end:
        return 0
    shape = tensor_slice.get_shape()
    if not shape:  # a scalar
        out[: end - start].copy_(tensor_slice[()].reshape(-1)[start:end].to(dtype))
        return int(end - start)
    cols = 1
    for d in shape[1:]:
        cols *= d
    step_rows = max(1, READ_BYTES // (cols * out.element_size()))
    first, last = start // cols, -(-end // cols)
    for row in range(first, last, step_rows):
        rows = tensor_slice[row : min(row + step_rows, last)]
        lo, hi = max(start, row * cols), min(end, (row + rows.shape[0]) * cols)
        out[lo - start : hi - start].copy_(rows.reshape(-1)[lo - row * cols : hi - row * cols].to(dtype))
        del rows
    return int(end - start)


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


def sharded_base(cfg: RunConfig, folder: str | Path, dtype: Any, load: str, load_kwargs: dict[str, Any]) -> Any:
    """The base model for ``load`` = ``meta`` (FSDP2 skeleton) or ``zero3`` (partitioned, filled),
    built from ``folder``'s safetensors with the full load's options (``load_kwargs``)."""
    if load == "meta":
        return empty_skeleton(cfg, folder, dtype, load_kwargs)
    if load != "zero3":
        raise ValueError(f"unknown load mode {load!r}")
    import torch.distributed as dist
    from transformers.integrations import is_deepspeed_zero3_enabled

    if not is_deepspeed_zero3_enabled():
        raise RuntimeError(
            "zero3 loading needs the DeepSpeed config registered first (TrainingArguments(deepspeed=...))"
        )
    from cockpit.train.private_memory import trace

    ensure_deepspeed_comm()
    trace("zero3: before build")
    config, build = streamed_config(cfg, folder, load_kwargs)
    with mapped_large_allocations():
        with random_init_deferred() as deferred, construction_broadcast_skipped():
            model = auto_class(config).from_config(
                config, dtype=dtype, trust_remote_code=bool(cfg.trust_remote_code), **build
            )  # zero.Init
        gc.collect()  # the partitions of parameters the build replaced (a tied lm_head's own)
        trace("zero3: built")
        names = checkpoint_names(model, folder)  # StreamRefused: the caller loads it whole
        if not_all_parameters_in(model, folder, names):  # a parameter the checkpoint lacks gets transformers' init
            deferred(model)
        read: dict[str, int] = {}
        zero3_stream_load(model, folder, rank=dist.get_rank(), dtype=dtype, names=names, read_out=read)
        trace("zero3: filled")
    renamed = sum(1 for a, b in names.items() if a != b)
    print(
        f"zero3 streamed load: this rank read {read['elements_read']} of the checkpoint's {read['elements_in_files']} "
        f"elements" + (f"; {renamed} tensor names renamed as transformers loads them" if renamed else "")
    )
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


@contextmanager
def construction_broadcast_skipped() -> Iterator[None]:
    """``zero.Init`` broadcasts every new parameter whole from rank 0 before partitioning it, so
    that the ranks agree on its random values; each other rank then writes the whole tensor
    (measured: a 96 MiB tensor's pages resident on rank 1 only, its load peak). Inside this block
    a new parameter is partitioned without it, and its partition is left unwritten
    (:func:`give_untouched_partition`): every partition is then written by the streamed checkpoint
    or by transformers' init (gathered with rank 0's values), never used as it is."""
    from deepspeed.runtime.zero import partition_parameters as ds_partition

    original = ds_partition.Init._zero_init_param

    def partition_only(self: Any, param: Any) -> None:
        self._convert_to_deepspeed_param(param)
        give_untouched_partition(self, param)
        param.partition()  # already partitioned: only frees the whole tensor

    ds_partition.Init._zero_init_param = partition_only
    try:
        yield
    finally:
        ds_partition.Init._zero_init_param = original


def give_untouched_partition(init: Any, param: Any) -> None:
    """The partition DeepSpeed's ``_partition_param`` would allocate for ``param``, left unwritten
    (DeepSpeed copies the rank's part of the whole, never-used tensor into it): its pages become
    resident only when the checkpoint fills them, and a partition the build then drops (a tied
    lm_head's own) never does. Where DeepSpeed's partition is more than a tensor on the partition
    device (NVMe swap, quantised or pinned partitions) its own partitioning runs."""
    import torch
    from deepspeed.runtime.zero import partition_parameters as ds_partition

    offload = ds_partition.OffloadDeviceEnum
    if (
        param.ds_tensor is not None
        or init.remote_device == offload.nvme
        or getattr(init, "quantized_nontrainable_weights", False)
        or getattr(init, "pin_memory", False)
    ):
        return
    aligned = init._aligned_size(param)
    size = aligned // init._partition_world_size(param)
    device = init.local_device if param.ds_persist else init.remote_device
    part = torch.empty(size, dtype=param.dtype, device=device)
    part.requires_grad = False
    param.ds_tensor = part
    part.ds_numel = size
    part.status = ds_partition.PartitionedParamStatus.AVAILABLE
    part.final_location = None
    param.ds_numel_aligned = aligned


def not_all_parameters_in(model: Any, model_dir: str | Path, names: Mapping[str, str] | None = None) -> list[str]:
    """The model's parameters (tied ones once) that the checkpoint files do not hold (``names``:
    :func:`checkpoint_names`, asked when not given)."""
    held = set((checkpoint_names(model, model_dir) if names is None else names).values())
    return [n for n, _ in model.named_parameters() if n not in held]


def load_mode(cfg: RunConfig, ref: Any, zero3: bool, world_size: int) -> tuple[str, Weights]:
    """How this run's ranks build the base (:func:`cockpit.models.weights.sharded_load_mode`, the
    rule the planner's host line applies too), and where its weights are."""
    weights = weights_of(ref, fetch=True)
    return sharded_load_mode(weights, **strategy_facts(cfg, zero3, world_size)), weights


def strategy_facts(cfg: RunConfig, zero3: bool, world_size: int) -> dict[str, Any]:
    """What the load rule (:mod:`cockpit.models.weights`) asks of a run, from a rank's view of it."""
    return {
        "world_size": world_size,
        "quantized": bool(cfg.quantization_bit),
        "fsdp": bool(cfg.fsdp),
        "zero3": zero3,
    }
