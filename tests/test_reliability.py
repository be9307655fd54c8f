"""Failures end in a clear state and reason, nothing is left running, checkpoints are atomic,
resume continues the run, secrets are never written, and runs survive their terminal."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cockpit.store.events import EventReader
from conftest import ROOT, cockpit, has_step, prerequisite, read_events, start_detached, tiny_config, wait_for

pytestmark = pytest.mark.slow  # the tests with time windows are marked serial (scripts/test.sh runs them alone)


def status(run: Path) -> dict:
    try:
        return json.loads((run / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def ended(run: Path):
    s = status(run)
    return s if s.get("state") in ("finished", "failed", "stopped") else None


def all_pids(run: Path) -> set[int]:
    s = status(run)
    return set(s.get("pids") or []) | {s.get("supervisor_pid")} - {None}


def assert_no_survivors(pids: set[int]):
    time.sleep(0.5)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, alive


@pytest.mark.serial
def test_rank_sigkill_is_a_failure_with_reason_and_log_tail(tmp_path, tiny_model_dir):
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=100000, save_steps=100000, probes=None)
    run = start_detached(tmp_path, cfg)
    wait_for(lambda: has_step(run), 120, "a step")
    rank_pid = int(status(run)["rank_pids"]["0"])
    pids = all_pids(run)
    t_kill = time.time()
    os.kill(rank_pid, signal.SIGKILL)
    st = wait_for(lambda: ended(run), 30, "the run to end")
    assert st["state"] == "failed" and "SIGKILL" in st["reason"]
    assert st["updated"] - t_kill < 5
    assert st["log_tail"], "the failing rank's last log lines are in status.json"
    assert any(e["kind"] == "run_failed" and "SIGKILL" in e["reason"] for e in read_events(run))
    assert_no_survivors(pids)


def test_nan_loss_alerts_and_stops(tmp_path, tiny_model_dir):
    cfg = tiny_config(tmp_path, tiny_model_dir, finetuning_type="full", learning_rate=1e6, weight_decay=10.0, max_grad_norm=0.0, max_steps=60, probes=None, nan_policy="stop", save_steps=100000)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=300)
    run = next((tmp_path / "runs").iterdir())
    events = read_events(run)
    alerts = [e for e in events if e["kind"] == "alert" and e["code"] == "nan_loss"]
    assert alerts, [e for e in events if e["kind"] == "step"][-3:]
    assert res.returncode == 1
    st = status(run)
    assert st["state"] == "failed" and "became" in st["reason"] and "nan" in st["reason"]
    steps = [e["step"] for e in events if e["kind"] == "step"]
    assert max(steps) < 60  # stopped early


def test_out_of_memory_in_a_rank(tmp_path, tiny_model_dir):
    # A 6 GiB address-space cap (inherited by supervisor and rank) against an evaluation batch whose
    # logits alone need 64 x 512 x 49152 x 4 bytes = 6.4 GB. (Training's loss no longer builds the
    # full logits: cockpit.train.chunked_loss; evaluation keeps them, for its metrics.)
    cap = 6 * 2**30

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    long_row = {"instruction": "say it", "input": "", "output": "answer " * 700}
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(long_row) + "\n" for _ in range(128)))
    cfg = tiny_config(tmp_path, tiny_model_dir, dataset=str(data), per_device_train_batch_size=8, cutoff_len=512, probes=None,
                      max_steps=2, val_size=64, per_device_eval_batch_size=64, eval_strategy="steps", eval_steps=1)
    run = start_detached(tmp_path, cfg, preexec=limit)
    st = wait_for(lambda: ended(run), 240, "the run to end")
    assert st["state"] == "failed"
    assert "out of memory" in st["reason"].lower(), st["reason"]
    assert_no_survivors(all_pids(run))


@pytest.mark.serial
def test_hang_is_noticed_naming_the_rank(tmp_path, tiny_model_dir):
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=100000, save_steps=100000, probes=None, hang_timeout_s=3.0)
    run = start_detached(tmp_path, cfg)
    wait_for(lambda: has_step(run, 3), 120, "steps")
    rank_pid = int(status(run)["rank_pids"]["0"])
    os.kill(rank_pid, signal.SIGSTOP)  # alive but making no progress
    t0 = time.time()
    try:
        alert = wait_for(lambda: next((e for e in read_events(run) if e["kind"] == "alert" and e["code"] == "hang"), None), 30, "a hang alert")
        assert alert["t"] - t0 < 10
        assert "rank 0" in alert["message"] and any("NCCL_DEBUG=INFO" in r for r in alert["remedies"])
    finally:
        os.kill(rank_pid, signal.SIGCONT)
        cockpit("stop", str(run), "--kill", "--wait", "30")
    assert_no_survivors(all_pids(run))


def step_losses(run: Path, attempt: int | None = None) -> dict[int, float]:
    """step -> loss; a later attempt overwrites the steps it repeats. With ``attempt``: only the
    steps logged by that attempt (attempts are delimited by train_begin events)."""
    out: dict[int, float] = {}
    n = 0
    for e in read_events(run):
        if e["kind"] == "train_begin":
            n += 1
        elif e["kind"] == "step" and (attempt is None or n == attempt):
            out[e["step"]] = e["loss"]
    return out


def test_interrupted_then_resumed_matches_uninterrupted(tmp_path, tiny_model_dir):
    steps = 48  # room for the kill to land before the end on a loaded box (~0.05 s a step when idle)
    common = dict(max_steps=steps, save_steps=4, logging_steps=1, probes=None, lr_scheduler_type="cosine", warmup_steps=2)
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.mkdir(), b.mkdir()
    res = cockpit("train", str(tiny_config(a, tiny_model_dir, **common)), "--runs-dir", str(a / "runs"), timeout=300)
    assert res.returncode == 0, res.stderr
    full = step_losses(next((a / "runs").iterdir()))
    run = start_detached(b, tiny_config(b, tiny_model_dir, **common))
    rank_pid = int(wait_for(lambda: (status(run).get("rank_pids") or {}).get("0"), 120, "the rank's pid"))
    # The rank at the lowest priority, this poller at its own: on a loaded box (a neighbour's tests on both
    # cores) the poller is scheduled before the rank, which ran all 48 steps before the poller read its
    # first event once (a run "finished", not killed). The run's numbers do not depend on its priority.
    os.setpriority(os.PRIO_PROCESS, rank_pid, 19)
    # A crash after checkpoint-8: poll tightly (new bytes only) and kill at once. Steps take
    # ~0.05 s on an idle box, so the kill may land a checkpoint or two later: k is the last one
    # saved before it, and the run must not have reached its end.
    reader = EventReader(run / "events.jsonl")
    deadline = time.time() + 120
    while not any(e["kind"] == "checkpoint_saved" and e["step"] == 8 for e in reader.read_new()):
        assert time.time() < deadline, "no checkpoint-8"
        time.sleep(0.01)
    os.kill(rank_pid, signal.SIGKILL)
    assert wait_for(lambda: ended(run), 60, "the run to end")["state"] == "failed"
    first = step_losses(run, attempt=1)
    k = max(e["step"] for e in read_events(run) if e["kind"] == "checkpoint_saved")
    assert 8 <= k < steps and max(first) < steps
    res = cockpit("resume", str(run), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    st = status(run)
    assert st["state"] == "finished" and st["attempt"] == 2 and st["resumed_from"].endswith(f"checkpoint-{k}")
    resumed = step_losses(run)
    assert sorted(resumed) == list(range(1, steps + 1))  # no gap in step numbers
    second = step_losses(run, attempt=2)
    assert min(second) == k + 1
    # Steps both attempts ran (after checkpoint-k, before the kill) are identical: weights,
    # optimizer, scheduler, RNG and data position were all restored.
    for step in set(first) & set(second):
        assert second[step] == pytest.approx(first[step], rel=1e-5)
    # Against a separate uninterrupted run: within 1 % relative. Two uninterrupted CPU runs of
    # this job already differ by up to ~0.2 % (kernel-level float non-determinism), so exact
    # equality across runs is not expected.
    for step in range(k + 1, steps + 1):
        assert resumed[step] == pytest.approx(full[step], rel=1e-2), (step, resumed[step], full[step])
    lrs = [e["lr"] for e in read_events(run) if e["kind"] == "step"]
    assert lrs[-1] < max(lrs)  # the schedule continued (cosine decays), it did not restart
    # the summary covers the run, not the attempt: its first loss, and tokens/s over the training
    # time of both attempts (checkpoint-k recorded the first attempt's time up to it)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["first_loss"] == pytest.approx(first[1])
    record = json.loads((run / "checkpoints" / f"checkpoint-{k}" / "cockpit_checkpoint.json").read_text())
    assert record["loss_finite"] is True and record["first_loss"] == pytest.approx(first[1]) and record["train_time_s"] > 0
    assert summary["train_runtime_s"] > record["train_time_s"]
    # tokens/s with the warm-up steps: over both attempts' training time; the headline figure leaves the
    # warm-up out (of the attempt that ran to the end), so it is the larger one
    assert summary["tokens_per_s_with_warmup"] == pytest.approx(summary["tokens_seen"] / summary["train_runtime_s"], rel=0.01)
    assert summary["tokens_per_s"] > 0
    assert summary["tokens_seen"] == max(e["tokens_seen"] for e in read_events(run) if e["kind"] == "step")
    # the run's time counts both attempts (the pause before the resume left out): summary and finished line
    events = read_events(run)
    end1 = next(i for i, e in enumerate(events) if e["kind"] == "state" and e["state"] == "failed")
    attempt1 = events[end1]["t"] - events[0]["t"]
    attempt2_so_far = next(e for e in events if e["kind"] == "run_finished")["t"] - events[end1 + 1]["t"]
    assert summary["runtime_s"] == pytest.approx(attempt1 + attempt2_so_far, abs=1.0)
    assert next(e for e in events if e["kind"] == "run_finished")["runtime_s"] == summary["runtime_s"]


# the disk-full test (the whole runs dir on a small tmpfs) is tests/test_disk_full.py


def test_secrets_are_never_written_and_no_listening_socket(tmp_path, tiny_model_dir):
    planted = "hf_PLANTEDsecret123456"
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=8, env={"HF_TOKEN": planted, "MY_SERVICE_PASSWORD": planted + "2", "NCCL_DEBUG": "WARN"})
    run = start_detached(tmp_path, cfg, env={"HF_TOKEN": planted, "WANDB_API_KEY": planted + "3"})
    wait_for(lambda: has_step(run), 120, "a step")
    listening = []
    for pid in all_pids(run):
        try:
            for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                listening += [c for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            pass
    assert not listening, listening  # a single-process run listens nowhere
    wait_for(lambda: ended(run), 120, "the end")
    for f in run.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert planted.encode() not in data, f
    assert "NCCL_DEBUG: WARN" in (run / "config.yaml").read_text()


class Tmux:
    """A private tmux server (its own socket) and its one pane."""

    def __init__(self, sock: Path):
        self.sock = str(sock)

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-S", self.sock, *args], capture_output=True, text=True, check=check, timeout=30)

    def screen(self) -> str:
        res = self("capture-pane", "-p", "-t", "cockpit", check=False)
        return res.stdout if res.returncode == 0 else ""

    def keys(self, *keys: str) -> None:
        self("send-keys", "-t", "cockpit", *keys)

    def wait_text(self, text: str, timeout: float) -> str:
        try:
            return wait_for(lambda: (lambda s: s if text in s else None)(self.screen()), timeout, repr(text))
        except AssertionError:
            raise AssertionError(f"timed out waiting for {text!r} on the screen:\n{self.screen()}") from None


@pytest.mark.serial
def test_run_launched_from_setup_survives_killing_the_tmux_server(tmp_path, tiny_model_dir):
    """The cockpit app in tmux: a user preset loaded from the command palette (after the Setup
    screen's own cpu-demo preload, so its values win), F8 launches, the Live screen shows the
    run; then the tmux server is killed (the app gets SIGHUP): the detached run finishes every
    step, and ``cockpit attach`` replays all of them."""
    prerequisite(shutil.which("tmux") is not None, "tmux not installed")
    steps = 30
    runs = tmp_path / "runs"
    config_home = tmp_path / "config"
    (config_home / "cockpit" / "presets").mkdir(parents=True)
    tiny_config(config_home / "cockpit" / "presets", tiny_model_dir, "tiny", max_steps=steps, probes=None, save_steps=100000)
    env = dict(os.environ, TERM="xterm-256color", XDG_CONFIG_HOME=str(config_home), OMP_NUM_THREADS="1")
    env.pop("TMUX", None)
    tmux = Tmux(tmp_path / "tmux.sock")
    cmd = f"cd {ROOT} && {sys.executable} -m cockpit.cli --runs-dir {runs}"
    subprocess.run(["tmux", "-S", tmux.sock, "new-session", "-d", "-s", "cockpit", "-x", "120", "-y", "40", cmd], check=True, env=env, timeout=30)
    try:
        tmux.wait_text("Launch", 120)  # the Setup screen (no runs yet), cpu-demo preloaded
        wait_for(lambda: "cpu-demo" in tmux.screen() or "Kestrel" in tmux.screen() or "smollm2" in tmux.screen(), 60, "the cpu-demo preload")
        tmux.keys("C-p")
        tmux.wait_text("Search for commands", 30)
        tmux.keys("-l", "Preset: tiny")
        tmux.wait_text("load ", 30)  # the matching command's help line: load <path> into Setup
        tmux.keys("Enter")
        tmux.wait_text("preset tiny loaded", 30)
        tmux.wait_text(str(tiny_model_dir)[:40], 30)  # the form shows the tiny model, not cpu-demo's
        # F8 until the launch starts (validation runs `cockpit check` in the background first)
        def launched():
            screen = tmux.screen()
            if "launching" in screen or "checking this machine" in screen:
                return True
            if "Launch anyway" in screen:  # a doctor finding for this machine: go ahead
                tmux.keys("Enter")
                return False
            tmux.keys("F8")
            return False
        wait_for(lambda: launched() or (time.sleep(2) and False), 180, "the launch to start")
        run = wait_for(lambda: next((d for d in runs.iterdir() if d.is_dir() and not d.name.startswith(".")), None) if runs.exists() else None, 180, "the run dir")
        tmux.wait_text(run.name[:30], 120)  # the Live screen's title names the run
        wait_for(lambda: has_step(run, 1), 180, "a step")
        assert status(run)["step"] < steps, "the run must still be going when its terminal disappears"
    finally:
        subprocess.run(["tmux", "-S", tmux.sock, "kill-server"], capture_output=True, timeout=30)  # SIGHUP to the app
    st = wait_for(lambda: ended(run), 300, "the run to finish")
    assert st["state"] == "finished", st
    import yaml

    assert yaml.safe_load((run / "config.yaml").read_text())["model_name_or_path"] == str(tiny_model_dir)  # the tiny preset won
    assert [e["step"] for e in read_events(run) if e["kind"] == "step"] == list(range(1, steps + 1))
    att = cockpit("attach", str(run), "--no-follow")
    assert att.returncode == 0, att.stdout + att.stderr
    replayed = [int(l.split()[1].split("/")[0]) for l in att.stdout.splitlines() if l.startswith("step ")]
    assert replayed == list(range(1, steps + 1))  # no gap in step numbers


def spiky_config(tmp_path: Path, model_dir: Path, policy: str) -> Path:
    """A real, deterministic loss spike: seven copies of one short reply (full fine-tuning learns
    it within a few steps: loss falls well under 1) and one long row of unrelated tokens, which
    the model has never fit: each time the seeded sampler reaches it in a later epoch (steps 24,
    31 and 33 of 40 with this seed) its loss is >10x the recent median (~0.3 and falling)."""
    easy = {"instruction": "hi", "input": "", "output": "hello there"}
    hard = {"instruction": "recite", "input": "", "output": "zebra quantum 42 ox ## fjord лес 山 mango xylophone !! 7731 pyre " * 4}
    data = tmp_path / "spiky.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in [easy] * 7 + [hard]), encoding="utf-8")
    return tiny_config(
        tmp_path, model_dir, f"spike-{policy}", dataset=str(data), finetuning_type="full", learning_rate=1e-2,
        lr_scheduler_type="constant", per_device_train_batch_size=1, max_steps=40, save_steps=1000, probes=None,
        telemetry_interval_s=0, spike_policy=policy, spike_factor=3.0, seed=3,
    )


def test_loss_spike_warn_alerts_and_finishes(tmp_path, tiny_model_dir):
    res = cockpit("train", str(spiky_config(tmp_path, tiny_model_dir, "warn")), "--runs-dir", str(tmp_path / "runs"), timeout=300)
    run = next((tmp_path / "runs").iterdir())
    events = read_events(run)
    spikes = [e for e in events if e["kind"] == "alert" and e["code"] == "loss_spike"]
    assert spikes, [(e["step"], e["loss"]) for e in events if e["kind"] == "step"]
    assert spikes[0]["policy"] == "warn" and spikes[0]["level"] == "warn" and "recent median" in spikes[0]["message"]
    assert res.returncode == 0, res.stdout[-2000:]
    assert status(run)["state"] == "finished"
    assert [e["step"] for e in events if e["kind"] == "step"] == list(range(1, 41))


def test_loss_spike_stop_saves_and_stops_with_the_reason(tmp_path, tiny_model_dir):
    res = cockpit("train", str(spiky_config(tmp_path, tiny_model_dir, "stop")), "--runs-dir", str(tmp_path / "runs"), timeout=300)
    run = next((tmp_path / "runs").iterdir())
    events = read_events(run)
    spike = next(e for e in events if e["kind"] == "alert" and e["code"] == "loss_spike")
    assert spike["policy"] == "stop"
    at = int(spike["message"].split(" at step ")[1].split()[0])
    steps = [e["step"] for e in events if e["kind"] == "step"]
    assert max(steps) == at < 40  # stopped at the spike
    assert any(e["kind"] == "checkpoint_saved" and e["step"] == at for e in events)
    assert (run / "checkpoints" / f"checkpoint-{at}" / "trainer_state.json").exists()
    st = status(run)
    assert res.returncode == 0 and st["state"] == "stopped", (res.returncode, st)
    assert f"loss spike at step {at}" in st["reason"], st["reason"]
    assert any(e["kind"] == "run_stopped" and "loss spike" in e["reason"] for e in events)
