"""The ROCm field guide (docs/rocm.md): failures known from public trackers, each caught before it costs a day.

Each item is a pure rule over plain facts (the environment, /proc/cmdline, sysfs, package versions, the
config's keys), so the doctor, ``cockpit check`` (:mod:`cockpit.preflight.rocm`) and the tests feed it the
same way. The doctor shows every item as a check of its own (ids in :data:`ITEMS`), "not applicable"
where this machine cannot meet it (a CPU-only torch, no AMD GPU); items whose check runs elsewhere (a
Live alert, the relaunch after a hang) say where.

Sources (searched 2026-12-06; cited in each message and in docs/rocm.md):

1. iommu: the MI300X system-optimization guide (rocm.docs.amd.com/en/latest/how-to/system-optimization/
   mi300x.html: ``iommu=pt``; ``amd_iommu=on`` on some platforms); ROCm/rccl#1026 (RCCL's warning) was
   not found in the searchable trackers.
2. allocator: pytorch/pytorch#123548 (``max_split_size_mb`` with ``expandable_segments:True``: reserved
   memory grows ~138 MiB a cycle until the device is full; fix proposed in pytorch/pytorch#193400).
3. 4-bit on CDNA: bitsandbytes-foundation/bitsandbytes#1887 (GEMV kernel's warp-64 fix; blocksize-64
   4-bit on warp-64 from #1856): :data:`cockpit.doctor.packages.BNB_GOOD_ROCM`.
4. compile: pytorch/pytorch#187715 (reduce-overhead's cudagraph trees on ROCm slow convergence; MI300X,
   ROCm 7.0, PyTorch 2.10). CUDA graphs reach inductor through ``torch_compile_mode`` reduce-overhead or
   max-autotune (``torch._inductor.list_mode_options``: ``triton.cudagraphs``) and through
   ``TORCHINDUCTOR_CUDAGRAPHS=1``; this rule refuses both on ROCm.
5. device masks: ray-project/ray#53737 (both ROCR_ and HIP_VISIBLE_DEVICES set: Ray refuses to import),
   ray-project/ray#52701, Parsl/parsl#3858 (ROCR + CUDA_VISIBLE_DEVICES: no GPU left).
6. slow steps: ROCm/rocm-systems#4084 (bf16 GEMMs ~600 ms each on gfx942, ROCm >= 7.1, a hipBLASLt
   cu-fallback scan); ROCm/TheRock#7696 (attention regression) was not found in the searchable trackers.
7. early gradient norms: hiyouga/LlamaFactory#7890 (MI300X, grad_norm in the thousands from the start,
   with or without FlashAttention).
8. GRPO + vLLM in-process: huggingface/open-r1#482 (hangs as training starts on 8x MI300X; without vLLM
   it trains).
9. attention backends: which SDPA backends and FlashAttention-2 run on this gfx target (the doctor's
   ``--gpu-smoke``); CK FlashAttention-2 builds for gfx90a / gfx942 / gfx950, other targets need the
   Triton backend (``FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE``).
10. hang evidence: PyTorch's flight recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE``,
    ``TORCH_NCCL_DUMP_ON_TIMEOUT``), set by the relaunch with debug logging.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.doctor.model import PASS, SKIP, WARN, Check, Context, read_text
from cockpit.telemetry.step_health import EARLY_GRAD_NORM, SLOW_STEP_MFU  # Live's alerts (items 6, 7)

DOC = "docs/rocm.md"


@dataclass(frozen=True)
class Item:
    number: int
    id: str
    title: str
    source: str


ITEMS: tuple[Item, ...] = (
    Item(1, "iommu", "IOMMU kernel settings (RCCL)", "rocm.docs.amd.com MI300X system optimization; ROCm/rccl#1026"),
    Item(2, "alloc_conf", "allocator settings", "pytorch/pytorch#123548"),
    Item(3, "qlora_cdna", "4-bit QLoRA on CDNA", "bitsandbytes-foundation/bitsandbytes#1887"),
    Item(4, "compile_mode", "torch.compile CUDA graphs on ROCm", "pytorch/pytorch#187715"),
    Item(5, "device_masks", "GPU masks (ROCR/HIP/CUDA_VISIBLE_DEVICES)", "ray-project/ray#53737"),
    Item(6, "slow_step", "slow-step alert (MFU)", "ROCm/rocm-systems#4084; ROCm/TheRock#7696"),
    Item(7, "early_grad_norm", "early gradient-norm alert", "hiyouga/LlamaFactory#7890"),
    Item(8, "vllm_colocate", "GRPO with vLLM in-process on ROCm", "huggingface/open-r1#482"),
    Item(9, "attention", "attention backends on this GPU", "Dao-AILab/flash-attention (ROCm: CK / Triton)"),
    Item(10, "flight_recorder", "hang evidence (flight recorder)", "pytorch flight recorder (TORCH_NCCL_*)"),
)
BY_ID = {i.id: i for i in ITEMS}
FIELD_IDS = tuple(i.id for i in ITEMS)

# CK FlashAttention-2 (ROCm/flash-attention's default backend) targets; others need its Triton backend
CK_FA2_TARGETS = ("gfx90a", "gfx942", "gfx950")
CDNA_TARGETS = ("gfx90a", "gfx942", "gfx950")
MASK_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
ALLOC_VARS = ("PYTORCH_HIP_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def cite(check_id: str) -> str:
    """The message's tail: where the remedy comes from and where the guide explains it."""
    item = BY_ID[check_id]
    return f"(source: {item.source}; {DOC} item {item.number})"


