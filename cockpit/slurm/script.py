"""Slurm batch scripts: the ``#SBATCH`` header and the job script of a submitted run. No torch.

GPUs are requested only when the config needs them: ``use_cpu: true`` asks for none; ``use_cpu:
false`` asks for ``nproc_per_node`` per node; unset (auto) asks for them unless the cluster is
known to have no GPU GRES (``sinfo``). ``slurm_gres: gpu:mi300x`` in the config writes
``--gres=gpu:mi300x:N`` instead of ``--gpus-per-node=N`` (clusters that name their GPUs).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cockpit.errors import InputError, Problem
from cockpit.redact import REDACTED, redact_env

# what a value written into an #SBATCH line unquoted may hold: names, times, counts, GRES, paths
SBATCH_VALUE = re.compile(r"[A-Za-z0-9_.:,/@%+=\-\[\]]+")


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    cpus_per_task: int | None = None
    exclusive: bool = True
    extra: tuple[str, ...] = field(default_factory=tuple)  # raw sbatch options, e.g. '--constraint=mi300x'


def cluster_has_gpus(timeout_s: float = 10.0) -> bool | None:
    """True/False when ``sinfo`` says whether any node has a GPU GRES; None when it cannot tell."""
    sinfo = shutil.which("sinfo")
    if not sinfo:
        return None
    try:
        out = subprocess.run([sinfo, "-h", "-o", "%G"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return any("gpu" in line.lower() for line in out.stdout.splitlines())


class SlurmConfig(Protocol):
    """What the batch script reads of a run's config (:class:`cockpit.config.run_config.RunConfig` has
    it): named here, so ``cockpit.slurm`` stays below the config package."""

    @property
    def use_cpu(self) -> bool | None:
        """Set: GPUs asked for or not; unset: GPUs unless the cluster is known to have none."""

    @property
    def nproc_per_node(self) -> int:
        """GPUs per node, one per rank."""

    @property
    def nnodes(self) -> int:
        """``--nodes``, one task each."""

    @property
    def slurm_gres(self) -> str | None:
        """The GPU type of ``--gres`` (else ``--gpus-per-node``)."""

    @property
    def env(self) -> Mapping[str, str] | None:
        """Exported by the script, its secrets left out."""


def needs_gpus(use_cpu: Any, has_gpus: bool | None = None) -> bool:
    """Whether a run with this ``use_cpu`` asks Slurm for GPUs (``has_gpus``: the cluster's, None unknown)."""
    if use_cpu is not None:
        return not (use_cpu is True or str(use_cpu).lower() in ("true", "1", "yes"))
    return has_gpus is not False  # auto: a GPU run unless the cluster has no GPUs


def gpu_lines(cfg: SlurmConfig, has_gpus: bool | None) -> list[str]:
    if not needs_gpus(cfg.use_cpu, has_gpus):
        return []
    nproc = int(cfg.nproc_per_node)
    gres = cfg.slurm_gres
    return [f"#SBATCH --gres={gres}:{nproc}"] if gres else [f"#SBATCH --gpus-per-node={nproc}"]


def header(
    cfg: SlurmConfig,
    opts: SlurmOptions,
    *,
    job_name: str,
    has_gpus: bool | None = None,
    output: str | None = None,
) -> list[str]:
    """``#!/bin/bash`` and the ``#SBATCH`` lines: one task per node; GPUs only when needed."""
    refuse_unsafe_values(cfg.slurm_gres, opts, job_name)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={int(cfg.nnodes)}",
        "#SBATCH --ntasks-per-node=1",
    ]
    lines += gpu_lines(cfg, has_gpus)
    for flag, value in (
        ("partition", opts.partition),
        ("account", opts.account),
        ("qos", opts.qos),
        ("time", opts.time),
        ("cpus-per-task", opts.cpus_per_task),
    ):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    if output:
        lines.append(f"#SBATCH --output={output}")
    if opts.exclusive:
        lines.append("#SBATCH --exclusive")
    lines += [f"#SBATCH {shlex.quote(x)}" for x in opts.extra]
    return lines


