"""A real single-node Slurm (munged, slurmctld, slurmd) in a temp dir, for the live-scheduler tests.

As root, no systemd: a private munge key and socket, a generated ``slurm.conf`` (SlurmUser=root,
proctrack/linuxproc, task/none, select/cons_tres, no accounting), free ports, every state/spool/
log/pid path inside the temp dir. Clients find it through ``SLURM_CONF``. ``stop()`` cancels
every job, stops the daemons by their pid files and waits until none of their processes is left.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo")


def missing_reason() -> str | None:
    """Why a live Slurm cannot run here (None: it can)."""
    absent = [b for b in (*DAEMONS, *CLIENTS) if not shutil.which(b) and not os.path.exists(f"/usr/sbin/{b}")]
    if absent:
        return f"Slurm/munge not installed ({', '.join(absent)} missing): scripts/bootstrap.sh installs slurm-wlm and munge with apt-get as root"
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root (SlurmUser=root, munged with --force); not root here"
    return None


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class LocalSlurm:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.env = {"SLURM_CONF": str(self.conf)}

    # -- configuration ---------------------------------------------------------------------
    def write_conf(self) -> None:
        r = self.root
        for sub in ("state", "spool", "log"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        cpus = os.cpu_count() or 1
        lines = [
            "ClusterName=cockpit-test", f"SlurmctldHost={self.host}(127.0.0.1)", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none", "MpiDefault=none",
            "ReturnToService=2", f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "SchedulerType=sched/backfill", "MinJobAge=600", "KillWait=10", "InactiveLimit=0", "SlurmctldTimeout=60", "SlurmdTimeout=120",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=2048 State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def start_munge(self) -> None:
        d = self.root / "munge"
        d.mkdir(mode=0o700, exist_ok=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        subprocess.run(
            [_bin("munged"), f"--key-file={key}", f"--socket={self.munge_socket}", f"--pid-file={d / 'munged.pid'}",
             f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}", "--force"],
            check=True, capture_output=True, timeout=60,
        )

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, timeout: float = 180.0) -> None:
        self.write_conf()
        self.start_munge()
        for daemon in ("slurmctld", "slurmd"):
            res = subprocess.run([_bin(daemon), "-f", str(self.conf)], capture_output=True, text=True, timeout=60, cwd=self.root, check=False)
            if res.returncode != 0:
                raise RuntimeError(f"{daemon} did not start: {res.stderr.strip()}\n{self.log_tail()}")
        self.wait_idle(timeout)

    def client(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env}, check=False)

    def wait_idle(self, timeout: float) -> None:
        """Until sinfo shows the node idle (generous: the machine may be loaded)."""
        deadline, last = time.time() + timeout, ""
        while time.time() < deadline:
            res = self.client("sinfo", "-h", "-o", "%t")
            last = (res.stdout + res.stderr).strip()
            if res.returncode == 0 and last == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm node was not idle within {timeout:.0f} s (sinfo: {last!r})\n{self.log_tail()}")

    def log_tail(self, n: int = 15) -> str:
        out = []
        for log in (self.root / "log" / "slurmctld.log", self.root / "log" / "slurmd.log"):
            try:
                out += [f"{log.name}: {ln}" for ln in log.read_text(errors="replace").splitlines()[-n:]]
            except OSError:
                pass
        return "\n".join(out)

    def pids(self) -> dict[str, int]:
        found = {}
        for name, pidfile in (("slurmd", self.root / "slurmd.pid"), ("slurmctld", self.root / "slurmctld.pid"), ("munged", self.root / "munge" / "munged.pid")):
            try:
                found[name] = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                pass
        return found

    def stop(self, timeout: float = 60.0) -> list[str]:
        """Cancel every job, stop the daemons; the names of any process still alive (empty: clean)."""
        self.client("scancel", "--full", "--user=root")
        deadline = time.time() + timeout / 2
        while time.time() < deadline:
            res = self.client("squeue", "-h", "-o", "%i")
            if res.returncode != 0 or not res.stdout.strip():
                break
            time.sleep(0.5)
        pids = self.pids()
        for name in ("slurmd", "slurmctld", "munged"):
            if name in pids:
                try:
                    os.kill(pids[name], signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + timeout / 2
        while time.time() < deadline and any(_alive(p) for p in pids.values()):
            time.sleep(0.2)
        left = [n for n, p in pids.items() if _alive(p)]
        for name in left:
            os.kill(pids[name], signal.SIGKILL)
        return left
