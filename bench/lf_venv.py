"""LLaMA-Factory 0.9.5 in its own venv under the bench cache dir (never a project dependency).

    python bench/lf_venv.py            # create / repair it; prints the llamafactory-cli path
    python bench/lf_venv.py --dry-run  # what it would do here, doing none of it

Recipe (issue 16): pin torch==2.13.0 (the CPU build beside the project's) with a constraints
file, install llamafactory==0.9.5, then drop the CUDA builds of torchvision and torchcodec it
pulls in, and remove torchaudio's CUDA-linked shared libraries (LLaMA-Factory imports
torchaudio; a text SFT job never calls it).
"""

from __future__ import annotations

import glob
import os
import shlex
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


def installed() -> bool:
    return (cache_root() / "installed.ok").exists() and cli_path().exists()


def install_commands(py: Path, constraints: Path) -> list[list[str]]:
    """The pip installs that make the venv of ``py`` (torch pinned first, then LLaMA-Factory under the pin)."""
    pip = [str(py), "-m", "pip", "--disable-pip-version-check", "install"]
    return [[*pip, TORCH_PIN], [*pip, "-c", str(constraints), f"llamafactory=={LF_VERSION}"]]


def side_command(script: str, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """``script`` run again by the side venv's python, with LLaMA-Factory's own packages only (PYTHONPATH emptied)."""
    return [str(cli_path().with_name("python")), script, *argv], {**os.environ, "PYTHONPATH": ""}


def rerun_in_side_venv(script: str, argv: list[str], dry_run: bool = False, log=print) -> int:
    """Run ``script`` again in the side venv (made first when missing); ``dry_run``: say what would run, run
    nothing, make nothing (no LLaMA-Factory needed: the suite's check of a generator's own code)."""
    cmd, env = side_command(script, argv)
    if dry_run:
        state = "installed" if installed() else "not installed: made first (python bench/lf_venv.py --dry-run)"
        log(f"side venv {cache_root() / 'venv'} ({state})")
        log("would run: PYTHONPATH= " + shlex.join(cmd))
        return 0
    ensure(log)
    return subprocess.call(cmd, env=env)


def ensure(log=print) -> Path:
    """The llamafactory-cli of the bench venv, installing it first when missing."""
    root = cache_root()
    py = root / "venv" / "bin" / "python"
    if installed():
        return cli_path()
    root.mkdir(parents=True, exist_ok=True)
    if not py.exists():
        venv.EnvBuilder(with_pip=True).create(root / "venv")
    constraints = root / "constraints.txt"
    constraints.write_text(TORCH_PIN + "\n", encoding="utf-8")
    for cmd in install_commands(py, constraints):
        log("$ " + " ".join(cmd))
        subprocess.run(cmd, check=True)
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "torchvision", "torchcodec"], check=False)
    site = subprocess.run([str(py), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"], check=True, capture_output=True, text=True).stdout.strip()
    for so in glob.glob(os.path.join(site, "torchaudio", "lib", "*.so")):
        os.remove(so)
    check = subprocess.run([str(py), "-c", "import llamafactory, torch; print(llamafactory.__version__, torch.__version__)"], capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError(f"llamafactory does not import in {root / 'venv'}:\n{check.stderr[-2000:]}")
    log(f"llamafactory venv ready: {check.stdout.strip()}")
    (root / "installed.ok").write_text(check.stdout, encoding="utf-8")
    return cli_path()


def dry_run(log=print) -> None:
    """What ``ensure`` would do here, doing none of it."""
    root = cache_root()
    py = root / "venv" / "bin" / "python"
    log(f"cache root {root}; llamafactory-cli {cli_path()}")
    if installed():
        log("installed: nothing to do")
        return
    log(f"would create the venv {root / 'venv'}" if not py.exists() else f"venv {root / 'venv'} there, not complete")
    log(f"would write {root / 'constraints.txt'}: {TORCH_PIN}")
    for cmd in install_commands(py, root / "constraints.txt"):
        log("would run: " + shlex.join(cmd))
    log("would uninstall torchvision torchcodec; remove torchaudio's lib/*.so; import llamafactory and torch to check")


if __name__ == "__main__":
    if sys.argv[1:] == ["--dry-run"]:
        dry_run()
    elif sys.argv[1:]:
        sys.exit(f"usage: python {sys.argv[0]} [--dry-run]")
    else:
        print(ensure())
    sys.exit(0)
