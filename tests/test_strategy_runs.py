"""Multi-process runs through the real CLI and supervisor on the CPU (gloo): DDP, two loopback
"nodes", DeepSpeed ZeRO-2/3, FSDP2 (sharded for real), stop with every rank's pid checked.

Loss tolerances. 1 rank x micro-batch 4 and 2 ranks x micro-batch 2 see the same 4 samples per
step: accelerate shards the one seeded sampler's batches across ranks (rank r takes every
world_size-th micro-batch), so the global batch per step is identical, and the adapter's random
init is seeded (build_model) so every rank and run starts from the same weights. What differs is
float noise: padding per micro-batch of 2 instead of 4 (masked), the order of the fp32 sums
(all-reduce / reduce-scatter vs one batch), and the logged loss (mean of the ranks' token-mean
losses vs one token mean; the gradients are token-weighted both ways). Measured: <= 2e-6
relative per step (bench/strategies.py); we allow 1e-4 for DDP, FSDP2 and ZeRO-2/3 alike.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, cockpit, has_step, read_events, start_detached, tiny_config, wait_for
from cockpit.store.rundir import RunDir
from cockpit.strategy.launch import free_port

pytestmark = pytest.mark.slow
CACHE_ENV = {"TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions"), "OMP_NUM_THREADS": "1"}


# the shared tiny run (conftest.tiny_config), made deterministic and cheap for loss comparisons
STRATEGY_CONFIG = dict(cutoff_len=64, lr_scheduler_type="constant", max_steps=4, save_strategy="no", probes=None, telemetry_interval_s=0, numa_bind="off", seed=7)


def config(tmp_path: Path, model_dir: Path | str, name: str, **over) -> Path:
    return tiny_config(tmp_path, model_dir, name, **{**STRATEGY_CONFIG, **over})


def train(tmp_path: Path, model_dir: Path | str, name: str, timeout: float = 300, cli_env: dict | None = None, **over) -> Path:
    """A finished run of ``model_dir`` (a folder, or a hub id with ``cli_env`` naming its cache)."""
    runs = tmp_path / f"runs-{name}"
    res = cockpit("train", str(config(tmp_path, model_dir, name, **over)), "--runs-dir", str(runs), env={**CACHE_ENV, **(cli_env or {})}, timeout=timeout)
    run = next(d for d in runs.iterdir() if d.is_dir())
    assert res.returncode == 0, failure_text(res, run)
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    return run


def failure_text(res, run: Path) -> str:
    """Why a run failed, the most telling last (a CI log keeps the end): the CLI's output, every
    log's tail (rank logs last, in rank order), then status.json's reason and log tail."""
    logs = sorted((f for f in os.listdir(run / "logs") if f.endswith(".log")), key=lambda f: (f.startswith("rank"), f))
    parts = [res.stdout[-1500:], res.stderr[-1500:]]
    parts += [f"--- {f}\n" + (run / "logs" / f).read_text(errors="replace")[-1500:] for f in logs]
    st = json.loads((run / "status.json").read_text())
    parts.append(f"--- status: {st.get('state')}: {st.get('reason')}\n" + "\n".join(st.get("log_tail") or []))
    return "\n".join(parts)


def losses(run: Path) -> list[float]:
    return [e["loss"] for e in read_events(run) if e["kind"] == "step"]


def assert_close(a: list[float], b: list[float], rel: float) -> None:
    assert len(a) == len(b) > 0
    for i, (x, y) in enumerate(zip(a, b)):
        assert abs(x - y) <= rel * abs(y), f"step {i + 1}: {x} vs {y} (rel {abs(x - y) / abs(y):.2e} > {rel})"


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, tiny_model_dir) -> Path:
    # telemetry on (every 0.5 s): test_ddp_run_events_have_comm_health_and_per_rank_telemetry reads it
    return train(tmp_path_factory.mktemp("ddp"), tiny_model_dir, "ddp", nproc_per_node=2, telemetry_interval_s=0.5)


def test_ddp_two_ranks_matches_one_rank(tmp_path, tiny_model_dir, ddp_run):
    one = train(tmp_path, tiny_model_dir, "one", per_device_train_batch_size=4)
    started = [e for e in read_events(ddp_run) if e["kind"] == "run_started"][0]
    assert started["world_size"] == 2 and "torch.distributed.run" in started["command"]
    assert sorted(e["rank"] for e in read_events(ddp_run) if e["kind"] == "rank_started") == [0, 1]
    assert_close(losses(ddp_run), losses(one), rel=1e-4)
    launch = json.loads((ddp_run / "launch.json").read_text())
    assert launch["strategy"] == "DDP" and len(launch["ranks"]) == 2


def test_ddp_run_events_have_comm_health_and_per_rank_telemetry(ddp_run):
    """The 2-rank gloo run's own event log: the comm health probe (backend gloo, world size 2,
    bus bandwidth per message size) and CPU telemetry with the RSS of both ranks."""
    events = read_events(ddp_run)
    probes = [e for e in events if e["kind"] == "comm" and "probe" in (e.get("details") or {})]
    assert len(probes) == 1, [e for e in events if e["kind"] == "comm"]
    comm = probes[0]
    assert comm["backend"] == "gloo" and comm["world_size"] == 2 and comm["status"] == "ok"
    probe = comm["details"]["probe"]
    assert probe["ok"] and probe["backend"] == "gloo" and probe["world_size"] == 2
    assert [r["size_bytes"] for r in probe["results"]] == [2**20, 4 * 2**20, 16 * 2**20]
    for r in probe["results"]:
        assert r["ok"] and r["time_us"] > 0 and r["algbw_gbps"] > 0
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"], rel=0.01)  # busbw = algbw * 2(n-1)/n, n = 2
    telemetry = [e for e in events if e["kind"] == "telemetry"]
    assert telemetry and all(e["backend"] == "cpu" for e in telemetry)
    rank_pids = {e["rank"]: e["pid"] for e in events if e["kind"] == "rank_started"}
    both = [
        {r["rank"]: r for r in e["ranks"]}
        for e in telemetry
        if {r["rank"] for r in e.get("ranks") or [] if r.get("alive") and (r.get("rss_mb") or 0) > 0} == {0, 1}
    ]
    assert both, telemetry[-3:]
    for rank in (0, 1):
        entry = both[-1][rank]
        assert entry["pid"] == rank_pids[rank]
        assert 50 < entry["rss_mb"] < 64 * 1024  # MiB: a torch process with the tiny model, not bytes
    assert any(e2["ranks"][0].get("cpu_pct") is not None for e2 in telemetry if e2.get("ranks"))


def test_fsdp_shards_for_real_and_matches_ddp(tmp_path, tiny_model_dir, ddp_run):
    # probes after training: every rank joins generate (sharded parameters are gathered collectively)
    run = train(tmp_path, tiny_model_dir, "fsdp", nproc_per_node=2, fsdp="full_shard auto_wrap", probes="@demo/identity_probes.jsonl", probe_max_new_tokens=2)
    for rank in (0, 1):
        rep = json.loads((run / "logs" / f"fsdp.rank{rank}.json").read_text())
        assert rep["layer_classes"] == ["LlamaDecoderLayer"] and rep["wrapped_modules"] == 2 and rep["mesh"] == [2]
        assert rep["all_dtensor"]
        for p in rep["params"]:  # dim-0 sharding: local = ceil or floor of global / 2
            assert abs(p["local_numel"] - p["global_numel"] / 2) <= p["global_numel"] / max(1, p["global_numel"] ** 0.5), p
        assert abs(rep["local_numel"] - rep["global_numel"] / 2) <= 0.01 * rep["global_numel"]
    assert_close(losses(run), losses(ddp_run), rel=1e-4)
    assert (run / "adapter" / "adapter_model.safetensors").exists()
    assert [e["phase"] for e in read_events(run) if e["kind"] == "probe_results"] == ["before", "after"]


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_trains_on_two_ranks(tmp_path, tiny_model_dir, ddp_run, stage):
    over = {"probes": "@demo/identity_probes.jsonl", "probe_max_new_tokens": 2} if stage == 3 else {}
    run = train(tmp_path, tiny_model_dir, f"z{stage}", nproc_per_node=2, zero_stage=stage, timeout=420, **over)
    eff = json.loads((run / "ds_config.json").read_text())
    assert eff["zero_optimization"]["stage"] == stage and eff["train_batch_size"] == 4
    assert "auto" not in json.dumps(eff) and eff["communication_data_type"] == "fp32"
    assert_close(losses(run), losses(ddp_run), rel=1e-4)
    assert (run / "adapter" / "adapter_config.json").exists()


def test_two_nodes_on_loopback(tmp_path, tiny_model_dir):
    port = free_port()
    # telemetry on, 8 fake MI300X per node: test_node_telemetry_slow.assert_every_node_reported
    paths = [config(tmp_path, tiny_model_dir, f"node{k}", nnodes=2, node_rank=k, master_port=port, telemetry_interval_s=0.5) for k in (0, 1)]
    runs = [tmp_path / f"runs{k}" for k in (0, 1)]
    for k in (0, 1):
        res = cockpit("train", str(paths[k]), "--runs-dir", str(runs[k]), "--detach", "--json", env={**CACHE_ENV, "COCKPIT_FAKE_GPUS": "amdsmi:8"})
        assert res.returncode == 0, res.stderr
    dirs = [next(d for d in r.iterdir() if d.is_dir()) for r in runs]
    deadline = time.time() + 240
    while time.time() < deadline and not all(json.loads((d / "status.json").read_text())["state"] in ("finished", "failed", "stopped") for d in dirs):
        time.sleep(1)
    states = [json.loads((d / "status.json").read_text()) for d in dirs]
    assert [s["state"] for s in states] == ["finished", "finished"], states
    ev0, ev1 = read_events(dirs[0]), read_events(dirs[1])
    assert [e["rank"] for e in ev0 if e["kind"] == "rank_started"] + [e["rank"] for e in ev1 if e["kind"] == "rank_started"] in ([0, 1], [1, 0])
    assert [e["step"] for e in ev0 + ev1 if e["kind"] == "step"] == [1, 2, 3, 4]
    assert any(e["kind"] == "run_finished" and e.get("node_rank") == 1 for e in ev0 + ev1)
    launch = [json.loads((d / "launch.json").read_text()) for d in dirs]
    assert launch[0]["command"][launch[0]["command"].index("--node_rank=0") + 3] == launch[1]["command"][launch[1]["command"].index("--node_rank=1") + 3]  # same rdzv id
    from test_node_telemetry_slow import assert_every_node_reported

    assert_every_node_reported(dirs, steps_run=4)


def test_stop_two_ranks_bound_to_numa_node_0_leaves_no_process(tmp_path, tiny_model_dir):
    """numa_bind '0:0,1:0' (this box may have one node: the wrapping is real, the CPU set is node 0's)."""
    runs = tmp_path / "runs"
    cfg = config(tmp_path, tiny_model_dir, "stop", nproc_per_node=2, max_steps=100000, numa_bind="0:0,1:0", env={"COCKPIT_TEST_MARK": "1", "HF_TOKEN": "x"})
    run = start_detached(tmp_path, cfg, env=CACHE_ENV)
    wait_for(lambda: has_step(run), 180, "the first step")
    status = json.loads((run / "status.json").read_text())
    ranks = {int(k): v for k, v in status["rank_pids"].items()}
    assert sorted(ranks) == [0, 1]
    launcher = psutil.Process(status["launcher_pid"])
    everything = {status["supervisor_pid"], launcher.pid, *ranks.values()} | {c.pid for c in launcher.children(recursive=True)}
    node0 = Path("/sys/devices/system/node/node0/cpulist")
    for pid in ranks.values():
        proc = psutil.Process(pid)
        assert proc.cmdline()[1:4] == ["-m", "cockpit.train.worker", str(run)]  # exec'd: the wrapper's pid is the rank
        assert proc.environ().get("COCKPIT_TEST_MARK") == "1"  # the config's env reaches every rank
        if node0.exists():
            from cockpit.strategy.numa import parse_cpulist

            assert set(proc.cpu_affinity()) <= set(parse_cpulist(node0.read_text()))
            assert "Mems_allowed_list:\t0\n" in Path(f"/proc/{pid}/status").read_text()
    for local in (0, 1):
        rec = json.loads((run / "logs" / f"numa.local{local}.json").read_text())
        assert rec["node"] == 0 and rec["pid"] in ranks.values()
    assert "x" not in (run / "config.yaml").read_text().split("HF_TOKEN:")[1].split("\n")[0]
    stop = cockpit("stop", run.name, "--runs-dir", str(runs), "--wait", "120")
    assert stop.returncode == 0, stop.stdout
    assert json.loads((run / "status.json").read_text())["state"] == "stopped"
    time.sleep(1.0)
    alive = [p for p in everything if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, alive


def test_fsdp_stopped_then_resumed_matches_uninterrupted(tmp_path, tiny_model_dir, ddp_run):
    """FSDP2 resume restores the sharded weights *and* the optimizer state (Adam moments, step
    count), the scheduler and the RNG: the run is stopped after its first step (a graceful stop
    saves checkpoint-1), resumed with ``cockpit resume``, and its steps match the uninterrupted
    run (the DDP run of the same job, which FSDP2 matches within 2e-6, see the module docstring)
    within 2e-5 relative; measured: bit for bit. With model-only checkpoints (fresh Adam moments
    after the resume) steps 3 and 4 differ by 1.3e-4 and 4.3e-4 relative (measured)."""
    cfg = config(tmp_path, tiny_model_dir, "fsdp-resume", nproc_per_node=2, fsdp="full_shard", save_strategy="steps", save_steps=1000)
    # --skip-check: no held run (cockpit.run.gate), so the command returns before the ranks have
    # loaded and the stop is there before the first step; a held run trains as soon as the check
    # passes, and this 4-step job can end before a stop asked after the command returns
    run = start_detached(tmp_path, cfg, env=CACHE_ENV, extra=("--skip-check",))
    RunDir(run).request("stop", "the test")
    assert cockpit("stop", str(run), "--wait", "240").returncode == 0  # consumed at the first step boundary
    st = json.loads((run / "status.json").read_text())
    assert st["state"] == "stopped", st
    k = max(e["step"] for e in read_events(run) if e["kind"] == "step")
    assert k < 4 and (run / "checkpoints" / f"checkpoint-{k}").is_dir()
    res = cockpit("resume", str(run), env=CACHE_ENV, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + (run / "logs" / "rank0.log").read_text()[-3000:]
    st = json.loads((run / "status.json").read_text())
    assert st["state"] == "finished" and st["attempt"] == 2 and st["resumed_from"].endswith(f"checkpoint-{k}")
    by_step = {}
    for e in read_events(run):
        if e["kind"] == "step":
            by_step[e["step"]] = e["loss"]  # the resumed attempt's value wins
    assert sorted(by_step) == [1, 2, 3, 4]
    assert_close([by_step[s] for s in (1, 2, 3, 4)], losses(ddp_run), rel=2e-5)
    assert (run / "checkpoints" / f"checkpoint-{k}" / "optimizer.pt").exists()
