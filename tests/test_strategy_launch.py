"""Launch construction (torchrun, c10d, NUMA wrapping), NUMA plans against a fake sysfs tree,
the bind wrapper, config rules of the strategy keys, and `cockpit preview`. Fast: no training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, cockpit, prerequisite, write_yaml
from cockpit.config.load import load_config
from cockpit.errors import InputError
from cockpit.strategy import numa
from cockpit.strategy.launch import node_launch, rdzv_id
from cockpit.strategy.multinode import hostfile, node_commands, sbatch_script


def cfg_of(**over) -> dict:
    items = [f"{k}={v}" for k, v in {"dataset": "x.json", **over}.items()]
    return load_config(None, items, check_paths=False)


def fake_sysfs(root: Path, nodes: dict[int, str], gpus: list[tuple[str, int]], vendor: str = "0x1002") -> Path:
    """nodes: node -> cpulist; gpus: (bdf, numa_node), plus a NIC that must be ignored."""
    nd = root / "devices/system/node"
    nd.mkdir(parents=True)
    (nd / "online").write_text(",".join(str(n) for n in sorted(nodes)) + "\n")
    for n, cpus in nodes.items():
        (nd / f"node{n}").mkdir()
        (nd / f"node{n}/cpulist").write_text(cpus + "\n")
    pci = root / "bus/pci/devices"
    pci.mkdir(parents=True)
    for bdf, node in [*gpus, ("0000:01:00.0", 0)]:
        d = pci / bdf
        d.mkdir()
        is_nic = bdf == "0000:01:00.0"
        (d / "vendor").write_text(("0x15b3" if is_nic else vendor) + "\n")
        (d / "class").write_text(("0x020000" if is_nic else "0x038000") + "\n")
        (d / "numa_node").write_text(f"{node}\n")
    return root


NUMACTL = lambda name: "/usr/bin/numactl" if name == "numactl" else None  # noqa: E731
NO_NUMACTL = lambda name: None  # noqa: E731


# -- commands ---------------------------------------------------------------------------------
def test_single_process_is_the_bare_worker():
    cfg = cfg_of(numa_bind="off")
    plan = node_launch("/r", "rid", cfg, python="py")
    assert plan.command == ["py", "-m", "cockpit.train.worker", "/r"]
    assert plan.strategy == "single process" and plan.ranks[0]["env"]["COCKPIT_RUN_DIR"] == "/r"
    assert "RANK" not in plan.ranks[0]["env"]


def test_ddp_torchrun_c10d_and_rank_env():
    cfg = cfg_of(nproc_per_node=2, master_port=29123, numa_bind="off", env={"HSA_ENABLE_SDMA": 0, "HF_TOKEN": "s3cret"})
    plan = node_launch("/r", "rid", cfg, python="py", env={})
    assert plan.command == [
        "py", "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1", "--node_rank=0",
        "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29123", "--rdzv_id=rid", "--max_restarts=0",
        "-m", "cockpit.train.worker", "/r",
    ]
    assert plan.strategy == "DDP"
    r1 = plan.ranks[1]
    assert r1["env"]["RANK"] == "1" and r1["env"]["LOCAL_RANK"] == "1" and r1["env"]["WORLD_SIZE"] == "2"
    assert r1["env"]["HSA_ENABLE_SDMA"] == "0" and r1["env"]["HF_TOKEN"] == "***redacted***"
    assert r1["env"]["OMP_NUM_THREADS"] == "1"


def test_numa_map_wraps_every_rank_through_bind_keeping_torchrun():
    cfg = cfg_of(nproc_per_node=2, master_port=29123, numa_bind="0:0,1:1")
    plan = node_launch("/r", "rid", cfg, python="py", numa=numa.plan("0:0,1:1", 2, which=NUMACTL))
    i = plan.command.index("--no-python")
    assert plan.command[i + 1 :] == ["py", "-m", "cockpit.strategy.bind", "--map=0:0,1:1", "--method=numactl", "--memory=preferred", "--", "py", "-m", "cockpit.train.worker", "/r"]
    assert plan.ranks[1]["command"][:3] == ["numactl", "--cpunodebind=1", "--preferred=1"]
    # one process: no torchrun, the wrapper logs to rank0.log itself (--single)
    one = node_launch("/r", "rid", cfg_of(numa_bind="0:0"), python="py", numa=numa.plan("0:0", 1, which=NUMACTL))
    assert one.command[:3] == ["py", "-m", "cockpit.strategy.bind"] and "--single" in one.command


def test_multinode_rendezvous_id_is_shared_by_the_nodes():
    a = cfg_of(nnodes=2, node_rank=0, master_port=29400, master_addr="10.1.2.3", numa_bind="off")
    b = cfg_of(nnodes=2, node_rank=1, master_port=29400, master_addr="10.1.2.3", numa_bind="off")
    pa, pb = node_launch("/a", "run-a", a, python="py"), node_launch("/b", "run-b", b, python="py")
    assert rdzv_id(a, "run-a") == rdzv_id(b, "run-b") == "cockpit-10.1.2.3-29400"
    assert "--node_rank=1" in pb.command and "--rdzv_endpoint=10.1.2.3:29400" in pb.command
    assert pb.ranks[0]["env"]["RANK"] == "1" and pb.ranks[0]["env"]["WORLD_SIZE"] == "2"
    cmds = node_commands("run.yaml", ["lora_rank=4"], a)
    assert cmds[1]["argv"] == ["cockpit", "train", "run.yaml", "--set", "lora_rank=4", "--set", "node_rank=1", "--set", "master_addr=10.1.2.3", "--set", "master_port=29400"]
    script = sbatch_script("run.yaml", [], a)
    assert "#SBATCH --nodes=2" in script and "srun" in script and '--set node_rank="$SLURM_NODEID"' in script
    assert hostfile(a, ["gpu-a", "gpu-b"]) == "gpu-a slots=1\ngpu-b slots=1\n"


# -- NUMA plans against a fake sysfs ------------------------------------------------------------
def test_numa_auto_follows_each_gpu_numa_node(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, [("0000:83:00.0", 1), ("0000:03:00.0", 0), ("0000:c3:00.0", 1), ("0000:23:00.0", 0)])
    p = numa.plan("auto", 4, sysfs=sysfs, env={}, which=NUMACTL)
    assert [g["bdf"] for g in p.gpus] == ["0000:03:00.0", "0000:23:00.0", "0000:83:00.0", "0000:c3:00.0"]  # BDF order, NIC ignored
    assert p.nodes == {0: 0, 1: 0, 2: 1, 3: 1} and p.method == "numactl"
    assert p.prefix(2) == ["numactl", "--cpunodebind=1", "--preferred=1"]  # issue 34: preferred by default
    strict = numa.plan("auto", 4, sysfs=sysfs, env={}, which=NUMACTL, memory="strict")
    assert strict.prefix(2) == ["numactl", "--cpunodebind=1", "--membind=1"]  # only when asked
    # visible devices pick GPUs by index
    p2 = numa.plan("auto", 2, sysfs=sysfs, env={"HIP_VISIBLE_DEVICES": "2,3"}, which=NUMACTL)
    assert p2.nodes == {0: 1, 1: 1}
    # no numactl: sched_setaffinity, said so
    p3 = numa.plan("auto", 2, sysfs=sysfs, env={}, which=NO_NUMACTL)
    assert p3.method == "sched_setaffinity" and any("numactl not found" in n for n in p3.notes)
    # the command built from it
    cfg = cfg_of(nproc_per_node=4, master_port=29123)
    plan = node_launch("/r", "rid", cfg, python="py", sysfs=str(sysfs), env={}, numa=p)
    assert "--map=0:0,1:0,2:1,3:1" in plan.command
    assert numa.node_cpus(1, sysfs) == [4, 5, 6, 7]


def test_numa_one_node_is_a_noop_with_a_note(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: "0-7"}, [("0000:03:00.0", 0)])
    p = numa.plan("auto", 2, sysfs=sysfs, env={}, which=NUMACTL)
    assert not p.active and "one NUMA node" in p.notes[0]
    plan = node_launch("/r", "rid", cfg_of(nproc_per_node=2), python="py", numa=p)
    assert "cockpit.strategy.bind" not in plan.command
    assert numa.plan("off", 2, sysfs=sysfs).notes == ["NUMA binding off (numa_bind: off)"]


def test_numa_gpu_without_node_and_offline_node_are_noted(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, [("0000:03:00.0", -1)])
    p = numa.plan("auto", 2, sysfs=sysfs, env={}, which=NUMACTL)
    assert p.nodes == {} and any("reports no NUMA node" in n for n in p.notes) and any("no GPU" in n for n in p.notes)
    p2 = numa.plan("0:3", 1, sysfs=sysfs, env={}, which=NUMACTL)
    assert p2.nodes == {0: 3} and "not online" in p2.notes[0]


def test_bind_wrapper_sets_affinity_from_sysfs_and_keeps_the_pid(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    sysfs = fake_sysfs(tmp_path / "sys", {0: str(cpus[0])}, [])
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    code = "import os,sys; print(os.getpid(), sorted(os.sched_getaffinity(0)))"
    res = subprocess.run(
        [sys.executable, "-m", "cockpit.strategy.bind", "--map=0:0", "--method=sched_setaffinity", f"--sysfs={sysfs}", "--", sys.executable, "-c", code],
        capture_output=True, text=True, env={**os.environ, "LOCAL_RANK": "0", "COCKPIT_RUN_DIR": str(run), "PYTHONPATH": str(ROOT)}, timeout=60,
    )
    assert res.returncode == 0, res.stderr
    pid, aff = res.stdout.strip().splitlines()[-1].split(" ", 1)
    assert aff == str([cpus[0]])
    rec = json.loads((run / "logs" / "numa.local0.json").read_text())
    assert rec["node"] == 0 and rec["method"] == "sched_setaffinity" and rec["pid"] == int(pid)


# -- config rules -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "over, key, text",
    [
        ({"offload": "optimizer"}, "offload", "set zero_stage"),
        ({"zero_stage": 2, "offload": "optimizer+params"}, "offload", "zero_stage: 3"),
        ({"nnodes": 2}, "master_port", "fixed master_port"),
        ({"fsdp": "full_shard auto_wrap"}, "fsdp", "above 1"),
        ({"numa_bind": "0:0", "nproc_per_node": 2}, "numa_bind", "local rank(s) [1]"),
        ({"numa_bind": "zero"}, "numa_bind", "LOCAL_RANK:NODE"),
        ({"zero_stage": 3, "fsdp": "full_shard", "nproc_per_node": 2}, "fsdp", "choose one"),
    ],
)
def test_strategy_key_rules(over, key, text):
    with pytest.raises(InputError) as ei:
        cfg_of(**over)
    assert any(p.key == key and text in p.message for p in ei.value.problems), str(ei.value)


def test_numa_bind_bare_off_in_yaml_means_off(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("dataset: x.json\nnuma_bind: off\n")
    assert load_config(path, check_paths=False).numa_bind == "off"


# -- the preview command ------------------------------------------------------------------------
def test_preview_shows_every_rank_and_the_other_nodes(tmp_path, tiny_model_dir):
    cfg = write_yaml(
        tmp_path / "mn.yaml",
        {
            "model_name_or_path": str(tiny_model_dir), "dataset": "cockpit_identity", "nproc_per_node": 2, "nnodes": 2,
            "master_addr": "10.0.0.1", "master_port": 29555, "numa_bind": "0:0,1:0", "env": {"NCCL_DEBUG": "INFO", "HF_TOKEN": "x"},
        },
    )
    sb, hf = tmp_path / "job.sbatch", tmp_path / "hostfile"
    res = cockpit("preview", str(cfg), "--json", "--sbatch", str(sb), "--hostfile", str(hf), "--hosts", "a,b")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["strategy"] == "DDP" and out["world_size"] == 4 and len(out["ranks"]) == 2
    assert out["ranks"][1]["env"]["NCCL_DEBUG"] == "INFO" and out["ranks"][1]["env"]["HF_TOKEN"] == "***redacted***"
    assert out["ranks"][0]["command"][:3] == ["numactl", "--cpunodebind=0", "--preferred=0"]
    assert "--rdzv_backend=c10d" in out["command"] and "--no-python" in out["command"]
    assert out["nodes"][1]["argv"][-6:] == ["--set", "node_rank=1", "--set", "master_addr=10.0.0.1", "--set", "master_port=29555"]
    script = sb.read_text()
    assert "#SBATCH --nodes=2" in script and "export NCCL_DEBUG=INFO" in script
    assert "export HF_TOKEN" not in script and "# HF_TOKEN: a secret" in script
    assert hf.read_text() == "a slots=2\nb slots=2\n"
    text = cockpit("preview", str(cfg))
    assert text.returncode == 0 and "on node 1:  cockpit train" in text.stdout and "numactl --cpunodebind=0 --preferred=0" in text.stdout


def test_bind_wrapper_prefers_the_node_unless_strict(tmp_path):
    """Issue 34: numactl's memory policy is --preferred by default (strict --membind OOM-kills offload
    runs on two-socket nodes); numa_memory: strict asks for --membind. Runs the real numactl."""
    import shutil

    prerequisite(shutil.which("numactl") is not None, "numactl not installed")
    code = "import os; print(open('/proc/self/status').read())"
    for memory, seen in (("preferred", "Mems_allowed_list"), ("strict", "Mems_allowed_list")):
        run = tmp_path / memory
        (run / "logs").mkdir(parents=True)
        res = subprocess.run(
            [sys.executable, "-m", "cockpit.strategy.bind", "--map=0:0", "--method=numactl", f"--memory={memory}",
             "--", sys.executable, "-c", code],
            capture_output=True, text=True, env={**os.environ, "LOCAL_RANK": "0", "COCKPIT_RUN_DIR": str(run)}, timeout=60,
        )
        assert res.returncode == 0 and seen in res.stdout, res.stderr
        record = json.loads((run / "logs" / "numa.local0.json").read_text())
        flag = "--membind=0" if memory == "strict" else "--preferred=0"
        assert record["memory"] == memory and flag in record["command"], record
    cfg = load_config(str(ROOT / "presets" / "cpu-demo.yaml"), [])
    assert cfg.numa_memory == "preferred"