def _check(check_id: str, status: str, seen: str, fix: str = "", tags: frozenset[str] = frozenset(), **data: Any):
    item = BY_ID[check_id]
    data = {"item": item.number, "source": item.source, "doc": DOC, **data}
    return Check(check_id, f"{item.number}. {item.title}", status, seen, fix, tags, data)


def not_applicable(check_id: str, why: str, tags: frozenset[str] = frozenset({"rocm"})) -> Check:
    return _check(check_id, SKIP, f"not applicable: {why}", "", tags)


# -- facts ---------------------------------------------------------------------------------------
def gfx_name(version: int) -> str:
    """KFD's gfx_target_version (90010, 90402, 90500) -> 'gfx90a', 'gfx942', 'gfx950'."""
    major, minor, step = version // 10000, (version // 100) % 100, version % 100
    return f"gfx{major}{minor:x}{step:x}"


def kfd_targets(sys_root: Path) -> list[str]:
    """The GPUs' gfx targets from KFD's topology (/sys/class/kfd/kfd/topology/nodes/*/properties; CPU
    nodes say 0): no torch, no ROCm userspace."""
    base = sys_root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    found: list[str] = []
    try:
        nodes = sorted(base.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0)
    except OSError:
        return found
    for node in nodes:
        m = re.search(r"^gfx_target_version\s+(\d+)", read_text(node / "properties") or "", re.M)
        if m and int(m.group(1)) > 0:
            found.append(gfx_name(int(m.group(1))))
    return found


def listed(value: str | None) -> list[str]:
    return [p.strip() for p in (value or "").split(",") if p.strip()]


# -- the rules (pure) ------------------------------------------------------------------------------
def iommu_problem(cmdline: str, amd_cpu: bool) -> tuple[list[str], str] | None:
    """Item 1: ``iommu=pt`` missing from /proc/cmdline, and the GRUB line that adds it (with
    ``amd_iommu=on`` where the CPU is AMD's and it is not set: some platforms need it, others have it on
    by default, so its absence alone is no warning)."""
    args = cmdline.split()
    if "iommu=pt" in args:
        return None
    add = ["iommu=pt"] + (["amd_iommu=on"] if amd_cpu and not any(a.startswith("amd_iommu=") for a in args) else [])
    fix = (
        f'add "{" ".join(add)}" to GRUB_CMDLINE_LINUX in /etc/default/grub, then sudo update-grub '
        "(grub2-mkconfig -o /boot/grub2/grub.cfg on RHEL) and reboot"
        + (" (amd_iommu=on: on the platforms that need it)" if len(add) > 1 else "")
    )
    return ["iommu=pt"], fix


