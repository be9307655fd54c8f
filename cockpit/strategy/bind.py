"""``python -m cockpit.strategy.bind --map 0:0,1:1 [--method numactl|sched_setaffinity] -- CMD ...``

Runs under torchrun (``--no-python``) in front of each rank: looks up ``LOCAL_RANK`` in the
map and ``exec``s ``numactl --cpunodebind=N --preferred=N CMD`` (``--memory strict``: ``--membind=N``) (or sets the CPU affinity to the
node's CPUs and execs CMD). ``exec`` keeps the pid: torchrun's child, the rank and the pid in
``rank_started`` are one process. Writes ``logs/numa.local<R>.json`` in the run dir
(``$COCKPIT_RUN_DIR``) with what it did. A rank not in the map runs unbound.

With a single process (no torchrun), it also points stdout/stderr at ``logs/rank0.log`` as the
supervisor does for a bare worker. Pure: no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from cockpit.strategy.numa import MEMORY_POLICIES, node_cpus, numactl_prefix, parse_map


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(
            "usage: python -m cockpit.strategy.bind --map R:N,... [--method M] [--sysfs DIR] -- CMD ...",
            file=sys.stderr,
        )
        return 2
    i = argv.index("--")
    own, cmd = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(prog="cockpit.strategy.bind")
    ap.add_argument("--map", required=True)
    ap.add_argument("--method", default="numactl", choices=("numactl", "sched_setaffinity"))
    ap.add_argument("--memory", default="preferred", choices=MEMORY_POLICIES)
    ap.add_argument("--sysfs", default="/sys")
    ap.add_argument("--single", action="store_true", help="one process without torchrun: log to logs/rank0.log")
    args = ap.parse_args(own)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    node = parse_map(args.map).get(local_rank)
    run_dir = os.environ.get("COCKPIT_RUN_DIR")
    if args.single and run_dir:
        fd = os.open(Path(run_dir) / "logs" / "rank0.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    record = {
        "local_rank": local_rank,
        "node": node,
        "method": args.method if node is not None else None,
        "memory": args.memory if node is not None and args.method == "numactl" else None,
        "pid": os.getpid(),
    }
    if node is not None and args.method == "numactl":
        cmd = [*numactl_prefix(node, args.memory), *cmd]
    elif node is not None:
        cpus = node_cpus(node, args.sysfs)
        if cpus:
            try:
                os.sched_setaffinity(0, cpus)
            except OSError as exc:
                record["error"] = f"sched_setaffinity: {exc}"
        record["cpus"] = cpus
    record["command"] = cmd
    if run_dir:
        try:
            path = Path(run_dir) / "logs" / f"numa.local{local_rank}.json"
            path.write_text(json.dumps(record))
        except OSError:
            pass
    print(
        f"[numa] local rank {local_rank}: " + (f"node {node} via {args.method}" if node is not None else "not bound"),
        flush=True,
    )
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"cockpit: cannot start {cmd[0]}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
