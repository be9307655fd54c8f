"""cockpit.doctor against scripted machines: fake ROCm trees, sysfs/procfs, PATHs and device facts.

Every test runs the real check code; only the inputs are fake (a temp-dir /opt/rocm, /sys,
/proc, /dev, shell scripts standing in for numactl/gcc/hipcc, and TorchFacts for GPUs this
machine does not have).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from cockpit.doctor import CHECK_IDS, FAIL, PASS, SKIP, WARN, Check, DeviceFacts, Roots, TorchFacts, blocking_failures, run_checks
from cockpit.doctor.facts import base_target, parse_arch_list, target_for
from cockpit.doctor.host import DISK_FAIL, DISK_WARN, disk_status
from cockpit.doctor.model import version_at_least

GiB = 2**30
MI250X = ("AMD Instinct MI250X/MI250", "gfx90a:sramecc+:xnack-")
MI300X = ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-")


# -- builders --------------------------------------------------------------------------------
def write(path: Path, text: str = "", mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)
    return path


def script(bindir: Path, name: str, body: str) -> Path:
    return write(bindir / name, "#!/bin/sh\n" + body + "\n", 0o755)


def rocm_facts(tmp: Path, kinds=(MI250X, MI250X), hip="6.3.42131-fa1d09cbd", arch_list=("gfx90a", "gfx942"), **kw) -> TorchFacts:
    devices = [DeviceFacts(i, name, 64 * GiB, arch) for i, (name, arch) in enumerate(kinds)]
    lib = tmp / "torchlib"
    lib.mkdir(exist_ok=True)
    base = dict(
        importable=True, version="2.7.1+rocm6.3", hip=hip, cuda_available=bool(devices), device_count=len(devices),
        devices=devices, arch_list=list(arch_list), lib_dir=str(lib), nccl_version="2.21.5",
    )
    base.update(kw)
    return TorchFacts(**base)


def cpu_facts() -> TorchFacts:
    return TorchFacts(importable=True, version="2.13.0+cpu")


@pytest.fixture
def machine(tmp_path: Path) -> dict:
    return build_machine(tmp_path)


def build_machine(tmp_path: Path) -> dict:
    """A fake 2-socket MI250X box: ROCm 6.3 tree, sysfs, procfs, /dev/kfd, tools on PATH."""
    rocm = tmp_path / "rocm"
    write(rocm / ".info" / "version", "6.3.2-66\n")
    write(rocm / "include" / "hip" / "hip_runtime.h", "// hip\n")
    write(rocm / "include" / "rccl" / "rccl.h", "#define NCCL_MAJOR 2\n#define NCCL_MINOR 21\n#define NCCL_PATCH 5\n")
    for lib in ("librccl.so.1.0", "libamdhip64.so.6", "librocblas.so.4", "libhipblas.so.2"):
        write(rocm / "lib" / lib)
    script(rocm / "bin", "hipcc", "echo hipcc")
    script(rocm / "bin", "hipconfig", "echo 6.3.42131-fa1d09cbd")
    sys_ = tmp_path / "sys"
    for iface in ("lo", "eth0", "ib0"):
        (sys_ / "class" / "net" / iface).mkdir(parents=True)
    for node in ("node0", "node1"):
        (sys_ / "devices" / "system" / "node" / node).mkdir(parents=True)
    for card, bdf, node in (("card0", "0000:c1:00.0", "0"), ("card1", "0000:c6:00.0", "1")):
        dev = sys_ / "class" / "drm" / card / "device"
        write(dev / "vendor", "0x1002\n")
        write(dev / "class", "0x038000\n")
        write(dev / "numa_node", node + "\n")
        write(dev / "uevent", f"DRIVER=amdgpu\nPCI_SLOT_NAME={bdf}\n")
    (sys_ / "class" / "drm" / "card0-DP-1").mkdir()  # a connector, not a card
    proc = tmp_path / "proc"
    write(proc / "sys" / "kernel" / "numa_balancing", "1\n")
    write(proc / "meminfo", "MemTotal:       527000000 kB\nMemFree:        400000000 kB\nMemAvailable:   500000000 kB\n")
    dev = tmp_path / "dev"
    write(dev / "kfd")
    bindir = tmp_path / "bin"
    script(bindir, "numactl", 'echo "available: 2 nodes (0-1)"\necho "node 0 cpus: 0 1"')
    script(bindir, "gcc", 'echo "12.2.0"')
    roots = Roots(rocm=rocm, sys=sys_, proc=proc, dev=dev, runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache", ld_cache=False)
    # no side folders of the README's install (cockpit/side_site.py) on the fake box
    sides = {"COCKPIT_LOWRANK_SITE": str(tmp_path / "lowrank-site"), "COCKPIT_TRACKERS_SITE": str(tmp_path / "trackers-site")}
    env = {"PATH": str(bindir), "ROCM_PATH": str(rocm), **sides}
    return {"tmp": tmp_path, "roots": roots, "env": env, "bin": bindir, "rocm": rocm, "sys": sys_, "proc": proc}


def by_id(checks: list[Check]) -> dict[str, Check]:
    return {c.id: c for c in checks}


def run(m: dict, facts: TorchFacts, env_extra: dict | None = None, **kw) -> dict[str, Check]:
    env = dict(m["env"], **(env_extra or {}))
    checks = run_checks(env=env, roots=m["roots"], facts=facts, **kw)
    for c in checks:  # the contract: every warning and failure says what to do
        assert c.status not in (WARN, FAIL) or c.fix, c
    return by_id(checks)


# -- gfx targets and PYTORCH_ROCM_ARCH ------------------------------------------------------
def test_target_helpers():
    assert base_target("gfx90a:sramecc+:xnack-") == "gfx90a"
    assert parse_arch_list("gfx90a;gfx942 gfx950,gfx908:xnack+") == ["gfx90a", "gfx942", "gfx950", "gfx908"]
    assert target_for("AMD Instinct MI300X", "") == "gfx942"
    assert target_for("AMD Instinct MI250X/MI250", "") == "gfx90a"
    assert target_for("AMD Instinct MI355X", "") == "gfx950"
    assert target_for("whatever", "gfx942:sramecc+:xnack-") == "gfx942"


def test_rocm_arch_mismatch_fails_with_exact_export(machine):
    c = run(machine, rocm_facts(machine["tmp"]), {"PYTORCH_ROCM_ARCH": "gfx942"})
    arch = c["rocm_arch"]
    assert arch.status == FAIL
    assert "export PYTORCH_ROCM_ARCH=gfx90a" in arch.fix
    assert "gfx90a" in arch.seen and "invalid device function" in arch.seen and "illegal-instruction" in arch.seen
    assert {"build", "deepspeed"} <= arch.matters_for
    blocked = blocking_failures(c.values(), {"gpu", "rocm", "deepspeed"})
    assert arch in blocked
    assert arch not in blocking_failures(c.values(), {"gpu", "rocm"})  # nothing compiled: unaffected


def test_rocm_arch_covered_unset_and_mixed(machine):
    facts = rocm_facts(machine["tmp"])
    assert run(machine, facts, {"PYTORCH_ROCM_ARCH": "gfx90a;gfx942"})["rocm_arch"].status == PASS
    unset = run(machine, facts)["rocm_arch"]
    assert unset.status == PASS and "export PYTORCH_ROCM_ARCH=gfx90a" in unset.seen
    mixed = run(machine, rocm_facts(machine["tmp"], kinds=(MI250X, MI300X)), {"PYTORCH_ROCM_ARCH": "gfx90a"})
    assert mixed["rocm_arch"].status == FAIL
    assert 'export PYTORCH_ROCM_ARCH="gfx90a;gfx942"' in mixed["rocm_arch"].fix
    assert mixed["gpu_devices"].status == WARN  # unlike GPUs in one run


def test_rocm_arch_from_product_name_when_no_gcn_arch(machine):
    facts = rocm_facts(machine["tmp"], kinds=(("AMD Instinct MI300X", ""),))
    assert "PYTORCH_ROCM_ARCH=gfx942" in run(machine, facts, {"PYTORCH_ROCM_ARCH": "gfx90a"})["rocm_arch"].fix


def test_torch_arch_list_and_override(machine):
    facts = rocm_facts(machine["tmp"], kinds=(MI300X,), arch_list=("gfx900", "gfx906", "gfx90a"))
    c = run(machine, facts)["torch_arch"]
    assert c.status == FAIL and "gfx942" in c.seen and "invalid device function" in c.seen
    ok = rocm_facts(machine["tmp"], kinds=(MI300X,))
    assert run(machine, ok)["torch_arch"].status == PASS
    forced = run(machine, ok, {"HSA_OVERRIDE_GFX_VERSION": "9.4.2"})["torch_arch"]
    assert forced.status == WARN and "unset HSA_OVERRIDE_GFX_VERSION" in forced.fix


# -- devices visible ------------------------------------------------------------------------
def test_visible_devices(machine):
    facts = rocm_facts(machine["tmp"])
    assert run(machine, facts)["gpu_visible"].status == PASS
    more = run(machine, facts, {"HIP_VISIBLE_DEVICES": "0,1,2,3"})["gpu_visible"]
    assert more.status == WARN and "lists 4" in more.seen and "sees 2" in more.seen
    both = run(machine, facts, {"HIP_VISIBLE_DEVICES": "0,1", "ROCR_VISIBLE_DEVICES": "0,1"})["gpu_visible"]
    assert both.status == WARN and "ROCR_VISIBLE_DEVICES" in both.fix
    differ = run(machine, facts, {"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "1,0"})["gpu_visible"]
    assert differ.status == WARN and "differ" in differ.seen


def test_no_gpu_visible(machine):
    none = rocm_facts(machine["tmp"], kinds=(), cuda_available=False)
    c = run(machine, none)["gpu_visible"]
    assert c.status == FAIL and "render" in c.fix
    hidden = run(machine, none, {"HIP_VISIBLE_DEVICES": ""})["gpu_visible"]
    assert hidden.status == FAIL and "hides every GPU" in hidden.fix


def test_cpu_only_torch_is_a_warning_unless_gpu_needed(machine):
    c = run(machine, cpu_facts())
    assert c["torch"].status == WARN and "CPU-only" in c["torch"].seen
    assert "rocm6.3" in c["torch"].fix  # ROCm 6.3 is installed: say which wheel
    assert c["gpu_visible"].status == SKIP and c["rocm_arch"].status == SKIP and c["rccl"].status == SKIP
    needed = run(machine, cpu_facts(), needs={"gpu"})
    assert needed["torch"].status == FAIL and needed["gpu_visible"].status == FAIL
    assert needed["torch"] in blocking_failures(needed.values(), {"gpu"})


def test_cuda_torch_on_a_rocm_machine(machine):
    facts = TorchFacts(importable=True, version="2.7.1+cu126", cuda="12.6")
    c = run(machine, facts)
    assert c["torch"].status == WARN and "CUDA build" in c["torch"].seen
    assert "whl/rocm6.3" in c["torch"].fix
    assert c["gpu_visible"].status == FAIL and "ROCm build" in c["gpu_visible"].fix  # the CUDA wheel sees no GPU here


def test_torch_not_importable(machine):
    c = run(machine, TorchFacts(importable=False, error="ImportError: no torch"))
    assert c["torch"].status == FAIL and not c["torch"].matters_for  # blocks every config
    assert c["smoke"].status == SKIP


# -- the fake ROCm box end to end -----------------------------------------------------------
def test_fake_rocm_machine(machine):
    c = run(machine, rocm_facts(machine["tmp"]))
    assert [*c] == list(CHECK_IDS)
    assert c["rocm_version"].status == PASS and "6.3.2" in c["rocm_version"].seen
    assert c["rocm_dev"].status == PASS
    assert c["compilers"].status == PASS and "gcc 12.2.0" in c["compilers"].seen and "hipcc" in c["compilers"].seen
    assert c["rccl"].status == PASS and "2.21.5" in c["rccl"].seen and "librccl.so.1.0" in c["rccl"].seen
    assert c["kfd"].status == PASS
    assert c["numactl"].status == PASS and c["numactl"].data["nodes"] == 2
    nb = c["numa_balancing"]
    assert nb.status == WARN and "sudo sysctl kernel.numa_balancing=0" in nb.fix and nb.matters_for == {"numa"}
    gn = c["gpu_numa"]
    assert gn.status == PASS and [g["numa_node"] for g in gn.data["gpus"]] == [0, 1]
    assert "0000:c6:00.0" in gn.seen and "bind each rank" in gn.seen
    assert c["host_memory"].status == PASS and c["host_memory"].data["total"] == 527000000 * 1024
    assert c["comm_env"].status == PASS
    assert all(not ch.data.get("crashed") for ch in c.values())
    json.dumps([ch.to_dict() for ch in c.values()])


def test_rocm_version_from_hipconfig_and_mismatch(machine):
    (machine["rocm"] / ".info" / "version").unlink()
    c = run(machine, rocm_facts(machine["tmp"], hip="6.2.41133-dd7f95766"))["rocm_version"]
    assert c.status == WARN and "hipconfig" in c.seen and "6.2" in c.seen


@pytest.mark.slow
def test_no_rocm_tree(machine, tmp_path):
    roots = Roots(rocm=tmp_path / "nope", sys=machine["roots"].sys, proc=machine["roots"].proc, dev=machine["roots"].dev, runs_dir=tmp_path, cache_dir=tmp_path, ld_cache=False)
    c = by_id(run_checks(env={"PATH": str(machine["bin"])}, roots=roots, facts=rocm_facts(tmp_path)))
    assert c["rocm_version"].status == WARN and "no ROCm install" in c["rocm_version"].seen
    assert c["rocm_dev"].status == SKIP
    assert c["compilers"].status == WARN and "no hipcc" in c["compilers"].seen
    strict = by_id(run_checks(env={"PATH": str(machine["bin"])}, roots=roots, facts=rocm_facts(tmp_path), needs={"build"}))
    assert strict["rocm_version"].status == FAIL and strict["compilers"].status == FAIL


def test_rocm_root_from_env(machine):
    roots = Roots.from_env({"ROCM_PATH": str(machine["rocm"])}, sys=machine["sys"])
    assert roots.rocm == machine["rocm"] and roots.sys == machine["sys"] and roots.proc == Path("/proc")
    c = by_id(run_checks(env=machine["env"], roots={"sys": machine["sys"], "proc": machine["proc"], "ld_cache": False}, facts=rocm_facts(machine["tmp"]), only=["rocm_version"]))
    assert c["rocm_version"].status == PASS  # found through ROCM_PATH in env


def test_rocm_dev_missing_pieces(machine):
    (machine["rocm"] / "include" / "hip" / "hip_runtime.h").unlink()
    (machine["rocm"] / "lib" / "librocblas.so.4").unlink()
    c = run(machine, rocm_facts(machine["tmp"]))["rocm_dev"]
    assert c.status == WARN and "hip_runtime.h" in c.seen and "librocblas.so" in c.seen


def test_old_gcc(machine):
    script(machine["bin"], "gcc", 'echo "10.2.1"')
    c = run(machine, rocm_facts(machine["tmp"]))["compilers"]
    assert c.status == WARN and "gcc 10.2.1" in c.seen and "gcc >= 11" in c.fix
    script(machine["bin"], "clang", 'echo "Ubuntu clang version 15.0.7"')
    assert run(machine, rocm_facts(machine["tmp"]))["compilers"].status == PASS


# -- RCCL and the NCCL_* settings -----------------------------------------------------------
def test_rccl_bundled_with_torch(machine):
    facts = rocm_facts(machine["tmp"])
    write(Path(facts.lib_dir) / "librccl.so.1")
    c = run(machine, facts)["rccl"]
    assert c.status == PASS and "bundled with torch" in c.seen


def test_rccl_missing(machine):
    (machine["rocm"] / "lib" / "librccl.so.1.0").unlink()
    facts = rocm_facts(machine["tmp"])
    assert run(machine, facts)["rccl"].status == WARN
    strict = run(machine, facts, needs={"multi_gpu"})["rccl"]
    assert strict.status == FAIL and strict in blocking_failures([strict], {"multi_gpu"})


def comm(machine, **env) -> Check:
    return run(machine, rocm_facts(machine["tmp"]), env, only=["comm_env"])["comm_env"]


def test_comm_env_p2p_debug_algo(machine):
    c = comm(machine, NCCL_P2P_DISABLE="1", NCCL_DEBUG="TRACE", NCCL_ALGO="Ring")
    assert c.status == WARN
    assert "unset NCCL_P2P_DISABLE" in c.fix and "NCCL_DEBUG=WARN" in c.fix and "unset NCCL_ALGO" in c.fix
    assert len(c.data["findings"]) == 3 and c.data["settings"]["NCCL_DEBUG"] == "TRACE"
    assert comm(machine, NCCL_DEBUG="INFO", NCCL_P2P_DISABLE="0").status == PASS


def test_comm_env_net_plugin(machine):
    c = comm(machine, NCCL_NET_PLUGIN="aws-ofi")
    assert c.status == WARN and "librccl-net-aws-ofi.so" in c.seen
    write(machine["rocm"] / "lib" / "librccl-net-aws-ofi.so")
    assert comm(machine, NCCL_NET_PLUGIN="aws-ofi").status == PASS
    assert comm(machine, RCCL_NET_PLUGIN="none").status == PASS
    assert comm(machine, NCCL_NET_PLUGIN=str(machine["tmp"] / "nope.so")).status == WARN


def test_comm_env_socket_ifname(machine):
    assert comm(machine, NCCL_SOCKET_IFNAME="eth").status == PASS  # a prefix
    assert comm(machine, NCCL_SOCKET_IFNAME="=eth0").status == PASS
    bad = comm(machine, NCCL_SOCKET_IFNAME="ens5")
    assert bad.status == FAIL and "export NCCL_SOCKET_IFNAME=eth0" in bad.fix and "no socket interface" in bad.seen
    assert comm(machine, NCCL_SOCKET_IFNAME="=eth").status == FAIL  # exact match only
    assert comm(machine, NCCL_SOCKET_IFNAME="^eth,lo,ib").status == FAIL  # excludes everything
    assert comm(machine, NCCL_SOCKET_IFNAME="^docker,lo").status == PASS


def test_comm_env_fine_grain_on_old_rocm(machine):
    write(machine["rocm"] / ".info" / "version", "5.6.0-67\n")
    c = comm(machine)
    assert c.status == WARN and "HSA_FORCE_FINE_GRAIN_PCIE=1" in c.fix
    assert comm(machine, HSA_FORCE_FINE_GRAIN_PCIE="1").status == PASS


# -- NUMA -----------------------------------------------------------------------------------
def test_numactl_missing_or_broken(machine, tmp_path):
    empty = tmp_path / "emptybin"
    empty.mkdir()
    c = by_id(run_checks(env={"PATH": str(empty)}, roots=machine["roots"], facts=cpu_facts(), only=["numactl"]))["numactl"]
    assert c.status == WARN and "not on PATH" in c.seen and "apt-get install numactl" in c.fix
    script(machine["bin"], "numactl", 'echo "numa_available failed" >&2; exit 1')
    assert run(machine, cpu_facts(), only=["numactl"])["numactl"].status == WARN


def test_numa_balancing_off_or_absent(machine):
    write(machine["proc"] / "sys" / "kernel" / "numa_balancing", "0\n")
    assert run(machine, cpu_facts(), only=["numa_balancing"])["numa_balancing"].status == PASS
    (machine["proc"] / "sys" / "kernel" / "numa_balancing").unlink()
    assert run(machine, cpu_facts(), only=["numa_balancing"])["numa_balancing"].status == SKIP


def test_gpu_numa_from_pci_bus_and_unknown_nodes(machine):
    import shutil

    shutil.rmtree(machine["sys"] / "class" / "drm")
    pci = machine["sys"] / "bus" / "pci" / "devices"
    for bdf, vendor, klass in (("0000:c1:00.0", "0x1002", "0x120000"), ("0000:00:14.0", "0x8086", "0x0c0330")):
        write(pci / bdf / "vendor", vendor)
        write(pci / bdf / "class", klass)
        write(pci / bdf / "numa_node", "-1")
    c = run(machine, cpu_facts(), only=["gpu_numa"])["gpu_numa"]
    assert c.status == WARN and len(c.data["gpus"]) == 1 and c.data["gpus"][0]["bdf"] == "0000:c1:00.0"


# -- disk, memory ---------------------------------------------------------------------------
def test_disk_and_memory(machine):
    assert disk_status(DISK_FAIL - 1) == FAIL and disk_status(DISK_WARN - 1) == WARN and disk_status(DISK_WARN) == PASS
    c = run(machine, cpu_facts(), only=["disk_runs", "disk_cache", "host_memory"])
    assert c["disk_runs"].data["path"] == str(machine["tmp"] / "runs")  # not created yet: parent measured
    assert c["disk_runs"].status in (PASS, WARN, FAIL) and "free at" in c["disk_runs"].seen
    write(machine["proc"] / "meminfo", "MemTotal: 8000000 kB\nMemAvailable: 1000000 kB\n")
    low = run(machine, cpu_facts(), only=["host_memory"])["host_memory"]
    assert low.status == FAIL and not low.matters_for
    write(machine["proc"] / "meminfo", "MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    assert run(machine, cpu_facts(), only=["host_memory"])["host_memory"].status == WARN


# -- optional packages: fake DeepSpeed / bitsandbytes on sys.path ----------------------------
@pytest.fixture
def site(tmp_path, monkeypatch):
    """A temp dir on sys.path for fake packages; their modules are dropped afterwards."""
    d = tmp_path / "site"
    d.mkdir()
    monkeypatch.syspath_prepend(str(d))
    for name in list(sys.modules):  # a real package imported earlier in this session must not shadow the fake
        if name.split(".")[0] in ("deepspeed", "bitsandbytes"):
            monkeypatch.delitem(sys.modules, name)
    before = set(sys.modules)
    yield d
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("deepspeed", "bitsandbytes"):
            del sys.modules[name]
    importlib.invalidate_caches()


FAKE_BUILDERS = """
class _B:
    def __init__(self, ok): self.ok = ok
    def is_compatible(self, verbose=False):
        print("noise from is_compatible")
        return self.ok