def alloc_conf_problem(env: Mapping[str, str]) -> tuple[str, str] | None:
    """Item 2: an allocator variable that sets ``max_split_size_mb`` together with
    ``expandable_segments:True`` (pytorch#123548). (variable, its value)."""
    for var in ALLOC_VARS:
        value = env.get(var, "")
        parts = {p.split(":", 1)[0].strip(): p.split(":", 1)[-1].strip() for p in value.split(",") if ":" in p}
        if "max_split_size_mb" in parts and parts.get("expandable_segments", "").lower() == "true":
            return var, value
    return None


def alloc_conf_message(var: str, value: str) -> str:
    return (
        f"{var}={value!r} sets max_split_size_mb with expandable_segments:True: reserved memory grows "
        "cycle by cycle until the GPU is full; keep one of them (expandable_segments:True alone) " + cite("alloc_conf")
    )


def qlora_cdna_problem(targets: list[str], bnb_version: str | None, minimum: str) -> str | None:
    """Item 3: 4-bit weights on a warp-64 CDNA GPU with a bitsandbytes older than ``minimum``."""
    from cockpit.doctor.model import version_at_least

    cdna = sorted({t for t in targets if t in CDNA_TARGETS})
    if not cdna or bnb_version is None or version_at_least(bnb_version, minimum):
        return None
    return (
        f"4-bit on {', '.join(cdna)} needs bitsandbytes >= {minimum} (the warp-64 4-bit kernels); "
        f"bitsandbytes {bnb_version} is installed: pip install -U 'bitsandbytes>={minimum}' " + cite("qlora_cdna")
    )


# torch_compile_mode values whose inductor options turn CUDA graphs on (torch._inductor.list_mode_options)
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


def compile_mode_problem(env: Mapping[str, str], mode: str | None = None) -> str | None:
    """Item 4: CUDA graphs under torch.compile (reduce-overhead's cudagraph trees) on a ROCm build: from
    the config's ``torch_compile_mode``, or from the environment."""
    if mode in CUDAGRAPH_MODES:
        return (
            f"torch_compile_mode {mode} compiles with CUDA graphs (cudagraph trees), which slow convergence "
            "silently on ROCm; use torch_compile_mode: default (or max-autotune-no-cudagraphs) " + cite("compile_mode")
        )
    if env.get("TORCHINDUCTOR_CUDAGRAPHS") != "1":
        return None
    return (
        "TORCHINDUCTOR_CUDAGRAPHS=1 turns torch.compile's CUDA graphs on (what mode reduce-overhead does), "
        "which slows convergence silently on ROCm; unset it and keep torch_compile's default mode "
        + cite("compile_mode")
    )


def device_masks_problem(env: Mapping[str, str]) -> tuple[str, str] | None:
    """Item 5: masks set to different GPUs. (what contradicts, which mask wins)."""
    rocr, hip, cuda = (env.get(v) for v in MASK_VARS)
    if hip is not None and cuda is not None and listed(hip) != listed(cuda):
        return (
            f"HIP_VISIBLE_DEVICES={hip!r} and CUDA_VISIBLE_DEVICES={cuda!r} differ",
            "on ROCm torch reads HIP_VISIBLE_DEVICES and ignores CUDA_VISIBLE_DEVICES; the telemetry and "
            "other tools may read the other one",
        )
    index = hip if hip is not None else cuda
    if rocr is not None and index is not None and listed(rocr) != listed(index):
        name = "HIP_VISIBLE_DEVICES" if hip is not None else "CUDA_VISIBLE_DEVICES"
        return (
            f"ROCR_VISIBLE_DEVICES={rocr!r} and {name}={index!r} name different GPUs",
            f"ROCR_VISIBLE_DEVICES masks first; {name} then indexes what is left (its {index!r} are "
            "positions among the ROCR GPUs, not GPU ids): the ranks see other GPUs than the planner and "
            "the telemetry, or none",
        )
    return None


