"""``cockpit metrics``: a run dir written through the real event writer, served by the real command
(a subprocess) and scraped over HTTP, the answer parsed by prometheus_client's own text parser."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cockpit.store.events import EventWriter
from cockpit.store.rundir import create_run_dir

ROOT = Path(__file__).resolve().parent.parent


def write_run(runs: Path, name: str = "metrics-demo"):
    """A run as the supervisor and rank 0 write it: started, two logged steps, an eval, the
    supervisor's telemetry of two GPUs (one without a power reading) and a rank."""
    run = create_run_dir(runs, name)
    run.update_status(state="running", run_id=run.run_id, step=20, total_steps=100)
    with EventWriter(run.events_path) as w:
        w.emit("run_started", run_id=run.run_id, attempt=1, model="m", dataset="d", method="lora", world_size=2,
               nproc_per_node=2, nnodes=1)
        w.emit("step", step=10, total_steps=100, epoch=0.1, loss=2.5, lr=2e-4, grad_norm=1.5, tokens_per_s=None,
               warmup=True, samples_per_s=3.0, tokens_seen=5120)
        w.emit("step", step=20, total_steps=100, epoch=0.2, loss=1.75, lr=1e-4, grad_norm=0.5, tokens_per_s=812.5,
               warmup=False, samples_per_s=3.0, tokens_seen=10240)
        w.emit("eval", step=20, eval_loss=1.9)
        w.emit("telemetry", backend="amdsmi", node_rank=0, host="node0",
               devices=[{"index": 0, "name": "MI300X", "vram_used_mb": 1024.0, "vram_total_mb": 196592.0,
                         "util_pct": 87.0, "temp_c": 61.0, "power_w": 540.0},
                        {"index": 1, "name": "MI300X", "vram_used_mb": 2048.0, "vram_total_mb": 196592.0,
                         "util_pct": 50.0, "temp_c": None, "power_w": None}],
               ranks=[{"rank": 0, "pid": 1, "alive": True, "rss_mb": 512.0, "cpu_pct": 99.0}])
    return run


