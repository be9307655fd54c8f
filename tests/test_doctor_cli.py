"""cockpit doctor on this real machine: in-process, the CPU smoke test, and the CLI in a subprocess."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cockpit.commands import doctor as doctor_cmd
from cockpit.doctor import CHECK_IDS, STATUSES, run_checks
from cockpit.doctor.facts import torch_facts

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {"v", "id", "title", "status", "seen", "fix", "matters_for", "data"}


@pytest.fixture(scope="module")
def facts():
    return torch_facts()


def test_every_check_runs_on_this_machine(facts, tmp_path, capsys):
    env = dict(os.environ, COCKPIT_RUNS_DIR=str(tmp_path / "runs"), COCKPIT_CACHE_DIR=str(tmp_path / "cache"))
    checks = run_checks(env=env, facts=facts)
    assert [c.id for c in checks] == list(CHECK_IDS)
    for c in checks:
        assert c.status in STATUSES and c.seen, c
        assert not c.data.get("crashed"), c.seen
        if c.status in ("warn", "fail"):
            assert c.fix, c
    json.dumps([c.to_dict() for c in checks])
    by = {c.id: c for c in checks}
    assert by["python"].status == "pass"
    if facts.build == "cpu":  # this CI machine: CPU-only torch -> warnings and skips, never failures
        assert by["torch"].status == "warn"
        assert by["gpu_visible"].status == "skip" and by["rocm_arch"].status == "skip"
    assert capsys.readouterr().out == ""  # amdsmi's import-time print stayed off stdout


@pytest.mark.slow  # multi-process run (the project's "slow" tier)
def test_smoke_runs_here(facts):
    """--gpu-smoke on this machine: GPU matmul + RCCL/NCCL all-reduce, or CPU matmul + gloo."""
    (smoke,) = run_checks(facts=facts, gpu_smoke=True, only=["smoke"])
    assert smoke.status == "pass", smoke.seen
    assert all(r["ok"] and r["matmul"]["ok"] for r in smoke.data["ranks"])
    if facts.build == "cpu":
        assert "gloo" in smoke.seen and [r["all_reduce"]["value"] for r in smoke.data["ranks"]] == [3.0, 3.0]
    assert smoke.data["attention"]["math"]["ok"] and "attention on" in smoke.seen  # docs/rocm.md item 9


@pytest.mark.slow
def test_smoke_failures_become_a_failed_check(facts, monkeypatch):
    """Ranks that crash (a ROCm machine's facts, but this CPU torch in the ranks) or hang."""
    from cockpit.doctor import TorchFacts, smoke
    from cockpit.doctor.facts import DeviceFacts

    if facts.build != "cpu":
        pytest.skip("needs a CPU-only torch to fake a broken GPU")
    fake = TorchFacts(importable=True, version=facts.version, hip="6.3", cuda_available=True, device_count=1, devices=[DeviceFacts(0, "AMD Instinct MI300X", 192 * 2**30, "gfx942")])
    (c,) = run_checks(facts=fake, gpu_smoke=True, only=["smoke"])
    assert c.status == "fail" and "rank 0:" in c.seen and c.data["backend"] == "nccl"
    monkeypatch.setattr(smoke, "TIMEOUT_S", 0.2)
    (hung,) = run_checks(facts=facts, gpu_smoke=True, only=["smoke"])
    assert hung.status == "fail" and "hung" in hung.seen and "comm_env" in hung.fix


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m cockpit.cli doctor ...``. While sibling command modules of the shared tree
    are not written yet (cli.py imports them all to build the parser), fall back to cli.main
    with only the doctor entry of the same COMMANDS table."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), NO_COLOR="1")
    proc = subprocess.run([sys.executable, "-m", "cockpit.cli", "doctor", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    if "No module named 'cockpit.commands." in proc.stderr and "cockpit.commands.doctor" not in proc.stderr:
        shim = "import sys, cockpit.cli as c; c.COMMANDS = {'doctor': c.COMMANDS['doctor']}; sys.exit(c.main(['doctor', *sys.argv[1:]]))"
        proc = subprocess.run([sys.executable, "-c", shim, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    return proc


def test_cli_json_end_to_end():
    proc = cli("--json")
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    assert isinstance(data, list) and [d["id"] for d in data] == list(CHECK_IDS)
    for d in data:
        assert set(d) == FIELDS and d["v"] == 1
        assert d["status"] in STATUSES and isinstance(d["matters_for"], list) and isinstance(d["data"], dict)
    assert proc.returncode == (1 if any(d["status"] == "fail" for d in data) else 0)


def test_cli_bad_tag_is_usage_error():
    proc = cli("--needs", "gpu,warp_drive")
    assert proc.returncode == 2 and "warp_drive" in proc.stderr


def test_human_output(facts, capsys, monkeypatch):
    import cockpit.doctor as doctor

    real = doctor.run_checks
    monkeypatch.setattr(doctor, "run_checks", lambda **kw: real(facts=facts, **kw))
    code = doctor_cmd.run(argparse.Namespace(json=False, gpu_smoke=False, needs=[]))
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(line.lstrip().startswith("ok") and "Python version" in line for line in lines)
    assert "skipped" in lines[-1] and code in (0, 1)
    if facts.build == "cpu":
        torch_line = next(i for i, line in enumerate(lines) if "torch build" in line)
        assert lines[torch_line].lstrip().startswith("WARN") and "fix:" in lines[torch_line + 1]


def test_json_mode_keeps_stdout_clean(facts, capfd, monkeypatch):
    """Anything printed while checks run (also by C code on fd 1) goes to stderr in --json mode."""
    import cockpit.doctor as doctor

    real = doctor.run_checks

    def noisy(**kw):
        print("chatty library")
        os.write(1, b"C-level chatter\n")
        return real(facts=facts, only=["python"], **kw)

    monkeypatch.setattr(doctor, "run_checks", noisy)
    assert doctor_cmd.run(argparse.Namespace(json=True, gpu_smoke=False, needs=[])) == 0
    out, err = capfd.readouterr()
    assert [d["id"] for d in json.loads(out)] == ["python"]
    assert "chatty library" in err and "C-level chatter" in err


def test_doctor_imports_no_torch():
    code = "import sys, cockpit.doctor, cockpit.commands.doctor; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60).returncode == 0
