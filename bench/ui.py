"""Benchmarks of the TUI on this machine, end to end through a pseudo-terminal
(``cockpit`` as a user starts it: TERM=xterm-256color, 100x30).

    python bench/ui.py [--quick | --smoke] [--first-frame | --gpus N [N ...]]

1. start -> first frame, as a user meets it: ``cockpit`` (the console script) and
   ``python -m cockpit`` typed into a tmux pane, to the first frame of the Setup screen (an empty
   runs dir; also until its form is filled and validated) and of the Runs screen (the recorded
   runs), against a bare Textual app (a header, a line, the footer), alternately over >= 5 rounds:
   medians and the ratio to the bare app (target <= 1.2x); needs tmux
2. CPU of the UI process while it follows a live run (a synthetic run writing a step every
   0.5 s, telemetry every 1 s, a log line per step) at the default refresh (target < 5 %)
3. delay from a step event being appended to the log to its step number on the screen
   (target < 0.5 s)
4. attach to a synthetic 1,000,000-step event log: time until the header shows the last step
   and keys work (target < 2 s), until the whole history is folded in, and the UI's peak
   memory (target < 200 MB)

5. ``--gpus 16 512``: instead, the Live screen of a multi-node run at 160x48 (8 GPUs a node; node 0's
   telemetry and the node collector's heartbeats / grid written every second): first frame of the
   devices pane after Enter, follow CPU and step-to-screen delay as in 2 and 3 (``bench_nodes``)

Prints a JSON summary at the end. No torch: the synthetic runs are written by this script.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from cockpit.store.events import EventWriter  # noqa: E402
from cockpit.store.rundir import create_run_dir  # noqa: E402

ANSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]|\x1b[=>NOPM78]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)")


class Term:
    """The UI in a pseudo-terminal; ``screen`` accumulates the text it draws (escapes removed)."""

    def __init__(self, runs_dir: Path, cols: int = 100, rows: int = 30, argv: list[str] | None = None):
        import fcntl
        import struct
        import termios

        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
        env.pop("TEXTUAL", None)
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(argv or [sys.executable, "-m", "cockpit.cli", "--runs-dir", str(runs_dir)],
                                     stdin=slave, stdout=slave, stderr=slave, env=env, cwd=str(ROOT),
                                     start_new_session=True, close_fds=True)
        os.close(slave)
        self.ps = psutil.Process(self.proc.pid)
        self.raw = bytearray()
        self.text = bytearray()
        self.lock = threading.Lock()
        self.stop = False
        self.peak_rss = 0
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        while not self.stop:
            r, _, _ = select.select([self.master], [], [], 0.05)
            if r:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    return
                with self.lock:
                    self.raw += data
                    self.text += ANSI.sub(b"", data)
                    if len(self.text) > 4 << 20:
                        del self.text[: 2 << 20]
            try:
                self.peak_rss = max(self.peak_rss, self.ps.memory_info().rss)
            except psutil.Error:
                pass

    def mark(self) -> int:
        with self.lock:
            return len(self.text)

    def wait_text(self, needle: str, timeout: float, since: int = 0) -> float | None:
        """Seconds (perf_counter) when ``needle`` showed up after offset ``since``; None on timeout."""
        deadline = time.perf_counter() + timeout
        b = needle.encode()
        while time.perf_counter() < deadline:
            with self.lock:
                if b in self.text[since:]:
                    return time.perf_counter()
            time.sleep(0.005)
        return None

    def key(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> None:
        try:
            self.key(b"\x11")  # ctrl+q
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=5)
        self.stop = True
        os.close(self.master)


def synthetic_run(runs_dir: Path, name: str, steps: int = 0, total: int = 2_000_000) -> "object":
    """A run dir with status 'running' and ``steps`` step events already in the log."""
    run = create_run_dir(runs_dir, name)
    now = time.time()
    run.update_status(state="running", run_id=run.run_id, started=now - 60, step=steps, total_steps=total)
    head = [
        {"v": 1, "t": now - 60, "kind": "run_started", "run_id": run.run_id, "attempt": 1, "model": "synthetic",
         "dataset": "synthetic", "method": "lora", "world_size": 1, "nproc_per_node": 1, "nnodes": 1},
        {"v": 1, "t": now - 60, "kind": "state", "state": "running", "reason": None},
        {"v": 1, "t": now - 59, "kind": "train_begin", "total_steps": total, "epochs": 1, "world_size": 1,
         "global_batch": 8, "start_step": 0},
    ]
    with open(run.events_path, "w") as fh:
        for ev in head:
            fh.write(json.dumps(ev) + "\n")
        t = now - 59
        lines = []
        for i in range(1, steps + 1):
            lines.append('{"v":1,"t":%.3f,"kind":"step","step":%d,"total_steps":%d,"epoch":%.4f,"loss":%.5f,'
                         '"lr":%.3e,"grad_norm":%.4f,"tokens_per_s":%.1f,"samples_per_s":10.0,"tokens_seen":%d,'
                         '"mem":{"0":{"allocated_mb":null,"reserved_mb":null,"peak_mb":null,"rss_mb":512.0}}}\n'
                         % (t + i * 5e-5, i, total, i / total, 2.0 / (1 + i * 1e-5), 1e-4, 1.0, 5000.0, i * 512))
            if len(lines) >= 50_000:
                fh.writelines(lines)
                lines.clear()
        fh.writelines(lines)
    return run


class LiveWriter(threading.Thread):
    """Appends a step every ``period`` s, telemetry every second, a log line per step."""

    def __init__(self, run, start_step: int, period: float = 0.5):
        super().__init__(daemon=True)
        self.rundir, self.step, self.period = run, start_step, period
        self.halt = threading.Event()
        self.written: dict[int, float] = {}

    def run_step(self, w: EventWriter, log) -> None:
        self.step += 1
        w.emit("step", step=self.step, total_steps=2_000_000, epoch=0.5, loss=1.0 + 1 / self.step, lr=1e-4,
               grad_norm=1.0, tokens_per_s=5000.0, samples_per_s=10.0, tokens_seen=self.step * 512,
               mem={"0": {"rss_mb": 512.0}})
        self.written[self.step] = time.perf_counter()
        log.write(f"{{'loss': {1 + 1 / self.step:.4f}, 'step': {self.step}}}\n")
        log.flush()

    def run(self) -> None:
        last_tel = 0.0
        with EventWriter(self.rundir.events_path) as w, open(self.rundir.rank_log(0), "a") as log:
            while not self.halt.is_set():
                self.run_step(w, log)
                if time.time() - last_tel >= 1.0:
                    last_tel = time.time()
                    self.telemetry(w)
                self.halt.wait(self.period)

    def telemetry(self, w: EventWriter) -> None:
        w.emit("telemetry", backend="cpu", devices=[],
               ranks=[{"rank": 0, "pid": os.getpid(), "alive": True, "rss_mb": 512.0, "cpu_pct": 99.0}],
               unavailable={"amdsmi": "not installed", "nvml": "no NVIDIA driver"})


# The floor: the smallest Textual app (a header, a line of text, the footer). Importing textual.app
# alone is most of its start-up; the ratio cockpit/bare is what cockpit adds on top of Textual itself.
FIRST_TEXT = "runs active"  # the bearings line (cockpit/ui/widgets.py), on every screen's first frame
BARE_TEXT = "bare Textual app"
BARE_TEXTUAL = f"""
from textual.app import App
from textual.widgets import Footer, Header, Static
class Bare(App):
    def compose(self):
        yield Header()
        yield Static("{BARE_TEXT}")
        yield Footer()
