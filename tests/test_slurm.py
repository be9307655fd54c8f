"""Slurm without a scheduler: the sbatch header's GPU requests, the queue state a scheduler answer
implies, squeue/sacct parsing, the runs dir's filesystem, the multi-node submit check, each node's
config, and Setup's "Launch on Slurm" button only where sbatch is on PATH. (The live scheduler:
tests/test_slurm_live.py.)"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

from cockpit.config import load_config
from cockpit.errors import InputError
from cockpit.slurm import fs, queue
from cockpit.run.slurm_node import job_port, node_config
from cockpit.slurm.script import SlurmOptions, header, job_script, needs_gpus
from cockpit.run.slurm_submit import check_runs_dir

ROOT = Path(__file__).resolve().parent.parent


def cfg_of(**over) -> dict:
    return load_config(str(ROOT / "presets" / "cpu-demo.yaml"), [f"{k}={v}" for k, v in over.items()])


# -- GPU requests only when the config needs GPUs ------------------------------------------------
def test_a_cpu_config_asks_for_no_gpu_and_a_gpu_config_for_its_ranks():
    cpu = cfg_of(nproc_per_node=2)
    assert cpu.use_cpu is True and not needs_gpus(cpu.use_cpu, has_gpus=True)
    lines = header(cpu, SlurmOptions(), job_name="j")
    assert not any("gpus" in line or "gres" in line for line in lines), lines
    gpu = load_config(str(ROOT / "presets" / "mi300x-lora-8b.yaml"), ["nproc_per_node=8"])
    assert "#SBATCH --gpus-per-node=8" in header(gpu, SlurmOptions(), job_name="j")
    named = gpu.replace(slurm_gres="gpu:mi300x")
    assert "#SBATCH --gres=gpu:mi300x:8" in header(named, SlurmOptions(), job_name="j")
    auto = gpu.replace(use_cpu=None)  # auto: GPUs unless the cluster is known to have none
    assert needs_gpus(auto.use_cpu, None) and needs_gpus(auto.use_cpu, True) and not needs_gpus(auto.use_cpu, False)


def test_header_options_and_the_job_script():
    cfg = cfg_of(nnodes=2, master_port=29400, env="{HIP_FORCE_DEV_KERNARG: '1', HF_TOKEN: hf_abc123}")
    opts = SlurmOptions(partition="mi300x", time="4:00:00", account="proj", cpus_per_task=96, extra=("--constraint=xgmi",))
    script = job_script("/shared/runs/r1", cfg, opts, job_name="cockpit-r1", has_gpus=False, python="/venv/bin/python")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --partition=mi300x", "#SBATCH --time=4:00:00",
                 "#SBATCH --account=proj", "#SBATCH --cpus-per-task=96", "#SBATCH --constraint=xgmi", "#SBATCH --exclusive",
                 "#SBATCH --output=/shared/runs/r1/logs/slurm-%j.out", "export HIP_FORCE_DEV_KERNARG=1"):
        assert line in script.splitlines(), line
    assert "hf_abc123" not in script and "# HF_TOKEN: a secret" in script
    assert script.rstrip().splitlines()[-1] == "srun --kill-on-bad-exit=1 --nodes=2 --ntasks=2 --ntasks-per-node=1 /venv/bin/python -m cockpit.run.slurm_node /shared/runs/r1"
    res = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, check=False)
    assert res.returncode == 0, res.stderr


HOSTILE = ("mi300x\ntouch /tmp/pwned", "gpu:mi300x; rm -rf ~", "$(id)", "a b", "x\r")


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_never_reach_an_sbatch_line(tmp_path, value):
    """Issue 34: a newline in a value written into #SBATCH lines would be a shell command of the batch
    script. Every such value is refused, naming it; slurm_gres already at `cockpit check` (exit 2)."""
    for opts, name in ((SlurmOptions(partition=value), "--partition"), (SlurmOptions(account=value), "--account"),
                       (SlurmOptions(qos=value), "--qos"), (SlurmOptions(time=value), "--time")):
        with pytest.raises(InputError, match=name):
            header(cfg_of(), opts, job_name="j")
    with pytest.raises(InputError, match="slurm_gres"):
        header(cfg_of().replace(slurm_gres=value, use_cpu=False), SlurmOptions(), job_name="j")
    if "\n" in value or "\r" in value:
        with pytest.raises(InputError, match="--sbatch-arg"):
            header(cfg_of(), SlurmOptions(extra=(f"--comment={value}",)), job_name="j")
    else:  # a raw option is shell-quoted on its line: only control characters are refused
        assert any(line.startswith("#SBATCH '--comment=") for line in header(cfg_of(), SlurmOptions(extra=(f"--comment={value}",)), job_name="j"))
    import yaml

    from conftest import cockpit

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**yaml.safe_load((ROOT / "presets" / "cpu-demo.yaml").read_text()), "slurm_gres": value}))
    res = cockpit("check", str(cfg), "--no-devices")
    assert res.returncode == 2 and "slurm_gres" in res.stdout + res.stderr, res.stdout + res.stderr


def test_preview_sbatch_of_the_cpu_demo_requests_no_gpu(tmp_path):
    from conftest import cockpit

    out = tmp_path / "job.sh"
    res = cockpit("preview", "presets/cpu-demo.yaml", "--set", "nproc_per_node=2", "--set", "max_steps=3", "--sbatch", str(out))
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "--gpus-per-node" not in text and "--gres" not in text and "srun" in text


# -- the scheduler's answer -> the run's state ---------------------------------------------------
def test_implied_states():
    queued = {"state": "queued", "slurm": {"job_id": "7"}}
    pending = queue.implied(queued, {"state": "PENDING", "reason": "Resources", "nodes": None})
    assert pending["state"] == "queued" and pending["reason"] == "PENDING (Resources)"
    starting = queue.implied(queued, {"state": "RUNNING", "reason": None, "nodes": "gpu-a"})
    assert starting["state"] == "queued" and "RUNNING on gpu-a" in starting["reason"]
    cancelled = queue.implied(queued, {"state": "CANCELLED", "reason": None})
    assert cancelled["state"] == "cancelled" and cancelled["reason"] == "cancelled by the scheduler: CANCELLED" and cancelled["scheduler_end"]
    running = {"state": "failed", "reason": "supervisor terminated (SIGTERM)", "slurm": {"job_id": "7"}}
    timeout = queue.implied(running, {"state": "TIMEOUT", "reason": "TimeLimit"})
    assert timeout["state"] == "failed" and timeout["reason"].startswith("the scheduler ended the job: TIMEOUT (TimeLimit)")
    assert "SIGTERM" in timeout["reason"]
    node_fail = queue.implied({"state": "running", "slurm": {"job_id": "7"}}, {"state": "NODE_FAIL", "reason": None})
    assert node_fail["state"] == "failed" and "NODE_FAIL" in node_fail["reason"]
    own = queue.implied({"state": "failed", "reason": "rank 1 ran out of memory"}, {"state": "FAILED", "reason": "NonZeroExitCode"})
    assert own["reason"] == "rank 1 ran out of memory"  # the run's own reason says more
    done = {"state": "finished", "slurm": {"job_id": "7"}}
    assert queue.implied(done, {"state": "COMPLETED", "reason": None})["state"] == "finished"
    assert queue.implied({"state": "running"}, {"state": "RUNNING", "reason": None})["state"] == "running"
    assert queue.implied(queued, None)["reason"].startswith("not known to the scheduler")


def fake_runner(outputs: dict[str, tuple[int, str]]):
    calls = []

    def run(argv):
        calls.append(argv)
        rc, out = outputs.get(argv[0], (1, ""))
        return subprocess.CompletedProcess(argv, rc, out, "")

    return run, calls


def test_query_parses_squeue_then_sacct_for_the_jobs_it_forgot(monkeypatch):
    monkeypatch.setattr(queue.shutil, "which", lambda name: f"/usr/bin/{name}")
    runner, calls = fake_runner({"squeue": (0, "11|PENDING|Priority|\n12|RUNNING|None|gpu-[01-02]\n"),
                                 "sacct": (0, "13|CANCELLED by 1000|gpu-03\n")})
    got = queue.query(["11", "12", "13"], runner)
    assert got["11"] == {"state": "PENDING", "reason": "Priority", "nodes": None, "source": "squeue"}
    assert got["12"]["nodes"] == "gpu-[01-02]" and got["12"]["reason"] is None
    assert got["13"] == {"state": "CANCELLED", "reason": "by 1000", "nodes": "gpu-03", "source": "sacct"}
    assert calls[0][:4] == ["squeue", "-h", "-t", "all"] and calls[1][-1] == "JobIDRaw,State,NodeList"


def test_effective_status_writes_the_schedulers_end_once(monkeypatch, tmp_path):
    from cockpit.store.events import read_all
    from cockpit.store.rundir import create_run_dir

    monkeypatch.setattr(queue.shutil, "which", lambda name: f"/usr/bin/{name}")
    run = create_run_dir(tmp_path)
    run.update_status(state="queued", slurm={"job_id": "21"})
    runner, calls = fake_runner({"squeue": (0, "21|PENDING|JobHeldUser|\n")})
    assert queue.effective_status(run, runner=runner)["reason"] == "PENDING (JobHeldUser)"
    assert run.read_status()["state"] == "queued" and "reason" not in run.read_status()  # status.json untouched while it waits
    queue.effective_status(run, runner=runner)
    assert len(calls) == 1  # cached for MAX_AGE_S
    later = queue.effective_statuses([run], runner=runner, now=time.time() + 3600, cached_only=True)[run.run_id]
    assert later["reason"] == "PENDING (JobHeldUser)" and len(calls) == 1  # the UI thread: the last answer, never a query
    assert queue.waiting_on_scheduler(run.read_status())
    runner, calls = fake_runner({"squeue": (0, "21|CANCELLED|None|\n")})
    st = queue.effective_status(run, runner=runner, fresh=True)
    assert st["state"] == "cancelled" and run.read_status()["state"] == "cancelled"
    assert [e["state"] for e in read_all(run.events_path) if e["kind"] == "state"] == ["cancelled"]
    queue.effective_status(run, runner=runner, fresh=True)
    assert len(calls) == 1  # settled: never asked again
    failed = create_run_dir(tmp_path)
    failed.update_status(state="failed", reason="rank 0 exited with code 1", slurm={"job_id": "22"})
    runner, calls = fake_runner({"squeue": (1, "")})  # squeue and sacct have forgotten the job
    assert queue.effective_status(failed, runner=runner)["state"] == "failed"
    queue.effective_status(failed, runner=runner, fresh=True)
    assert len(calls) == 2 and failed.read_status()["scheduler_end"] == "unknown"  # squeue + sacct once, then no more


# -- filesystems, multi-node -----------------------------------------------------------------------
def test_filesystem_of_a_path(tmp_path):
    table = "/dev/sda1 / ext4 rw 0 0\nnas:/export /shared nfs4 rw 0 0\nfs /shared/lus\\040x lustre rw 0 0\n"
    assert fs.mount_of("/shared/runs/x", table) == ("nfs4", "/shared")
    assert fs.mount_of("/shared/lus x/r", table) == ("lustre", "/shared/lus x")
    assert fs.mount_of("/sharedfoo", table) == ("ext4", "/")
    mounts = tmp_path / "mounts"
    mounts.write_text(table)
    assert fs.filesystem_of(tmp_path / "not" / "yet", str(mounts)) == ("ext4", "/")  # nearest existing parent
    assert fs.is_shared("nfs4") and fs.is_shared("lustre") and not fs.is_shared("ext4") and not fs.is_shared("tmpfs")


def test_multinode_submit_refuses_a_local_runs_dir(monkeypatch, tmp_path):
    monkeypatch.setattr(fs, "filesystem_of", lambda path, mounts="": ("ext4", "/"))
    check_runs_dir(cfg_of(nnodes=1), tmp_path)  # one node: any filesystem
    with pytest.raises(InputError, match="local to this node.*filesystem every node mounts"):
        check_runs_dir(cfg_of(nnodes=2, master_port=29400), tmp_path)
    monkeypatch.setattr(fs, "filesystem_of", lambda path, mounts="": ("lustre", "/lus"))
    check_runs_dir(cfg_of(nnodes=2, master_port=29400), tmp_path)


def test_train_slurm_on_two_nodes_needs_a_shared_runs_dir(tmp_path):
    from conftest import cockpit

    if fs.is_shared(fs.filesystem_of(tmp_path)[0]):
        pytest.skip(f"{tmp_path} is on a shared filesystem here")
    res = cockpit("train", "presets/cpu-demo.yaml", "--slurm", "--nodes", "2", "--skip-check", "--runs-dir", str(tmp_path / "runs"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "is local to this node" in res.stderr and "a 2-node Slurm run needs the runs dir on a filesystem every node mounts" in res.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_each_nodes_config():
    cfg = {**cfg_of(nnodes=2, master_port=29400).keys_only(), "master_port": 0}  # as written before the port was fixed
    env = {"SLURM_JOB_ID": "4242", "MASTER_ADDR": "gpu-a"}
    n1 = node_config(cfg, 1, env)
    assert n1["node_rank"] == 1 and n1["master_addr"] == "gpu-a" and n1["master_port"] == job_port("4242") == node_config(cfg, 0, env)["master_port"]
    assert node_config({**cfg, "master_port": 29400}, 1, env)["master_port"] == 29400
    one = node_config(cfg_of().keys_only(), 0, env)
    assert one["master_addr"] == "127.0.0.1" and one["master_port"] > 0


def test_doctor_names_the_runs_dirs_filesystem(tmp_path):
    from cockpit.doctor import run_checks

    (check,) = run_checks(roots={"runs_dir": tmp_path / "runs"}, only=["disk_runs"])
    assert check.data["fstype"] == fs.filesystem_of(tmp_path)[0] and "filesystem " in check.seen


# -- Setup: the button only where sbatch is ---------------------------------------------------------
@pytest.mark.parametrize("with_sbatch", [True, False])
def test_setup_offers_launch_on_slurm_only_with_sbatch_on_path(tmp_path, monkeypatch, with_sbatch):
    from test_ui_pilot import wait_for_form
    from test_ui_setup_live import DOCTOR

    from cockpit.ui.app import CockpitApp

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if with_sbatch:
        (bin_dir / "sbatch").write_text("#!/bin/sh\nexit 1\n")
        os.chmod(bin_dir / "sbatch", 0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.path.dirname(os.__file__)}")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("COCKPIT_SLURM", raising=False)

    async def scenario() -> None:
        app = CockpitApp(tmp_path / "runs", start="setup", doctor_checks=DOCTOR)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for_form(pilot)  # not only the buttons: the test ends while the form is being filled otherwise
            assert bool(app.screen.query("#b-slurm")) is with_sbatch

    asyncio.run(scenario())