MASKS_FIX = "set one of them: ROCR_VISIBLE_DEVICES alone, or HIP_VISIBLE_DEVICES alone"


def device_masks_message(what: str, wins: str) -> str:
    return f"{what}: {wins}; {MASKS_FIX} " + cite("device_masks")


def vllm_colocate_problem(stage: str, use_vllm: bool, vllm_mode: str) -> str | None:
    """Item 8: GRPO generating with vLLM inside the training processes on ROCm."""
    if stage != "grpo" or not use_vllm or vllm_mode != "colocate":
        return None
    return (
        "use_vllm with vllm_mode: colocate (vLLM inside the training processes) hangs as training starts "
        "on MI300X; set vllm_mode: server (start `trl vllm-serve` first) " + cite("vllm_colocate")
    )


def fa2_problem(targets: list[str], env: Mapping[str, str]) -> str | None:
    """Item 9: ``flash_attn: fa2`` on a GPU that AMD's CK FlashAttention-2 has no kernels for, without
    its Triton backend."""
    other = sorted({t for t in targets if t not in CK_FA2_TARGETS})
    if not other or env.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "").upper() == "TRUE":
        return None
    return (
        f"flash_attn: fa2 on {', '.join(other)}: ROCm's FlashAttention-2 (CK) builds for "
        f"{', '.join(CK_FA2_TARGETS)} only; set FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE (its Triton backend) "
        "in env, or flash_attn: sdpa " + cite("attention")
    )


# -- the doctor's checks ---------------------------------------------------------------------------
def amd_gpus(ctx: Context) -> list[dict[str, Any]]:
    from cockpit.doctor.host import gpu_numa_map

    return [g for g in gpu_numa_map(ctx) if g["vendor"] == "AMD"]


def check_iommu(ctx: Context) -> Check:
    """Item 1: /proc/cmdline on a host with AMD GPUs."""
    tags = frozenset({"multi_gpu", "rocm"})
    if not amd_gpus(ctx):
        return not_applicable("iommu", "no AMD GPU in sysfs", tags)
    cmdline = read_text(ctx.roots.proc / "cmdline")
    if cmdline is None:
        return not_applicable("iommu", f"{ctx.roots.proc / 'cmdline'} not readable", tags)
    amd_cpu = "AuthenticAMD" in (read_text(ctx.roots.proc / "cpuinfo") or "")
    found = iommu_problem(cmdline, amd_cpu)
    if found is None:
        return _check("iommu", PASS, "iommu=pt is on the kernel command line", "", tags, cmdline=cmdline)
    missing, fix = found
    seen = f"kernel command line lacks {' '.join(missing)}: RCCL warns multi-GPU runs can hang without it"
    return _check("iommu", WARN, seen, f"{fix} {cite('iommu')}", tags, cmdline=cmdline, missing=missing)


def check_alloc_conf(ctx: Context) -> Check:
    tags = frozenset({"gpu"})
    found = alloc_conf_problem(ctx.env)
    set_vars = {v: ctx.env[v] for v in ALLOC_VARS if v in ctx.env}
    if ctx.facts.build not in ("rocm", "cuda"):
        why = "no GPU build of torch" + (" (the CPU ignores the allocator settings)" if set_vars else "")
        return not_applicable("alloc_conf", why, tags)
    if found is None:
        seen = ", ".join(f"{k}={v!r}" for k, v in set_vars.items()) or "no allocator settings (torch's defaults)"
        return _check("alloc_conf", PASS, seen, "", tags, set=set_vars)
    var, value = found
    fix = f"export {var}=expandable_segments:True (drop max_split_size_mb) {cite('alloc_conf')}"
    return _check("alloc_conf", ctx.severity("gpu"), alloc_conf_message(var, value), fix, tags, set=set_vars)