Bare().run()
"""
SETUP_READY = "config valid"  # Setup's problems line once the form is filled and validated (after the first frame)


class TmuxPane:
    """A shell in a 100x30 tmux pane (its own tmux server), as a user types commands into it: a
    command's first frame is when ``needle`` arrives in what the pane's program writes (tmux's
    pipe-pane, escapes removed). The pane's Python writes bytecode caches (to a folder of its own,
    PYTHONPYCACHEPREFIX: a user's install has them), and runs this checkout (PYTHONPATH)."""

    def __init__(self, workdir: Path, cols: int = 100, rows: int = 30):
        self.out = workdir / "pane.out"
        self.out.touch()
        self.socket = f"cockpit-bench-{os.getpid()}"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "TMUX", "TEXTUAL")}
        env.update(PYTHONPYCACHEPREFIX=str(workdir / "pycache"), PYTHONPATH=str(ROOT),
                   PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
        self.env = env
        self._tmux("-f", "/dev/null", "new-session", "-d", "-x", str(cols), "-y", str(rows), "-s", "bench",
                   "bash --norc --noprofile")
        self._tmux("pipe-pane", "-o", "-t", "bench", f"cat >> {self.out}")
        self.shell = psutil.Process(int(self._tmux("display-message", "-p", "-t", "bench", "#{pane_pid}")))

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], env=self.env, check=True,
                              capture_output=True, text=True).stdout.strip()

    def _text(self, since: int) -> bytes:
        with open(self.out, "rb") as fh:
            fh.seek(since)
            return ANSI.sub(b"", fh.read())

    def first_frame(self, command: str, needle: str, then: str | None = None, timeout: float = 30) -> dict:
        """Type ``command`` + Enter; seconds until ``needle`` is drawn (and until ``then``, if given),
        the program's CPU seconds by then; Ctrl+Q, and the shell's prompt back."""
        since = self.out.stat().st_size
        t0 = time.perf_counter()
        self._tmux("send-keys", "-t", "bench", f"{command}; echo __DO''NE__", "Enter")
        result: dict = {"wall_s": None, "cpu_s": None, "then_s": None}
        deadline = t0 + timeout
        while time.perf_counter() < deadline:
            text = self._text(since)
            if result["wall_s"] is None and needle.encode() in text:
                result["wall_s"] = time.perf_counter() - t0
                result["cpu_s"] = self._child_cpu()
            if result["wall_s"] is not None and (then is None or then.encode() in text):
                if then is not None:
                    result["then_s"] = time.perf_counter() - t0
                break
            time.sleep(0.003)
        self._tmux("send-keys", "-t", "bench", "C-q")
        while time.perf_counter() < deadline + 60 and b"__DONE__" not in self._text(since):
            time.sleep(0.05)
        return result

    def _child_cpu(self) -> float | None:
        for child in self.shell.children():
            try:
                ct = child.cpu_times()
                return ct.user + ct.system
            except psutil.Error:
                pass
        return None

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env, capture_output=True)


