"""The run queue: configs that wait in the runs dir and start when the GPUs they need are free.

``python -m cockpit.run.queue RUNS_DIR`` is the queue runner, a detached process (its own session,
like a run's supervisor) started by ``cockpit queue add`` when none is alive. Each turn (every
second) it settles the entries in flight (their runs' states: the liveness check decides, as for
every reader), starts the queued entries that fit as normal runs (``launch.start_run``: each its
own supervisor), and exits when the queue is empty.

GPUs. The host's GPUs (:func:`host_gpus`: the AMD / NVIDIA GPUs on the PCI bus, read from sysfs
without torch or a GPU library, narrowed by HIP/CUDA/ROCR_VISIBLE_DEVICES; ``$COCKPIT_QUEUE_DEVICES``
declares them instead, a test / ops override) are read once when the runner starts. An entry needs
``nproc_per_node`` GPUs (:func:`gpus_needed`; a ``use_cpu: true`` run needs the whole host). An
active run holds status.json ``gpus``: the list the queue gave it, or for a run started outside the
queue (``cockpit train``, a resume) the GPUs its ranks take (:func:`taken_gpus`: the first
``nproc_per_node`` its environment shows, a hand-pinned ``HIP_VISIBLE_DEVICES=3`` included); a run
without that record (where they cannot be named) counts as holding every GPU. :func:`assign`
(pure) starts the queued entries in order while each fits the free GPUs, head of line (the first
that does not fit waits, and so do all behind it); each gets the first free GPUs as
HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES (``device.visible_env``), so several runs can be
active at once. On a host without GPUs runs start one at a time: any active run of the runs dir
(the queue's, or one started by hand) holds the host.

The runner owns nothing a run needs: killed, its runs in flight go on under their own supervisors,
and the next ``cockpit queue ...`` command (:func:`ensure_runner`) starts a new runner, which finds
the started entries (status.json ``queue_entry``), waits for their runs and goes on. Layout::

    <runs_dir>/queue/
      entries.json   atomic (tmp + rename), changed under the flock .lock:
                     {"entries": [{id, config, overrides, cwd, added, state, run_id, gpus_needed, gpus,
                                   output_dir}],
                      "done": [...]}
                     state: queued | launching (the runner is starting it, on ``gpus``) | started (run_id)
      .runner.lock   flock held by the queue runner for its life (a second runner exits)
      runner.json    the runner's pid and start time
      runner.log     the runner's own output (the GPUs it found; each start and on which GPUs)

No torch, no textual.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.device import CPU, INDEX_VARS, listed, resolve_device, visible_gpus
from cockpit.store.rundir import TERMINAL_STATES, RunDir, atomic_write_json, list_runs

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

POLL_S = 0.25  # a finished run frees its slot within a quarter second; each poll reads one small JSON
DONE_KEPT = 50
DEVICES_ENV = "COCKPIT_QUEUE_DEVICES"  # test / ops override of the host's GPUs: "0,1"; "" for none
ALL = "all"  # an entry that runs alone, holding every GPU (a CPU run)
SLURM_REFUSAL = "queued by Slurm, not by this queue: submit it with cockpit train --slurm"


def queue_dir(runs_dir: str | os.PathLike[str]) -> Path:
    return Path(runs_dir).expanduser() / "queue"


def _entries_path(runs_dir: Path) -> Path:
    return queue_dir(runs_dir) / "entries.json"


@contextmanager
def _flock(path: Path, blocking: bool = True) -> Iterator[bool]:
    """Hold an flock on ``path`` (yields False when ``blocking`` is False and another holds it)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def read_queue(runs_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads(_entries_path(runs_dir).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        data = {}
    return {"entries": list(data.get("entries") or []), "done": list(data.get("done") or [])}


@contextmanager
def changing(runs_dir: Path) -> Iterator[dict[str, Any]]:
    """The queue, read under its lock; written back atomically when the block ends without error
    and changed it (the runner's turns that change nothing write nothing)."""
    with _flock(queue_dir(runs_dir) / ".lock"):
        data = read_queue(runs_dir)
        before = json.dumps(data, sort_keys=True)
        yield data
        if json.dumps(data, sort_keys=True) != before or not _entries_path(runs_dir).exists():
            atomic_write_json(_entries_path(runs_dir), data)


def slurm_keys(cfg: RunConfig) -> list[str]:
    """The config's Slurm keys that are set: such a run is queued by Slurm."""
    return [k for k, v in cfg.keys_only().items() if k.startswith("slurm") and v not in (None, "", False)]


def queue_refusal(cfg: RunConfig) -> str | None:
    """Why this queue does not take the config, or None: a Slurm run (Slurm queues it) or a run on
    several nodes (its ranks start on every node; started here alone it would wait for the others)."""
    if keys := slurm_keys(cfg):
        return f"{SLURM_REFUSAL} ({', '.join(keys)} set)"
    nodes = int(cfg.nnodes or 1)
    if nodes > 1:
        return (
            f"nnodes: {nodes}: a run on several nodes starts on every node, not from this host's queue; "
            "launch it with cockpit train on each node, or with --slurm"
        )
    return None


def new_entry(config: str, overrides: list[str], cwd: str) -> dict[str, Any]:
    return {
        "id": secrets.token_hex(3),
        "config": str(Path(cwd, config).resolve()),
        "overrides": list(overrides),
        "cwd": cwd,
        "added": round(time.time(), 3),
        "state": "queued",
        "run_id": None,
    }


def add_entry(
    runs_dir: Path, config: str, overrides: list[str], cwd: str | None = None, output_dir: str | None = None
) -> dict[str, Any]:
    """Append an entry (the config already checked by the caller); returns it with its position.
    ``output_dir``: the config's, resolved (``cockpit.run.shared_output`` refuses a second writer)."""
    entry = {**new_entry(config, overrides, cwd or os.getcwd()), "output_dir": output_dir}
    with changing(runs_dir) as data:
        data["entries"].append(entry)
    return {**entry, "position": positions(data["entries"])[entry["id"]]}


def positions(entries: list[dict[str, Any]]) -> dict[str, int]:
    """Queued entries' positions, 1 = next to start (a started entry is position 0)."""
    out: dict[str, int] = {}
    n = 0
    for e in entries:
        if e["state"] == "queued":
            n += 1
            out[e["id"]] = n
        else:
            out[e["id"]] = 0
    return out


def find_entry(entries: list[dict[str, Any]], ref: str) -> dict[str, Any]:
    """An entry by id or unique id prefix; raises LookupError."""
    matches = [e for e in entries if e["id"] == ref] or [e for e in entries if e["id"].startswith(ref)]
    if len(matches) != 1:
        raise LookupError(f"no queued entry {ref!r}" if not matches else f"{ref!r} matches several entries")
    return matches[0]


def remove_entry(runs_dir: Path, ref: str) -> dict[str, Any]:
    """Take a queued entry out; a started one is a run: stop it with cockpit stop."""
    with changing(runs_dir) as data:
        entry = find_entry(data["entries"], ref)
        if entry["state"] != "queued":
            raise LookupError(
                f"entry {entry['id']} has started as run {entry['run_id'] or '(starting)'}: cockpit stop it"
            )
        data["entries"].remove(entry)
    return entry


def move_entry(runs_dir: Path, ref: str, position: int) -> dict[str, int]:
    """Put a queued entry at ``position`` (1 = next; clamped to the queue); returns the positions."""
    if position < 1:
        raise ValueError("the position counts from 1 (the next to start)")
    with changing(runs_dir) as data:
        entries = data["entries"]
        entry = find_entry(entries, ref)
        if entry["state"] != "queued":
            raise LookupError(f"entry {entry['id']} has already started")
        entries.remove(entry)
        queued = [i for i, e in enumerate(entries) if e["state"] == "queued"]
        at = queued[position - 1] if position <= len(queued) else len(entries)
        entries.insert(at, entry)
    return positions(data["entries"])


def listing(runs_dir: Path) -> list[dict[str, Any]]:
    """The entries in order, each with its position (0: started, with its run's state)."""
    entries = read_queue(runs_dir)["entries"]
    pos = positions(entries)
    rows = []
    for e in entries:
        state = e["state"]
        if e.get("run_id"):
            state = RunDir(Path(runs_dir) / e["run_id"]).read_status().get("state") or state
        rows.append({**e, "position": pos[e["id"]], "run_state": state})
    return rows


def gpus_text(entry: dict[str, Any]) -> str:
    """The GPUs an entry holds ("GPU 0,1") or waits for ("needs 2 GPUs"); "" when it has none to say
    (a host without GPUs, or a need not yet worked out)."""
    if entry.get("gpus"):
        return f"GPU {','.join(entry['gpus'])}"
    need = entry.get("gpus_needed")
    if need == ALL:
        return "needs all GPUs"
    return f"needs {need} GPU{'s' if need != 1 else ''}" if need else ""


# -- the runner -------------------------------------------------------------------------------


def runner_alive(runs_dir: Path) -> bool:
    """A queue runner holds .runner.lock (the flock dies with its process, SIGKILL included)."""
    with _flock(queue_dir(runs_dir) / ".runner.lock", blocking=False) as got:
        return not got


def ensure_runner(runs_dir: Path) -> int | None:
    """Adopt the queue: start a runner when entries remain and none is alive; its pid, else None."""
    if not read_queue(runs_dir)["entries"] or runner_alive(runs_dir):
        return None
    return spawn_runner(runs_dir).pid


def spawn_runner(runs_dir: Path) -> subprocess.Popen:
    qdir = queue_dir(runs_dir)
    qdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    log = open(qdir / "runner.log", "ab", buffering=0)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "cockpit.run.queue", str(Path(runs_dir).expanduser().resolve())],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(qdir),
            start_new_session=True,  # setsid: survives the command, the UI and an SSH drop
            close_fds=True,
        )
    finally:
        log.close()