ALL_OPS = {"cpu_adam": _B(True), "fused_adam": _B(%s), "async_io": _B(False)}
"""


def fake_deepspeed(site: Path, fused_ok: bool) -> None:
    write(site / "deepspeed" / "__init__.py", "print('deepspeed says hi')\n__version__ = '0.16.9'\n")
    write(site / "deepspeed" / "ops" / "__init__.py")
    write(site / "deepspeed" / "ops" / "op_builder" / "__init__.py", FAKE_BUILDERS % fused_ok)
    write(site / "deepspeed" / "git_version_info.py", "installed_ops = {'cpu_adam': False, 'fused_adam': False, 'async_io': False}\n")
    write(site / "deepspeed-0.16.9.dist-info" / "METADATA", "Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.16.9\n")
    importlib.invalidate_caches()


def test_deepspeed_absent(machine):
    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("deepspeed is installed here")
    assert run(machine, cpu_facts(), only=["deepspeed"])["deepspeed"].status == SKIP
    needed = run(machine, cpu_facts(), only=["deepspeed"], needs={"deepspeed"})["deepspeed"]
    assert needed.status == FAIL and "cockpit-tune[deepspeed]" in needed.fix


def test_deepspeed_ops(machine, site, capsys):
    fake_deepspeed(site, fused_ok=False)
    c = run(machine, rocm_facts(machine["tmp"]), only=["deepspeed"])["deepspeed"]
    assert c.status == WARN and "cpu_adam" in c.seen and "cannot build: fused_adam, async_io" in c.seen
    assert c.data["ops"]["fused_adam"] == {"installed": False, "compatible": False}
    assert capsys.readouterr().out == ""  # the package's prints were kept off stdout


def test_deepspeed_ops_ok(machine, site):
    fake_deepspeed(site, fused_ok=True)
    script(machine["bin"], "ninja", "echo 1.11")
    c = run(machine, rocm_facts(machine["tmp"]), only=["deepspeed"])["deepspeed"]
    assert c.status == PASS and c.data["version"] == "0.16.9" and c.data["ninja"]


def fake_bnb(site: Path, version: str, libs=("libbitsandbytes_rocm63.so", "libbitsandbytes_cpu.so")) -> None:
    write(site / "bitsandbytes" / "__init__.py", f"__version__ = '{version}'\n")
    for lib in libs:
        write(site / "bitsandbytes" / lib)
    write(site / f"bitsandbytes-{version}.dist-info" / "METADATA", f"Metadata-Version: 2.1\nName: bitsandbytes\nVersion: {version}\n")
    importlib.invalidate_caches()


@pytest.mark.parametrize(
    ("version", "libs", "status"),
    [
        ("0.48.2", ("libbitsandbytes_rocm63.so",), FAIL),  # blocksize-64 4-bit broken on CDNA
        ("0.49.2.dev0", ("libbitsandbytes_rocm63.so",), FAIL),
        ("0.49.2", ("libbitsandbytes_rocm63.so",), FAIL),  # NaNs at decode on AMD GPUs (bitsandbytes #1887)
        ("0.50.0", ("libbitsandbytes_rocm63.so",), PASS),
        ("0.50.0", ("libbitsandbytes_cuda126.so",), FAIL),  # no HIP library
    ],
)
def test_bitsandbytes_on_cdna(machine, site, version, libs, status, monkeypatch):
    from cockpit.doctor import packages

    smoked = []
    monkeypatch.setattr(packages, "bnb_kernel_smoke", lambda ctx, spec, device: smoked.append(device) or (True, "ok"))
    fake_bnb(site, version, libs)
    c = run(machine, rocm_facts(machine["tmp"], kinds=(MI250X, MI300X)), only=["bitsandbytes"])["bitsandbytes"]
    assert c.status == status, c.seen
    assert c.matters_for == {"qlora"} and c.data["version"] == version
    if status != PASS:
        assert "bitsandbytes>=0.50.0" in c.fix or "hip" in c.fix
        assert not smoked  # the version or the library refuses it before any kernel runs
    else:
        assert smoked == ["cuda:0"]
    if version.startswith("0.49"):
        assert "NaNs at decode" in c.seen and "#1887" in c.seen and "gfx90a, gfx942" in c.seen


def test_bitsandbytes_absent_or_cpu(machine, site):
    """Absent: skipped, failed when the config needs QLoRA. A package that imports but whose kernels
    do not run (here: no ``bnb.nn`` at all) fails the CPU smoke, as a missing native library does."""
    if importlib.util.find_spec("bitsandbytes") is None:
        assert run(machine, cpu_facts(), only=["bitsandbytes"])["bitsandbytes"].status == SKIP
        assert run(machine, cpu_facts(), only=["bitsandbytes"], needs={"qlora"})["bitsandbytes"].status == FAIL
    fake_bnb(site, "0.50.0")
    c = run(machine, cpu_facts(), only=["bitsandbytes"])["bitsandbytes"]
    assert c.status == FAIL and "the import works but a Linear4bit forward/backward on cpu does not" in c.seen, c.seen
    assert c.data["smoke"]["device"] == "cpu" and not c.data["smoke"]["ok"]


# -- API contract ---------------------------------------------------------------------------
def test_blocking_failures_and_json_roundtrip():
    checks = [
        Check("a", "A", FAIL, "x", "fix a", frozenset({"qlora"})),
        Check("b", "B", FAIL, "y", "fix b"),  # empty matters_for: blocks everything
        Check("c", "C", WARN, "z", "fix c", frozenset({"gpu"})),
        Check("d", "D", FAIL, "w", "", frozenset({"multi_gpu", "deepspeed"})),
    ]
    assert [c.id for c in blocking_failures(checks, {"gpu"})] == ["b"]
    assert [c.id for c in blocking_failures(checks, {"gpu", "qlora", "deepspeed"})] == ["a", "b", "d"]
    assert [c.id for c in blocking_failures([c.to_dict() for c in checks], {"qlora"})] == ["a", "b"]  # the --json dicts
    d = checks[3].to_dict()
    assert set(d) == {"v", "id", "title", "status", "seen", "fix", "matters_for", "data"}
    assert d["matters_for"] == ["deepspeed", "multi_gpu"]
    assert Check.from_dict(json.loads(json.dumps(d))) == checks[3]
    with pytest.raises(ValueError):
        Check("e", "E", "broken", "")


def test_a_crashing_check_does_not_stop_the_rest(machine):
    checks = run_checks(env=machine["env"], roots=machine["roots"], facts=object())  # type: ignore[arg-type]
    assert [c.id for c in checks] == list(CHECK_IDS)
    crashed = [c for c in checks if c.data.get("crashed")]
    assert crashed and all(c.status == WARN and "check crashed" in c.seen for c in crashed)
    assert by_id(checks)["numa_balancing"].status == WARN and not by_id(checks)["numa_balancing"].data.get("crashed")


def test_version_at_least():
    assert version_at_least("0.49.2", "0.49.2") and version_at_least("0.50.0", "0.49.2")
    assert not version_at_least("0.49.2.dev0", "0.49.2") and not version_at_least("0.48.2", "0.49.2")


def test_mi250_and_mi250x_told_apart_and_mi300x_partitions_said(tmp_path, machine):
    """Issue 34: torch names both CDNA2 parts "AMD Instinct MI250X/MI250"; the CUs per GCD tell them
    apart (110 vs 104). An MI300X in CPX mode shows one physical GPU as 8 devices of 38 CUs and 24 GiB:
    the doctor says so, and the memory it reports (what the planner and presets use) is the partition's."""
    from cockpit.doctor.facts import product_of

    assert product_of("AMD Instinct MI250X/MI250", 110) == ("MI250X", None)
    assert product_of("AMD Instinct MI250X/MI250", 104) == ("MI250", None)
    assert product_of("AMD Instinct MI300X", 304) == ("MI300X", None)
    assert product_of("AMD Instinct MI300X", 38)[1].startswith("CPX: 1/8")
    assert product_of("NVIDIA H200", 132) == ("NVIDIA H200", None)
    facts = rocm_facts(tmp_path)
    facts.devices = [DeviceFacts(0, MI250X[0], 64 * GiB, MI250X[1], 110), DeviceFacts(1, MI250X[0], 64 * GiB, MI250X[1], 104)]
    c = by_id(run_checks(env={"PATH": str(machine["bin"])}, roots=machine["roots"], facts=facts))["gpu_devices"]
    assert c.status == WARN and "MI250X" in c.seen and "MI250 (" in c.seen  # mixed: one of each
    assert [d["product"] for d in c.data["devices"]] == ["MI250X", "MI250"]
    facts.devices = [DeviceFacts(i, MI300X[0], 24 * GiB, MI300X[1], 38) for i in range(8)]
    c = by_id(run_checks(env={"PATH": str(machine["bin"])}, roots=machine["roots"], facts=facts))["gpu_devices"]
    assert c.status == PASS and "CPX: 1/8 of a GPU" in c.seen
    assert {d["total_memory"] for d in c.data["devices"]} == {24 * GiB} and c.data["devices"][0]["partition"]