class Exporter:
    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "cockpit.cli", "metrics", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT))
        line = self.proc.stdout.readline()
        assert "/metrics" in line, (line, self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.url = line.split()[2]

    def scrape(self) -> dict[str, list]:
        with urllib.request.urlopen(self.url, timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = resp.read().decode()
        return {f.name: f.samples for f in text_string_to_metric_families(text)}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def value(families: dict, metric: str, /, **labels: str) -> float:
    hits = [s.value for s in families[metric] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (metric, labels, families.get(metric))
    return hits[0]


def test_a_run_scraped_over_http(tmp_path):
    runs = tmp_path / "runs"
    run = write_run(runs)
    exporter = Exporter(run.run_id, "--runs-dir", str(runs))
    try:
        assert exporter.url.startswith("http://127.0.0.1:")
        got = exporter.scrape()
        rid = run.run_id
        assert value(got, "cockpit_train_loss", run=rid) == 1.75  # the last step's, not the first's
        assert value(got, "cockpit_learning_rate", run=rid) == 1e-4
        assert value(got, "cockpit_grad_norm", run=rid) == 0.5
        assert value(got, "cockpit_tokens_per_second", run=rid) == 812.5
        assert value(got, "cockpit_train_step", run=rid) == 20
        assert value(got, "cockpit_train_total_steps", run=rid) == 100
        assert value(got, "cockpit_eval_loss", run=rid) == 1.9
        assert value(got, "cockpit_run_state", run=rid, state="running") == 1
        gpu0 = {"run": rid, "node": "0", "host": "node0", "gpu": "0", "name": "MI300X", "backend": "amdsmi"}
        assert value(got, "cockpit_gpu_memory_used_bytes", **gpu0) == 1024 * 2**20
        assert value(got, "cockpit_gpu_memory_used_bytes", run=rid, gpu="1") == 2048 * 2**20
        assert value(got, "cockpit_gpu_memory_total_bytes", run=rid, gpu="1") == 196592 * 2**20
        assert value(got, "cockpit_gpu_utilization_ratio", run=rid, gpu="0") == pytest.approx(0.87)
        assert value(got, "cockpit_gpu_power_watts", run=rid, gpu="0") == 540
        assert [s.labels["gpu"] for s in got["cockpit_gpu_power_watts"]] == ["0"]  # GPU 1 has no reading: no sample
        assert value(got, "cockpit_gpu_temperature_celsius", run=rid, gpu="0") == 61
        assert value(got, "cockpit_rank_resident_memory_bytes", run=rid, rank="0") == 512 * 2**20

        # the run goes on: the next scrape has the new step (the log is read incrementally), and the end
        with EventWriter(run.events_path) as w:
            w.emit("step", step=30, total_steps=100, epoch=0.3, loss=float("nan"), lr=5e-5, grad_norm=None,
                   tokens_per_s=900.0, warmup=False, samples_per_s=3.0, tokens_seen=15360)
        run.update_status(state="finished")
        again = exporter.scrape()
        assert value(again, "cockpit_train_step", run=rid) == 30
        assert value(again, "cockpit_train_loss", run=rid) != value(again, "cockpit_train_loss", run=rid)  # NaN
        assert "cockpit_grad_norm" not in again or not again["cockpit_grad_norm"]  # null: left out, not 0
        assert value(again, "cockpit_run_state", run=rid, state="finished") == 1
    finally:
        exporter.close()


def test_every_run_of_the_runs_dir_when_none_is_named(tmp_path):
    runs = tmp_path / "runs"
    first = write_run(runs, "one")
    exporter = Exporter("--runs-dir", str(runs))
    try:
        assert {s.labels["run"] for s in exporter.scrape()["cockpit_train_loss"]} == {first.run_id}
        second = write_run(runs, "two")  # started after the exporter: there at the next scrape
        assert {s.labels["run"] for s in exporter.scrape()["cockpit_train_loss"]} == {first.run_id, second.run_id}
    finally:
        exporter.close()


def metrics_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cockpit.cli", "metrics", *args], capture_output=True, text=True,
                          timeout=60, cwd=str(ROOT))


def test_a_non_loopback_bind_is_refused_unless_public(tmp_path):
    refused = metrics_cli("--host", "0.0.0.0", "--port", "0", "--runs-dir", str(tmp_path))
    assert refused.returncode == 2 and "refusing to listen on 0.0.0.0" in refused.stderr and "--public" in refused.stderr
    unknown = metrics_cli("nope", "--runs-dir", str(tmp_path))
    assert unknown.returncode == 2 and "no run 'nope'" in unknown.stderr

    public = subprocess.Popen([sys.executable, "-m", "cockpit.cli", "metrics", "--host", "0.0.0.0", "--port", "0",
                               "--public", "--runs-dir", str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT))
    try:
        line = public.stdout.readline()
        assert line.startswith("cockpit metrics: http://0.0.0.0:"), line
        port = line.split("http://0.0.0.0:")[1].split("/")[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert resp.status == 200
    finally:
        public.terminate()
        _out, err = public.communicate(timeout=10)
    assert "WARNING: listening on 0.0.0.0 (--public)" in err


def test_the_exporter_never_imports_torch_or_textual():
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, cockpit.commands.metrics, cockpit.run.metrics_export, prometheus_client; "
         "print(sorted(m for m in ('torch', 'textual', 'transformers') if m in sys.modules))"],
        capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert probe.stdout.strip() == "[]", probe.stderr


def test_other_nodes_gpus_from_the_compact_node_telemetry(tmp_path):
    """A multi-node run's other nodes come as node_telemetry rows (cockpit/store/node_grid.py): each
    node's GPUs are gauges with its node and host, an outlier's full figures over its row's."""
    from cockpit.run.metrics_export import RunsCollector
    from cockpit.store.node_grid import grid_row

    run = write_run(tmp_path / "runs")
    gpus = [{"index": i, "vram_used_mb": 98296.0, "vram_total_mb": 196592.0, "util_pct": 90.0, "temp_c": 60.0,
             "power_w": 600.0} for i in range(8)]
    with EventWriter(run.events_path) as w:
        w.emit("node_telemetry", nodes=[grid_row(1, "node1", "amdsmi", gpus)], period_s=3.0, outliers=[])
        w.emit("node_telemetry", outliers=[{"node_rank": 1, "why": ["hottest"], "index": 3, "vram_used_mb": 98296.0,
                                            "vram_total_mb": 196592.0, "util_pct": 90.0, "temp_c": 95.0, "power_w": 700.0}])
    families = {f.name: f.samples for f in RunsCollector(lambda: [run]).collect()}
    node1 = {s.labels["gpu"]: s.value for s in families["cockpit_gpu_temperature_celsius"] if s.labels["node"] == "1"}
    assert node1 == {str(i): (95.0 if i == 3 else 60.0) for i in range(8)}
    used = [s for s in families["cockpit_gpu_memory_used_bytes"] if s.labels["node"] == "1" and s.labels["gpu"] == "0"]
    assert used[0].labels["host"] == "node1" and used[0].value == 98296 * 2**20  # 50 % of 196592 MiB
    assert {s.labels["node"] for s in families["cockpit_gpu_power_watts"]} == {"0", "1"}