def rocm_targets(ctx: Context) -> list[str]:
    """The GPUs' gfx targets: torch's devices on a ROCm build, else KFD's topology in sysfs."""
    from_torch = [d.target for d in ctx.facts.devices if d.target]
    return from_torch or kfd_targets(ctx.roots.sys)


def _no_rocm(ctx: Context, check_id: str, tags: frozenset[str] = frozenset({"rocm"})) -> Check | None:
    if ctx.facts.build != "rocm":
        return not_applicable(check_id, "not a ROCm build of torch", tags)
    return None


def _key(ctx: Context, name: str, default: Any = None) -> Any:
    return (ctx.keys or {}).get(name, default)


def check_qlora_cdna(ctx: Context) -> Check:
    """Item 3 (``cockpit check`` refuses it; the bitsandbytes check runs the kernels)."""
    from cockpit import side_site
    from cockpit.doctor.packages import BNB_GOOD_ROCM

    tags = frozenset({"qlora"})
    if (na := _no_rocm(ctx, "qlora_cdna", tags)) is not None:
        return na
    targets = rocm_targets(ctx)
    found = side_site.installed_at("bitsandbytes", ctx.env)
    version = found[0] if found else None
    data = {"targets": targets, "bitsandbytes": version, "minimum": BNB_GOOD_ROCM}
    if not any(t in CDNA_TARGETS for t in targets):
        return _check(
            "qlora_cdna", SKIP, f"not applicable: no CDNA GPU ({', '.join(targets) or 'none'})", "", tags, **data
        )
    problem = qlora_cdna_problem(targets, version, BNB_GOOD_ROCM)
    if problem is None:
        seen = f"bitsandbytes {version} on {', '.join(targets)}" if version else "bitsandbytes not installed"
        return _check("qlora_cdna", PASS if version else SKIP, seen, "", tags, **data)
    fix = f"pip install -U 'bitsandbytes>={BNB_GOOD_ROCM}' {cite('qlora_cdna')}"
    return _check("qlora_cdna", ctx.severity("qlora"), problem, fix, tags, **data)


def check_compile_mode(ctx: Context) -> Check:
    if (na := _no_rocm(ctx, "compile_mode")) is not None:
        return na
    mode = _key(ctx, "torch_compile_mode")
    problem = compile_mode_problem(ctx.env, mode)
    if problem is None:
        return _check("compile_mode", PASS, "torch.compile without CUDA graphs", "", frozenset({"rocm"}))
    status = WARN if not _key(ctx, "torch_compile") else ctx.severity("rocm")
    fix = "torch_compile_mode: default" if mode in CUDAGRAPH_MODES else "unset TORCHINDUCTOR_CUDAGRAPHS"
    return _check("compile_mode", status, problem, f"{fix} {cite('compile_mode')}", frozenset({"rocm"}))


def check_device_masks(ctx: Context) -> Check:
    """Item 5: the masks set, which one wins, and a contradiction (the gate refuses it)."""
    tags = frozenset({"gpu", "rocm"})
    set_vars = {v: ctx.env[v] for v in MASK_VARS if v in ctx.env}
    if not set_vars:
        return not_applicable("device_masks", "no GPU mask variable set", tags)
    found = device_masks_problem(ctx.env)
    index = "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in set_vars else "CUDA_VISIBLE_DEVICES"
    order = ["ROCR_VISIBLE_DEVICES masks first"] if "ROCR_VISIBLE_DEVICES" in set_vars else []
    order += [f"{index} indexes what is left"] if index in set_vars else []
    wins = ", then ".join(order)
    shown = ", ".join(f"{k}={v!r}" for k, v in set_vars.items())
    if found is None:
        return _check("device_masks", PASS, f"{shown} ({wins})", "", tags, set=set_vars)
    what, why = found
    status = ctx.severity("gpu") if ctx.facts.build in ("rocm", "cuda") else WARN
    return _check("device_masks", status, f"{what}: {why}", f"{MASKS_FIX} {cite('device_masks')}", tags, set=set_vars)


