"""LLaMA-Factory 0.9.5 in its own venv under the bench cache dir (never a project dependency).

    python bench/lf_venv.py          # create / repair it; prints the llamafactory-cli path

Recipe (issue 16): pin torch==2.13.0 (the CPU build beside the project's) with a constraints
file, install llamafactory==0.9.5, then drop the CUDA builds of torchvision and torchcodec it
pulls in, and remove torchaudio's CUDA-linked shared libraries (LLaMA-Factory imports
torchaudio; a text SFT job never calls it).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import venv
from pathlib import Path

LF_VERSION = "0.9.5"
TORCH_PIN = "torch==2.13.0"


def cache_root() -> Path:
    env = os.environ.get("COCKPIT_CACHE_DIR")
    base = Path(env).expanduser() if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cockpit"
    return base / "bench" / f"llamafactory-{LF_VERSION}"


def cli_path() -> Path:
    return cache_root() / "venv" / "bin" / "llamafactory-cli"


def _pip(py: Path, *args: str, log) -> None:
    cmd = [str(py), "-m", "pip", "--disable-pip-version-check", *args]
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True)


def ensure(log=print) -> Path:
    """The llamafactory-cli of the bench venv, installing it first when missing."""
    root = cache_root()
    py = root / "venv" / "bin" / "python"
    marker = root / "installed.ok"
    if marker.exists() and cli_path().exists():
        return cli_path()
    root.mkdir(parents=True, exist_ok=True)
    if not py.exists():
        venv.EnvBuilder(with_pip=True).create(root / "venv")
    constraints = root / "constraints.txt"
    constraints.write_text(TORCH_PIN + "\n", encoding="utf-8")
    _pip(py, "install", TORCH_PIN, log=log)
    _pip(py, "install", "-c", str(constraints), f"llamafactory=={LF_VERSION}", log=log)
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "torchvision", "torchcodec"], check=False)
    site = subprocess.run([str(py), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"], check=True, capture_output=True, text=True).stdout.strip()
    for so in glob.glob(os.path.join(site, "torchaudio", "lib", "*.so")):
        os.remove(so)
    check = subprocess.run([str(py), "-c", "import llamafactory, torch; print(llamafactory.__version__, torch.__version__)"], capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError(f"llamafactory does not import in {root / 'venv'}:\n{check.stderr[-2000:]}")
    log(f"llamafactory venv ready: {check.stdout.strip()}")
    marker.write_text(check.stdout, encoding="utf-8")
    return cli_path()


if __name__ == "__main__":
    print(ensure())
    sys.exit(0)