def run_state(runs_dir: Path, run_id: str) -> str:
    """The state of a run the queue started, liveness checked (a dead supervisor: adopted or ended)."""
    from cockpit.run.liveness import reconcile

    run = RunDir(Path(runs_dir) / run_id)
    if not run.status_path.exists():
        return "removed"
    return str(reconcile(run).get("state") or "starting")


def find_started(runs_dir: Path, entry_id: str) -> str | None:
    """The run a runner started for ``entry_id`` before it died (status.json ``queue_entry``)."""
    for run in list_runs(runs_dir):
        if run.read_status().get("queue_entry") == entry_id:
            return run.run_id
    return None


def finish(data: dict[str, Any], entry: dict[str, Any], state: str, reason: str | None = None) -> None:
    data["entries"].remove(entry)
    done = {**entry, "state": state, "reason": reason, "ended": round(time.time(), 3)}
    data["done"] = [*data["done"], done][-DONE_KEPT:]


def settle(runs_dir: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Settle the entries in flight (under the lock): those whose run is still active."""
    active = []
    for entry in [e for e in data["entries"] if e["state"] != "queued"]:
        if not entry.get("run_id"):
            entry["run_id"] = find_started(runs_dir, entry["id"])
            if not entry["run_id"]:  # the runner died before the run existed: start it again
                entry.update(state="queued", gpus=None)
                continue
            entry["state"] = "started"
        state = run_state(runs_dir, entry["run_id"])
        if state in TERMINAL_STATES or state == "removed":
            finish(data, entry, state)
        else:
            active.append(entry)
    return active


# -- GPUs: which the host has, which each run holds, which an entry gets ----------------------


def host_gpus(env: Mapping[str, str] | None = None, sysfs: str = "/sys") -> list[str]:
    """The GPUs the queue hands out: ``$COCKPIT_QUEUE_DEVICES`` (a test / ops override at the
    hardware boundary: "0,1", or "" for none), else the AMD / NVIDIA GPUs on the PCI bus (sysfs, as
    NUMA binding finds them: no torch, no GPU library), narrowed by *_VISIBLE_DEVICES."""
    from cockpit.strategy.numa import sysfs_gpu_nodes

    env = os.environ if env is None else env
    if DEVICES_ENV in env:
        return listed(env[DEVICES_ENV])
    return visible_gpus(env, len(sysfs_gpu_nodes(sysfs)))


def gpus_needed(cfg: RunConfig) -> int | str:
    """The GPUs a config's run takes on this host: ``nproc_per_node`` (one per local rank);
    ``ALL`` for a CPU run (``use_cpu: true``), which runs alone, as every run does on a CPU host."""
    if resolve_device(cfg.use_cpu, cfg.quantization_bit, gpus_visible=1) == CPU:
        return ALL
    return max(1, int(cfg.nproc_per_node or 1))


def taken_gpus(cfg: RunConfig, env: Mapping[str, str] | None = None, sysfs: str = "/sys") -> list[str] | None:
    """The GPUs a run started outside the queue (``cockpit train``, ``cockpit resume``) takes on this
    host, as the queue names them: its ranks use the first ``nproc_per_node`` GPUs its environment
    shows (``env``: this process's, with the config's ``env`` on top), so those of a hand-pinned
    ``HIP_VISIBLE_DEVICES=3`` / ``CUDA_VISIBLE_DEVICES=3``, else of the host (:func:`host_gpus`).
    None where the queue cannot name them, and the run then holds every GPU (:func:`held_gpus`): a
    CPU run, ``ROCR_VISIBLE_DEVICES`` (HIP's indices then count within its list), HIP and CUDA lists
    that differ, UUIDs, or fewer GPUs shown than the run needs."""
    env = os.environ if env is None else env
    need = gpus_needed(cfg)
    if need == ALL or "ROCR_VISIBLE_DEVICES" in env:
        return None
    pinned = {tuple(listed(env[name])) for name in INDEX_VARS if name in env}
    if len(pinned) > 1:
        return None
    shown = list(pinned.pop()) if pinned else host_gpus(env, sysfs)
    taken = shown[: int(need)]
    if len(taken) < int(need) or not all(gpu.isdigit() for gpu in taken):
        return None
    return taken


def assign(inventory: list[str], held: list[list[str]], needs: list[int | str]) -> list[list[str]]:
    """The GPUs of each queued entry that starts now, for the first entries of ``needs`` (queue
    order). ``held``: the GPUs of each active run. Head of line: the first entry that does not fit
    stops the rest (a small run never overtakes a big one, so the order the user set is the order
    runs start, and a big run cannot starve). An entry needing ``ALL`` (or more than the host has,
    or any entry on a host without GPUs) starts only when no run is active, alone."""
    busy = {gpu for gpus in held for gpu in gpus}
    out: list[list[str]] = []
    for need in needs:
        if need == ALL or not inventory or int(need) > len(inventory):
            if not held and not out:
                out.append(list(inventory))
            break
        free = [gpu for gpu in inventory if gpu not in busy]
        if int(need) > len(free):
            break
        out.append(free[: int(need)])
        busy.update(out[-1])
    return out


def held_gpus(runs_dir: Path, inventory: list[str]) -> list[list[str]]:
    """The GPUs of every active run in the runs dir, the queue's and ``cockpit train``'s alike
    (liveness checked): status.json ``gpus``; a run without that record (one whose GPUs
    :func:`taken_gpus` could not name) holds every GPU, as it may use them all. Slurm runs hold the
    scheduler's GPUs, and a run another host supervises (a shared runs dir) holds that host's."""
    from cockpit.run.liveness import on_this_host, reconcile

    held = []
    for run in list_runs(runs_dir):
        status = run.read_status()
        if status.get("state") in TERMINAL_STATES or status.get("slurm") or not on_this_host(status):
            continue
        status = reconcile(run, status=status)
        if status.get("state") not in TERMINAL_STATES:
            gpus = status.get("gpus")
            held.append([str(g) for g in gpus] if isinstance(gpus, list) else list(inventory))
    return held


def entry_config(entry: dict[str, Any]) -> RunConfig:
    """The entry's config, read and validated again in its cwd; raises InputError / OSError."""
    from cockpit.config import load_config
    from cockpit.errors import InputError

    os.chdir(entry["cwd"])
    cfg = load_config(entry["config"], entry["overrides"])
    if why := queue_refusal(cfg):
        raise InputError(why)
    return cfg


def entry_need(entry: dict[str, Any]) -> int | str:
    """The entry's GPUs (worked out once, kept in the entry); a config that no longer loads: ALL
    (its launch refuses it)."""
    from cockpit.errors import InputError

    if entry.get("gpus_needed") is None:
        try:
            entry["gpus_needed"] = gpus_needed(entry_config(entry))
        except (InputError, OSError):
            entry["gpus_needed"] = ALL
    return entry["gpus_needed"]


def next_entries(runs_dir: Path, inventory: list[str]) -> list[dict[str, Any]] | None:
    """Settle the queue; the entries to start now (marked launching, each with its ``gpus``), ``[]``
    to wait, None when nothing is left."""
    with changing(runs_dir) as data:
        active = settle(runs_dir, data)
        queued = [e for e in data["entries"] if e["state"] == "queued"]
        if not data["entries"]:
            return None
        if not queued:  # only runs in flight: nothing to fit, no run dirs to read
            return []
        # every active run of the runs dir holds its GPUs (a `cockpit train` or F8 run too); on a host
        # without GPUs each entry needs the whole host, so any active run holds it
        held = held_gpus(runs_dir, inventory)
        if active and not held:  # the queue's own runs, even before their status.json says so
            held = [[] for _ in active]
        needs: list[int | str] = [entry_need(e) if inventory else ALL for e in queued]
        given = assign(inventory, held, needs)
        starting = queued[: len(given)]
        for entry, gpus in zip(starting, given):
            entry.update(state="launching", gpus=gpus or None)
        return [dict(e) for e in starting]


def launch(runs_dir: Path, entry: dict[str, Any]) -> tuple[str | None, str | None]:
    """Start the entry's run on its GPUs: (run_id, None), or (None, why it was refused). The config is
    read and validated again (``cockpit queue add`` ran the whole check); what fails later fails the run."""
    from cockpit.errors import InputError
    from cockpit.run.launch import start_run

    try:
        cfg = entry_config(entry)
    except (InputError, OSError) as err:
        return None, f"invalid input: {err}"
    try:
        run = start_run(
            cfg,
            config_path=entry["config"],
            runs_dir=runs_dir,
            status_extra={"queue_entry": entry["id"]},
            gpus=entry.get("gpus"),
        )
    except Exception as err:  # noqa: BLE001 (a launch that cannot start must not stop the queue)
        return None, f"could not start: {err}"
    return run.run_id, None


def record_launch(runs_dir: Path, entry_id: str, run_id: str | None, refused: str | None) -> None:
    with changing(runs_dir) as data:
        entry = next((e for e in data["entries"] if e["id"] == entry_id), None)
        if entry is None:
            return
        if run_id:
            entry.update(state="started", run_id=run_id, started=round(time.time(), 3))
        else:
            finish(data, entry, "refused", refused)


def step(runs_dir: Path, inventory: list[str]) -> bool:
    """One turn of the runner: False when the queue is empty."""
    entries = next_entries(runs_dir, inventory)
    if entries is None:
        return False
    for entry in entries:
        run_id, refused = launch(runs_dir, entry)
        on = f" on GPU {','.join(entry['gpus'])}" if entry.get("gpus") else ""
        print(
            f"{time.strftime('%H:%M:%S')} entry {entry['id']}: " + (f"run {run_id}{on}" if run_id else str(refused)),
            flush=True,
        )
        record_launch(runs_dir, entry["id"], run_id, refused)
    return True


def run_queue(runs_dir: Path) -> int:
    """The runner's life: start entries one after another while it holds .runner.lock. An entry
    added while it was letting go (its add saw a live runner) is taken on again."""
    while own_queue(runs_dir):
        if not read_queue(runs_dir)["entries"] or runner_alive(runs_dir):
            break
    return 0


def own_queue(runs_dir: Path) -> bool:
    """Hold .runner.lock and run the queue until it is empty; False when another runner owns it."""
    from cockpit.run.liveness import identity

    with _flock(queue_dir(runs_dir) / ".runner.lock", blocking=False) as got:
        if not got:
            return False
        atomic_write_json(queue_dir(runs_dir) / "runner.json", {"pid": os.getpid(), "start": identity(os.getpid())[1]})
        inventory = host_gpus()
        print(f"{time.strftime('%H:%M:%S')} GPUs: {','.join(inventory) or 'none (one run at a time)'}", flush=True)
        while step(runs_dir, inventory):
            time.sleep(POLL_S)
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m cockpit.run.queue RUNS_DIR", file=sys.stderr)
        return 2
    return run_queue(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
