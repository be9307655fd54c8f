"""Should ``expandable_segments:True`` be Cockpit's allocator default on ROCm? (docs/rocm.md, item 2)

On a GPU, each allocator setting runs in a fresh process (the caching allocator reads its variable once)
over two allocation patterns, and the table says the peak and final reserved memory and the time:

- ``pr123548``: pytorch/pytorch#123548's pattern (91 MiB and 45.5 MiB blocks freed each cycle behind a
  2 MiB block that stays alive), which grows reserved memory without bound when ``max_split_size_mb``
  and ``expandable_segments:True`` are set together;
- ``varlen``: a training-like pattern, activations of varying sequence lengths (64-2048 tokens of a
  4096-wide bf16 layer stack) allocated and freed each step, the fragmentation expandable segments
  are meant to avoid.

    python bench/alloc_conf.py [--cycles 100]     # on a GPU; prints one line and exits 0 without one

The variable is PYTORCH_HIP_ALLOC_CONF on ROCm, PYTORCH_CUDA_ALLOC_CONF on CUDA. Results go in
docs/rocm.md with the date and the device.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

SETTINGS = {
    "default": "",
    "expandable": "expandable_segments:True",
    "max_split_128": "max_split_size_mb:128",
    "both (pytorch#123548)": "max_split_size_mb:128,expandable_segments:True",
}

CHILD = r"""
import json, random, sys, time
import torch
pattern, cycles = sys.argv[1], int(sys.argv[2])
mib = 1 << 20
dev = torch.device("cuda:0")
torch.cuda.reset_peak_memory_stats(dev)
t0 = time.perf_counter()
kept = []
random.seed(0)
for i in range(cycles):
    if pattern == "pr123548":
        a = torch.empty(91 * mib, dtype=torch.uint8, device=dev)
        b = torch.empty(int(45.5 * mib), dtype=torch.uint8, device=dev)
        kept.append(torch.empty(2 * mib, dtype=torch.uint8, device=dev))
        del a, b
    else:
        seq = random.choice((64, 128, 256, 512, 1024, 2048))
        acts = [torch.empty(seq, 4096, dtype=torch.bfloat16, device=dev) for _ in range(24)]
        kept = kept[-8:] + [torch.empty(seq, 64, dtype=torch.bfloat16, device=dev)]
        del acts
torch.cuda.synchronize(dev)
print(json.dumps({"peak_reserved_mib": torch.cuda.max_memory_reserved(dev) // mib,
                  "final_reserved_mib": torch.cuda.memory_reserved(dev) // mib,
                  "allocated_mib": torch.cuda.memory_allocated(dev) // mib,
                  "seconds": round(time.perf_counter() - t0, 3)}))
"""

PROBE = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0, bool(torch.version.hip))"


def measure(setting: str, pattern: str, cycles: int, rocm: bool) -> dict:
    import os

    var = "PYTORCH_HIP_ALLOC_CONF" if rocm else "PYTORCH_CUDA_ALLOC_CONF"
    env = {k: v for k, v in os.environ.items() if not k.endswith("ALLOC_CONF")}
    if SETTINGS[setting]:
        env[var] = SETTINGS[setting]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, pattern, str(cycles)], capture_output=True, text=True, env=env, timeout=600
    )
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:120]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True).stdout.split()
    if not probe or probe[0] == "0":
        print("alloc_conf: skipped: no GPU visible to torch")
        return 0
    rocm = probe[1] == "True"
    rows = [
        {"setting": s, "pattern": p, **measure(s, p, args.cycles, rocm)}
        for p in ("pr123548", "varlen")
        for s in SETTINGS
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'pattern':<10} {'setting':<24} {'peak MiB':>9} {'final MiB':>9} {'s':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r['pattern']:<10} {r['setting']:<24} {r['error']}")
        else:
            shown = f"{r['peak_reserved_mib']:>9} {r['final_reserved_mib']:>9} {r['seconds']:>7}"
            print(f"{r['pattern']:<10} {r['setting']:<24} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
