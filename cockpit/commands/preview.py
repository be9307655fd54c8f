"""``cockpit preview CONFIG [--set k=v ...] [--json] [--hosts h1,h2] [--sbatch FILE] [--hostfile FILE]``

The exact launch of a run without starting it: the strategy, this node's command (torchrun,
c10d rendezvous, NUMA wrapping), every rank's command and environment (the config's ``env``
with secrets redacted), the generated DeepSpeed config, and, for several nodes, the command to
run on each other node; ``--sbatch`` / ``--hostfile`` write a Slurm script / DeepSpeed hostfile
for the same run. No torch.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from cockpit.commands.common import EXIT_OK, add_config_args, config_from_args, print_input_error
from cockpit.config.run_config import RunConfig
from cockpit.errors import InputError

RUN_DIR = "<RUN_DIR>"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--json", action="store_true", help="print the preview as JSON")
    p.add_argument("--hosts", default=None, help="comma-separated node names for the hostfile (node 0 first)")
    p.add_argument("--sbatch", default=None, metavar="FILE", help="write a Slurm sbatch script for this run")
    p.add_argument("--hostfile", default=None, metavar="FILE", help="write a DeepSpeed hostfile for this run")


def build(args: argparse.Namespace, cfg: RunConfig) -> dict:
    from cockpit.strategy import deepspeed as ds
    from cockpit.strategy.launch import node_launch
    from cockpit.strategy.multinode import hostfile, node_commands, sbatch_script

    shown = cfg if cfg.master_port else cfg.replace(master_port=0)
    launch = node_launch(RUN_DIR, "<RUN_ID>", shown)
    out = launch.as_dict()
    out["world_size"] = cfg.world_size
    out["node_rank"] = int(cfg.node_rank)
    out["command_shell"] = shlex.join(launch.command)
    if not cfg.master_port and out["world_size"] > 1:
        out["notes"].append(
            "master_port 0: a free port is picked at launch (the command shows torchrun's default 29500)"
        )
    source, name = ds.source(cfg.keys_only())
    out["deepspeed_config"] = source
    out["deepspeed_config_source"] = name
    if int(cfg.nnodes) > 1:
        out["nodes"] = node_commands(args.config, args.overrides, cfg)
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()] if args.hosts else None
    if args.sbatch:
        from cockpit.slurm.script import cluster_has_gpus

        Path(args.sbatch).write_text(
            sbatch_script(
                args.config,
                args.overrides,
                cfg,
                job_name=f"cockpit-{Path(args.config).stem}",
                has_gpus=cluster_has_gpus(),
            )
        )
        out["sbatch"] = str(args.sbatch)
    if args.hostfile:
        Path(args.hostfile).write_text(hostfile(cfg, hosts))
        out["hostfile"] = str(args.hostfile)
    return out


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
        out = build(args, cfg)
    except InputError as err:
        if args.json:
            print(json.dumps({"ok": False, "problems": [str(p) for p in err.problems]}, ensure_ascii=False))
        return print_input_error(err)
    if args.json:
        print(json.dumps(out, ensure_ascii=False, default=str))
        return EXIT_OK
    print(f"strategy: {out['strategy']}  (world size {out['world_size']}, node {out['node_rank']} of {cfg.nnodes})")
    print("command (this node):")
    print(f"  {out['command_shell']}")
    numa = out["numa"] or {}
    print(
        f"NUMA binding: {numa.get('mode')}"
        + (f" via {numa.get('method')}, local rank:node {numa.get('nodes')}" if numa.get("nodes") else "")
    )
    for r in out["ranks"]:
        print(
            f"rank {r['rank']} (local {r['local_rank']}, node {r['node_rank']}"
            + (f", NUMA node {r['numa_node']}" if r["numa_node"] is not None else "")
            + "):"
        )
        print(f"  {shlex.join(r['command'])}")
        for k, v in r["env"].items():
            print(f"    {k}={v}")
    if out.get("deepspeed_config") is not None:
        print(
            f'DeepSpeed config ({out["deepspeed_config_source"]}; "auto" is filled by HF Trainer in the ranks, the result goes to RUN_DIR/ds_config.json):'
        )
        for line in json.dumps(out["deepspeed_config"], indent=2).splitlines():
            print(f"  {line}")
    for node in out.get("nodes", []):
        if node["node_rank"] != out["node_rank"]:
            print(f"on node {node['node_rank']}:  {node['shell']}")
    for key in ("sbatch", "hostfile"):
        if out.get(key):
            print(f"wrote {key}: {out[key]}")
    for note in out["notes"]:
        print(f"note: {note}")
    return EXIT_OK