def check_vllm_colocate(ctx: Context) -> Check:
    if (na := _no_rocm(ctx, "vllm_colocate")) is not None:
        return na
    problem = vllm_colocate_problem(
        _key(ctx, "stage", ""), bool(_key(ctx, "use_vllm")), _key(ctx, "vllm_mode", "colocate")
    )
    if ctx.keys is None:
        return _check(
            "vllm_colocate",
            PASS,
            "cockpit check refuses grpo's use_vllm with vllm_mode: colocate here",
            "",
            frozenset({"rocm"}),
        )
    if problem is None:
        return _check(
            "vllm_colocate",
            PASS,
            "this config does not run vLLM inside the training processes",
            "",
            frozenset({"rocm"}),
        )
    return _check(
        "vllm_colocate",
        ctx.severity("rocm"),
        problem,
        "vllm_mode: server " + cite("vllm_colocate"),
        frozenset({"rocm"}),
    )


def check_attention(ctx: Context) -> Check:
    """Item 9: FlashAttention-2 on these targets; the backends that run come from ``--gpu-smoke``."""
    if (na := _no_rocm(ctx, "attention", frozenset({"gpu"}))) is not None:
        return na
    import importlib.util

    targets = rocm_targets(ctx)
    fa = importlib.util.find_spec("flash_attn") is not None
    problem = fa2_problem(targets, ctx.env)
    data = {"targets": targets, "flash_attn_installed": fa}
    if problem is not None and fa:
        status = ctx.severity("gpu") if _key(ctx, "flash_attn") == "fa2" else WARN
        return _check("attention", status, problem, "flash_attn: sdpa " + cite("attention"), frozenset({"gpu"}), **data)
    seen = f"flash-attn {'installed' if fa else 'not installed (fa2 refused at check)'} on {', '.join(targets) or 'no GPU'}"
    return _check(
        "attention", PASS, seen + "; which backends run: cockpit doctor --gpu-smoke", "", frozenset({"gpu"}), **data
    )


def check_live_alert(ctx: Context, check_id: str, what: str) -> Check:
    """Items 6 and 7: Live alerts computed in the ranks; the doctor says they watch, on a GPU."""
    if ctx.facts.build not in ("rocm", "cuda"):
        return not_applicable(check_id, "no GPU build of torch (watched live on a GPU)", frozenset({"gpu"}))
    return _check(check_id, PASS, f"watched live: {what}", "", frozenset({"gpu"}))


def check_slow_step(ctx: Context) -> Check:
    return check_live_alert(ctx, "slow_step", f"a slow_step alert below {SLOW_STEP_MFU:.0%} MFU after warm-up")


def check_early_grad_norm(ctx: Context) -> Check:
    what = f"an early_grad_norm alert at a first-steps gradient norm >= {EARLY_GRAD_NORM:g} or far above the run's later median"
    return check_live_alert(ctx, "early_grad_norm", what)


def check_flight_recorder(ctx: Context) -> Check:
    """Item 10: the relaunch after a hang sets the flight recorder; here: whether it is set already."""
    tags = frozenset({"multi_gpu"})
    if ctx.facts.build not in ("rocm", "cuda"):
        return not_applicable("flight_recorder", "no GPU build of torch (no RCCL/NCCL collectives)", tags)
    size = ctx.env.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
    seen = (
        f"TORCH_NCCL_TRACE_BUFFER_SIZE={size}"
        if size
        else "off until a hang: Live's relaunch with debug logging sets it"
    )
    return _check("flight_recorder", PASS, seen, "", tags)


CHECKS = (
    ("iommu", check_iommu),
    ("alloc_conf", check_alloc_conf),
    ("qlora_cdna", check_qlora_cdna),
    ("compile_mode", check_compile_mode),
    ("device_masks", check_device_masks),
    ("slow_step", check_slow_step),
    ("early_grad_norm", check_early_grad_norm),
    ("vllm_colocate", check_vllm_colocate),
    ("attention", check_attention),
    ("flight_recorder", check_flight_recorder),
)
