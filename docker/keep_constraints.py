"""Constraints for installing Cockpit into an image that already has its ROCm torch and amdsmi.

``python docker/keep_constraints.py scripts/constraints.txt > /tmp/constraints.txt`` prints:
  * ``NAME==VERSION`` for each package of the image that must stay as it is (torch, the ROCm
    triton, torchvision/torchaudio, amdsmi from /opt/rocm) and is installed: pip then keeps the
    installed build, and fails instead of replacing it if something asks for another version;
  * every line of the CI pins (``scripts/constraints.txt``) except those for the kept packages
    (the CI pins a PyPI amdsmi; the image's own, from its ROCm, must win).

Standard library only: it runs in the image before Cockpit is installed (and in tests/test_docker.py).
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys

# The image's own builds: never replaced by a PyPI wheel (a CUDA/CPU torch would break ROCm).
KEEP = ("torch", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm", "amdsmi")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_pins(keep=KEEP) -> list[str]:
    pins = []
    for name in keep:
        try:
            pins.append(f"{name}=={md.version(name)}")
        except md.PackageNotFoundError:
            continue
    return pins


def merged(ci_lines: list[str], keep=KEEP) -> list[str]:
    kept = {normalize(k) for k in keep}
    out = installed_pins(keep)
    for line in ci_lines:
        bare = line.split("#", 1)[0].strip()
        if not bare:
            continue
        name = re.split(r"[<>=!~;\[ ]", bare, maxsplit=1)[0]
        if normalize(name) not in kept:
            out.append(bare)
    return out


def main(argv: list[str]) -> int:
    ci_lines: list[str] = []
    for path in argv:
        with open(path, encoding="utf-8") as f:
            ci_lines += f.read().splitlines()
    print("\n".join(merged(ci_lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
