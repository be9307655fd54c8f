"""What the GaLore / APOLLO side folder on sys.path costs every ``import peft`` (issue 37).

    python bench/lowrank_import.py [--repeats 5]

PEFT imports bitsandbytes whenever it is importable, and galore-torch / apollo-torch need it, so
``<venv>/lowrank-site`` (cockpit/side_site.py) holds all three off sys.path. This times a fresh
``python -c "import peft"`` without and with the folder on PYTHONPATH, alternating, and prints the
medians and whether bitsandbytes was imported. Wall time of whole processes: a box loaded by other
work inflates both columns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cockpit import side_site

CODE = "import sys, peft; print('bitsandbytes' in sys.modules)"


def one(pythonpath: str) -> tuple[float, bool]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, res.stdout.strip().splitlines()[-1] == "True"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    site = side_site.folder()
    if not side_site.holds("bitsandbytes"):
        print(f"no bitsandbytes in {site}: {side_site.install_command()}")
        return 1
    base = os.environ.get("PYTHONPATH", "")
    runs: dict[str, list[float]] = {"without": [], "with": []}
    seen: dict[str, bool] = {}
    one(base)  # warm the page cache
    for _ in range(args.repeats):
        for name, path in (("without", base), ("with", os.pathsep.join(p for p in (str(site), base) if p))):
            t, bnb = one(path)
            runs[name].append(t)
            seen[name] = bnb
    for name, times in runs.items():
        print(
            f"import peft {name:7s} the side folder: median {statistics.median(times):.2f} s "
            f"(min {min(times):.2f}, max {max(times):.2f}, n={len(times)}); bitsandbytes imported: {seen[name]}"
        )
    extra = statistics.median(runs["with"]) - statistics.median(runs["without"])
    print(f"cost of the side folder on the path: {extra:+.2f} s per process (load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
