"""How fast the event log of a multi-node run grows from telemetry, by GPU count (8 GPUs a node).

    python bench/telemetry_volume.py [--seconds 600] [--gpus 16 64 512 4096]

Simulated time, real code: every node's ``NodeReporter`` publishes its 8 fake MI300X (the fakes of
``cockpit/telemetry/fakes.py``, through ``AmdSmiBackend``) to a store every second with a new step
each second (the worst case for heartbeats), global rank 0's ``NodeCollector`` folds them into
events, and node 0's supervisor writes its own ``telemetry`` sample every second (``Sampler``).
Every event is encoded as ``EventWriter`` writes it (``cockpit.store.events.encode``). Beside it,
what the previous design wrote for the same run (a ``heartbeat`` per node each time its step moved,
every other node's full ``telemetry`` every 3 s), rebuilt here from the same device records.

Prints bytes/s per GPU count and a JSON summary. No torch, no store server: the bytes, not the
transport, are measured (tests/test_node_grid.py runs the collector over a real TCPStore).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from cockpit.store.events import encode  # noqa: E402
from cockpit.telemetry import AmdSmiBackend, Sampler  # noqa: E402
from cockpit.telemetry.fakes import FakeAmdSmi, FakeGpu  # noqa: E402
from cockpit.telemetry.node import NodeCollector, NodeReporter  # noqa: E402
from ui_screenshots import DictStore  # noqa: E402  (scripts/: the rendezvous store's three calls, in a dict)

GPUS_PER_NODE = 8


def node_backend(node: int) -> AmdSmiBackend:
    gpus = [FakeGpu(bdf=f"0000:{0x0C + i:02x}:00.0", vram_used_mb=int(196592 * (0.5 + 0.05 * ((node + i) % 9))),
                    gfx_activity=60 + (node * 3 + i) % 40, temp_hotspot_c=55 + (node + 2 * i) % 30,
                    current_socket_power=400 + (node + i) % 300, processes=[(1000 + i, 2**30)]) for i in range(GPUS_PER_NODE)]
    module = FakeAmdSmi(gpus)
    module.amdsmi_init()
    return AmdSmiBackend(module)


def measure(n_gpus: int, seconds: int) -> dict:
    nnodes = max(1, n_gpus // GPUS_PER_NODE)
    store = DictStore()
    backends = [node_backend(n) for n in range(nnodes)]
    reporters = [NodeReporter(store, n, f"node-{n:03d}", None if n == 0 else backends[n]) for n in range(nnodes)]
    now = [0.0]
    collector = NodeCollector(store, nnodes, own_node=0, clock=lambda: now[0])
    sampler = Sampler({0: 1000}, backend=backends[0], unavailable={"nvml": "not tried: amdsmi is active"})
    new_bytes = old_bytes = 0
    kinds: dict[str, int] = {}
    old_relayed: dict[int, float] = {}
    for tick in range(1, seconds + 1):
        now[0] = float(tick)
        for r in reporters:
            r.step = tick
            r.publish()
        node0 = encode("telemetry", **sampler.sample(), node_rank=0, host="node-000")
        new_bytes += len(node0.encode())
        old_bytes += len(node0.encode())
        for kind, fields in collector.collect():
            size = len(encode(kind, **fields).encode())
            new_bytes += size
            kinds[kind] = kinds.get(kind, 0) + size
        # the previous design: a heartbeat per node whose step moved, full telemetry of the others every 3 s
        for n in range(nnodes):
            old_bytes += len(encode("heartbeat", node_rank=n, host=f"node-{n:03d}", step=tick, seq=tick,
                                    train_ended=False).encode())
            if n and now[0] - old_relayed.get(n, -1e9) >= 3.0:
                old_relayed[n] = now[0]
                old_bytes += len(encode("telemetry", node_rank=n, host=f"node-{n:03d}", source="node_reporter",
                                        backend="amdsmi", devices=backends[n].devices(), ranks=[],
                                        unavailable={"nvml": "not tried: amdsmi is active"}).encode())
    return {"gpus": nnodes * GPUS_PER_NODE, "nodes": nnodes, "seconds": seconds,
            "bytes_per_s": round(new_bytes / seconds), "before_bytes_per_s": round(old_bytes / seconds),
            "by_kind_bytes_per_s": {k: round(v / seconds) for k, v in sorted(kinds.items())},
            "node0_telemetry_bytes_per_s": round(len(node0.encode())),
            "grid_period_s": round(collector.grid_period_s(), 1),
            "mb_per_day": round(new_bytes / seconds * 86400 / 2**20, 1),
            "before_mb_per_day": round(old_bytes / seconds * 86400 / 2**20, 1)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=600, help="simulated seconds (1 Hz telemetry)")
    ap.add_argument("--gpus", type=int, nargs="+", default=[16, 64, 512, 4096])
    args = ap.parse_args()
    results = [measure(n, args.seconds) for n in args.gpus]
    for r in results:
        print(f"{r['gpus']:>5} GPUs ({r['nodes']:>3} nodes): {r['bytes_per_s']:>6} B/s ({r['mb_per_day']} MiB/day)"
              f"  before: {r['before_bytes_per_s']:>7} B/s ({r['before_mb_per_day']} MiB/day)  grid every {r['grid_period_s']} s",
              flush=True)
    print(json.dumps({"results": results, "budget_grid_bytes_per_s": 2048}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