def bench_first_frame(workdir: Path, rounds: int, warm_up: bool = True) -> dict:
    """From a command typed into a tmux pane to its first frame, ``rounds`` times each, round by
    round in turn (a neighbour's load falls on all of them alike): ``cockpit`` (the console script)
    and ``python -m cockpit`` on an empty runs dir (the Setup screen; also when its form is filled
    and validated), ``cockpit`` on the recorded runs (the Runs screen), and the bare Textual app.
    Medians; ratios to the bare app's median. ``warm_up``: a first round, not counted (--smoke's
    figures mean nothing: without it, its first start writes the bytecode caches)."""
    empty = workdir / "runs"
    empty.mkdir(parents=True)
    bare = workdir / "bare.py"
    bare.write_text(BARE_TEXTUAL)
    fixture_runs = ROOT / "tests" / "fixtures" / "ui_run"
    cases = {
        "cockpit": (f"cockpit --runs-dir {empty}", FIRST_TEXT, SETUP_READY),
        "python -m cockpit": (f"python -m cockpit --runs-dir {empty}", FIRST_TEXT, None),
        "cockpit, runs": (f"cockpit --runs-dir {fixture_runs}", FIRST_TEXT, None),
        "bare Textual": (f"python {bare}", BARE_TEXT, None),
    }
    pane = TmuxPane(workdir)
    runs: dict[str, list[dict]] = {name: [] for name in cases}
    load = [os.getloadavg()[0]]
    try:
        for command, needle, then in cases.values() if warm_up else ():  # not counted: bytecode caches written
            pane.first_frame(command, needle, then)
        for _ in range(rounds):
            for name, (command, needle, then) in cases.items():
                runs[name].append(pane.first_frame(command, needle, then))
            load.append(os.getloadavg()[0])
    finally:
        pane.close()

    def med(xs: list) -> float | None:
        xs = sorted(x for x in xs if x is not None)
        return round(xs[len(xs) // 2], 3) if xs else None

    out: dict = {}
    for name, rs in runs.items():
        out[name] = {"wall_s": [None if r["wall_s"] is None else round(r["wall_s"], 3) for r in rs],
                     "median_s": med([r["wall_s"] for r in rs]), "cpu_s_median": med([r["cpu_s"] for r in rs])}
        if cases[name][2]:
            out[name]["setup_ready_s_median"] = med([r["then_s"] for r in rs])
    bare_wall, bare_cpu = out["bare Textual"]["median_s"], out["bare Textual"]["cpu_s_median"]
    for name in cases:
        if name != "bare Textual" and bare_wall and out[name]["median_s"]:
            out[name]["ratio_to_bare"] = round(out[name]["median_s"] / bare_wall, 2)
            if bare_cpu and out[name]["cpu_s_median"]:
                out[name]["cpu_ratio_to_bare"] = round(out[name]["cpu_s_median"] / bare_cpu, 2)
    out["target_ratio"] = 1.2
    out["load_avg_1m"] = {"min": min(load), "max": max(load)}
    return out


def bench_follow(runs_dir: Path, seconds: float) -> dict:
    run = synthetic_run(runs_dir, "live", steps=100)
    term = Term(runs_dir)
    assert term.wait_text(FIRST_TEXT, 20)
    writer = LiveWriter(run, 100)
    writer.start()
    time.sleep(1.0)
    term.key(b"\r")  # Enter: the Live screen of the (only, active) run
    assert term.wait_text("Save ckpt", 10), "live screen did not open"
    time.sleep(2.0)
    # latency: for each new step, when its "step N/" shows up on the terminal
    lat = []
    cpu0, t0 = term.ps.cpu_times(), time.perf_counter()
    deadline = t0 + seconds
    seen = writer.step
    while time.perf_counter() < deadline:
        if writer.step > seen:
            seen = writer.step
            since = max(0, term.mark() - 200)
            shown = term.wait_text(f"step {seen}/", 2.0, since=since)
            if shown is not None:
                lat.append(shown - writer.written[seen])
        time.sleep(0.01)
    cpu1, t1 = term.ps.cpu_times(), time.perf_counter()
    writer.halt.set()
    cpu_pct = 100 * ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / (t1 - t0)
    term.close()
    lat.sort()
    return {"cpu_pct_of_one_core": round(cpu_pct, 2), "steps_seen": len(lat),
            "latency_s_median": round(lat[len(lat) // 2], 3) if lat else None,
            "latency_s_max": round(lat[-1], 3) if lat else None}


def bench_million(runs_dir: Path, steps: int) -> dict:
    t = time.perf_counter()
    run = synthetic_run(runs_dir, "million", steps=steps)
    gen_s = time.perf_counter() - t
    size_mb = run.events_path.stat().st_size / 2**20
    term = Term(runs_dir)
    assert term.wait_text(FIRST_TEXT, 20)
    time.sleep(0.5)
    base_rss = term.ps.memory_info().rss
    term.peak_rss = base_rss
    mark = term.mark()
    t0 = time.perf_counter()
    term.key(b"\r")
    t_header = term.wait_text(f"step {steps}/", 30, since=mark)
    # keys work while the history loads: open the log viewer, then close it
    mark2 = term.mark()
    t_key0 = time.perf_counter()
    term.key(b"l")
    t_key = term.wait_text("Logs ", 30, since=mark2)
    term.key(b"\x1b")
    # the history is in when a header without the "loading history" note is drawn after the
    # last one with it (the header is redrawn every second), or with none before it (a short log,
    # replayed before the Live screen's first header: the Live screen shows the note from its start)
    t_full = None
    deadline = time.perf_counter() + 600
    while time.perf_counter() < deadline:
        with term.lock:
            text = bytes(term.text[mark:])
        loading, eta = text.rfind(b"loading history"), text.rfind(b" ETA ")
        if eta > loading:
            t_full = time.perf_counter()
            break
        time.sleep(0.1)
    peak = term.peak_rss
    term.close()
    return {"events_mb": round(size_mb, 1), "generate_s": round(gen_s, 1),
            "header_shows_last_step_s": round(t_header - t0, 3) if t_header else None,
            "key_response_s": round(t_key - t_key0, 3) if t_key else None,
            "full_history_s": round(t_full - t0, 2) if t_full else None,
            "ui_rss_mb_peak": round(peak / 2**20, 1), "ui_rss_mb_before_attach": round(base_rss / 2**20, 1)}


# -- many GPUs (--gpus N): a multi-node run's Live screen, the devices pane as its node x GPU map ------------
class NodesWriter(LiveWriter):
    """A step every ``period`` s; every second node 0's own ``telemetry`` (8 fake MI300X) and what global
    rank 0's collector writes for all the nodes (``cockpit/telemetry/node.py`` over fake GPUs)."""

    def __init__(self, run, start_step: int, gpus: int, period: float = 0.5):
        super().__init__(run, start_step, period)
        from cockpit.telemetry import AmdSmiBackend
        from cockpit.telemetry.fakes import FakeAmdSmi, FakeGpu
        from cockpit.telemetry.node import NodeCollector, NodeReporter

        from ui_screenshots import DictStore  # scripts/: the rendezvous store's three calls, in a dict

        self.nnodes = max(1, gpus // 8)
        store = DictStore()
        self.backends = [AmdSmiBackend(FakeAmdSmi([FakeGpu(vram_used_mb=int(196592 * (0.5 + 0.05 * ((n + i) % 9))),
                                                           gfx_activity=60 + (3 * n + i) % 40) for i in range(8)]))
                         for n in range(self.nnodes)]
        self.reporters = [NodeReporter(store, n, f"node-{n:03d}", None if n == 0 else self.backends[n])
                          for n in range(self.nnodes)]
        self.collector = NodeCollector(store, self.nnodes)

    def telemetry(self, w: EventWriter) -> None:
        w.emit("telemetry", backend="amdsmi", devices=self.backends[0].devices(), ranks=[], unavailable={},
               node_rank=0, host="node-000")
        for r in self.reporters:
            r.step = self.step
            r.publish()
        for kind, fields in self.collector.collect():
            w.emit(kind, **fields)


def bench_nodes(runs_dir: Path, gpus: int, seconds: float) -> dict:
    """The Live screen of a ``gpus``-GPU run (8 a node): first frame of its devices pane after Enter,
    the UI's CPU while following it, the step-to-screen delay (as :func:`bench_follow`)."""
    run = synthetic_run(runs_dir, f"gpus{gpus}", steps=100)
    with open(run.events_path, "r+") as fh:  # the run_started of a multi-node run
        lines = fh.readlines()
        head = json.loads(lines[0])
        head.update(world_size=gpus, nproc_per_node=8, nnodes=max(1, gpus // 8))
        lines[0] = json.dumps(head) + "\n"
        fh.seek(0)
        fh.writelines(lines)
    writer = NodesWriter(run, 100, gpus)
    writer.start()
    time.sleep(2.5)  # two collector ticks: the map is in the log before the screen opens
    term = Term(runs_dir, cols=160, rows=48)
    assert term.wait_text(FIRST_TEXT, 20)
    time.sleep(1.0)
    mark, t0 = term.mark(), time.perf_counter()
    term.key(b"\r")
    shown = term.wait_text(f"{writer.nnodes} nodes, {writer.nnodes * 8} GPUs" if gpus > 8 else "Devices", 20, since=mark)
    first_frame = (shown - t0) if shown else None
    time.sleep(2.0)
    lat = []
    cpu0, t1, size1 = term.ps.cpu_times(), time.perf_counter(), run.events_path.stat().st_size
    seen = writer.step
    while time.perf_counter() < t1 + seconds:
        if writer.step > seen:
            seen = writer.step
            at = term.wait_text(f"step {seen}/", 2.0, since=max(0, term.mark() - 200))
            if at is not None:
                lat.append(at - writer.written[seen])
        time.sleep(0.01)
    cpu1, t2 = term.ps.cpu_times(), time.perf_counter()
    writer.halt.set()
    term.close()
    lat.sort()
    return {"gpus": gpus, "nodes": writer.nnodes, "live_first_frame_s": round(first_frame, 3) if first_frame else None,
            "cpu_pct_of_one_core": round(100 * ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / (t2 - t1), 2),
            "steps_seen": len(lat), "latency_s_median": round(lat[len(lat) // 2], 3) if lat else None,
            "latency_s_max": round(lat[-1], 3) if lat else None,
            "events_kb_per_s": round((run.events_path.stat().st_size - size1) / 1024 / (t2 - t1), 1),  # steps included
            "targets": {"cpu_pct": 5, "latency_s": 0.5}, "load_avg_1m": os.getloadavg()[0]}


def main_gpus(gpu_counts: list[int], seconds: float) -> int:
    results = []
    with tempfile.TemporaryDirectory(prefix="cockpit-bench-ui-gpus-") as tmp:
        for gpus in gpu_counts:
            results.append(bench_nodes(Path(tmp) / f"g{gpus}", gpus, seconds))
            print("gpus:", results[-1], flush=True)
    print(json.dumps({"nodes": results, "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()}}, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer tries, 100k steps instead of 1M")
    ap.add_argument("--gpus", type=int, nargs="+", metavar="N",
                    help="only the many-GPU Live screen bench (bench_nodes), e.g. --gpus 16 512 (8 GPUs a node, 160x48)")
    ap.add_argument("--first-frame", action="store_true", help="only the first-frame part")
    ap.add_argument("--smoke", action="store_true",
                    help="that every part runs (the suite): one round and no warm-up round, 3 s of following, a 2,000-step "
                         "attach; no figures")
    args = ap.parse_args()
    # (rounds, seconds of following, attach steps): full, --quick, --smoke
    rounds, seconds, steps = (1, 3, 2_000) if args.smoke else (5, 10, 100_000) if args.quick else (7, 30, 1_000_000)
    if args.gpus:
        return main_gpus(args.gpus, seconds)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="cockpit-bench-ui-") as tmp:
        results["first_frame"] = bench_first_frame(Path(tmp) / "first-frame", rounds, warm_up=not args.smoke)
        print("first frame:", json.dumps(results["first_frame"]), flush=True)
        if args.first_frame:
            print(json.dumps(results, indent=1))
            return 0
        results["follow"] = bench_follow(Path(tmp) / "follow", seconds) | {
            "targets": {"cpu_pct": 5, "latency_s": 0.5}, "load_avg_1m": os.getloadavg()[0]}
        print("follow:", results["follow"], flush=True)
        results["attach"] = bench_million(Path(tmp) / "million", steps) | {"targets": {"usable_s": 2, "rss_mb": 200}}
        print("attach:", results["attach"], flush=True)
    results["machine"] = {"cpus": os.cpu_count(), "load_avg": os.getloadavg()}
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
