"""Benchmarks of the TUI on this machine, end to end through a pseudo-terminal
(``cockpit`` as a user starts it: TERM=xterm-256color, 100x30).

    python bench/ui.py [--quick]

1. start -> first frame: from spawning ``cockpit --runs-dir DIR`` to the first screen's text
   arriving on the terminal (target < 0.6 s)
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


# The floor: the smallest Textual app showing the same kind of screen (a title, a DataTable, the
# footer). Importing textual.app alone takes 0.4-0.55 s on this machine; the ratio cockpit/bare is
# what cockpit adds on top of Textual itself.
FIRST_TEXT = "runs active"  # the Runs screen's bearings line (cockpit/ui/widgets.py), drawn in the first frame
BARE_TEXTUAL = """
from textual.app import App
from textual.widgets import DataTable, Footer, Static
class Bare(App):
    def compose(self):
        yield Static("runs active (bare Textual)")
        yield DataTable()
        yield Footer()
Bare().run()
"""


def bench_first_frame(runs_dir: Path, tries: int, bare: bool = False) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds of the UI process) from spawn to the first frame. The CPU
    figure is what an idle machine's wall time would be close to; on a loaded one wall >> CPU.
    ``bare``: the same for :data:`BARE_TEXTUAL` (the reference, run alternately by ``main``)."""
    wall, cpu = [], []
    for _ in range(tries):
        term = Term(runs_dir, argv=[sys.executable, "-c", BARE_TEXTUAL] if bare else None)
        t = term.wait_text(FIRST_TEXT, 20)
        ct = term.ps.cpu_times()
        wall.append((t - term.t0) if t else float("nan"))
        cpu.append(ct.user + ct.system)
        term.close()
    return wall, cpu


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
    # last one with it (the header is redrawn every second)
    t_full = None
    deadline = time.perf_counter() + 600
    while time.perf_counter() < deadline:
        with term.lock:
            text = bytes(term.text[mark:])
        loading, eta = text.rfind(b"loading history"), text.rfind(b" ETA ")
        if loading >= 0 and eta > loading:
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
    args = ap.parse_args()
    if args.gpus:
        return main_gpus(args.gpus, 10 if args.quick else 30)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="cockpit-bench-ui-") as tmp:
        fixture_runs = ROOT / "tests" / "fixtures" / "ui_run"
        ff, ffc, bf = [], [], []
        for _ in range(2 if args.quick else 7):  # alternately: cockpit, then the bare Textual app
            w, c = bench_first_frame(fixture_runs, 1)
            ff += w
            ffc += c
            bf += bench_first_frame(fixture_runs, 1, bare=True)[0]
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        results["first_frame_s"] = {"runs": [round(x, 3) for x in ff], "median": round(med(ff), 3),
                                    "cpu_s_median": round(med(ffc), 3), "target": 0.6,
                                    "bare_textual_median": round(med(bf), 3),
                                    "ratio_to_bare_textual": round(med(ff) / med(bf), 2),
                                    "load_avg_1m": os.getloadavg()[0]}
        print("first frame:", results["first_frame_s"], flush=True)
        results["follow"] = bench_follow(Path(tmp) / "follow", 10 if args.quick else 30) | {
            "targets": {"cpu_pct": 5, "latency_s": 0.5}, "load_avg_1m": os.getloadavg()[0]}
        print("follow:", results["follow"], flush=True)
        results["attach"] = bench_million(Path(tmp) / "million", 100_000 if args.quick else 1_000_000) | {"targets": {"usable_s": 2, "rss_mb": 200}}
        print("attach:", results["attach"], flush=True)
    results["machine"] = {"cpus": os.cpu_count(), "load_avg": os.getloadavg()}
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