def refuse_unsafe_values(slurm_gres: str | None, opts: SlurmOptions, job_name: str) -> None:
    """Every value that reaches an ``#SBATCH`` line (the config's ``slurm_gres``, the options, the job
    name), checked: a newline in one would start a shell command of the batch script. Raises InputError naming each bad one (exit 2, nothing submitted)."""
    unquoted = {
        "slurm_gres": slurm_gres,
        "--partition": opts.partition,
        "--account": opts.account,
        "--qos": opts.qos,
        "--time": opts.time,
        "--cpus-per-task": opts.cpus_per_task,
        "--job-name (the run id)": job_name,
    }
    problems = [
        Problem(f"{value!r} cannot go on an #SBATCH line: only letters, digits and _ . : , / @ % + = - [ ]", key=name)
        for name, value in unquoted.items()
        if value is not None and not SBATCH_VALUE.fullmatch(str(value))
    ]
    problems += [
        Problem(f"{x!r} holds a newline or control character", key="--sbatch-arg")
        for x in opts.extra
        if any(ord(c) < 32 or c == "\x7f" for c in x)
    ]
    if problems:
        raise InputError(problems)


def env_lines(cfg: SlurmConfig) -> list[str]:
    env = redact_env({k: str(v) for k, v in (cfg.env or {}).items()}) or {}
    if not env:
        return []
    out = ["# the config's env (the cockpit applies it to every rank as well)"]
    out += [
        f"export {k}={shlex.quote(v)}"
        if v != REDACTED
        else f"# {k}: a secret, not written here; export it in the job's environment"
        for k, v in env.items()
    ]
    return out


MASTER_LINES = [
    "# the first node of the allocation hosts the c10d rendezvous",
    'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
    "export MASTER_ADDR",
    "# every CPU of the allocation to the one task per node (srun does not inherit --cpus-per-task)",
    'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE}"',
]


def job_script(
    run_path: str,
    cfg: SlurmConfig,
    opts: SlurmOptions,
    *,
    job_name: str,
    has_gpus: bool | None,
    python: str = sys.executable,
) -> str:
    """The script ``cockpit train --slurm`` submits: each node's task runs ``cockpit.run.slurm_node``,
    which starts the supervisor of the run dir that already exists (node 0) or of its
    ``nodes/node<K>`` sub-run (node K)."""
    nnodes = int(cfg.nnodes)
    lines = header(cfg, opts, job_name=job_name, has_gpus=has_gpus, output=f"{run_path}/logs/slurm-%j.out")
    lines += [f"#SBATCH --chdir={run_path}", "set -euo pipefail", "", *MASTER_LINES, *env_lines(cfg), ""]
    lines += [
        "# one cockpit supervisor per node, in the foreground: the job lasts as long as the run",
        f"srun --kill-on-bad-exit=1 --nodes={nnodes} --ntasks={nnodes} --ntasks-per-node=1 {shlex.quote(python)} -m cockpit.run.slurm_node {shlex.quote(run_path)}",
        "",
    ]
    return "\n".join(lines)


def train_script(
    config_path: str,
    train_args: Sequence[str],
    cfg: SlurmConfig,
    opts: SlurmOptions,
    *,
    job_name: str,
    has_gpus: bool | None,
) -> str:
    """A standalone script (``cockpit preview --sbatch``): each node runs ``cockpit train``."""
    nnodes = int(cfg.nnodes)
    lines = header(cfg, opts, job_name=job_name, has_gpus=has_gpus) + [
        "set -euo pipefail",
        "",
        *MASTER_LINES,
        *env_lines(cfg),
    ]
    cmd = (
        shlex.join(["cockpit", "train", config_path, *train_args])
        + ' --set node_rank="$SLURM_NODEID" --set master_addr="$MASTER_ADDR"'
    )
    lines += [
        "",
        "# one cockpit supervisor per node; `cockpit train` follows its run until it ends",
        f"srun --kill-on-bad-exit=1 --nodes={nnodes} --ntasks={nnodes} bash -c {shlex.quote(cmd)}",
        "",
    ]
    return "\n".join(lines)
