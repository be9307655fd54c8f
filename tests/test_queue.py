"""The run queue (``cockpit queue``, ``cockpit/run/queue.py``): real runs of the tiny Llama through
the real CLI, the detached queue runner and each run's own supervisor. No mocks."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import ROOT, cockpit, tiny_config, wait_for
from cockpit.run import queue as q
from cockpit.store.rundir import TERMINAL_STATES, list_runs

ENV = {"OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions")}
QUICK = dict(max_steps=1, save_strategy="no", probes=None, telemetry_interval_s=0, numa_bind="off")


def config(tmp_path: Path, model: Path, name: str, **over) -> Path:
    return tiny_config(tmp_path, model, name, **{**QUICK, **over})


def queue_cli(runs: Path, *args: str):
    return cockpit("queue", *args, "--runs-dir", str(runs), env=ENV, timeout=300)


def add(runs: Path, cfg: Path, *sets: str) -> str:
    res = cockpit("queue", "add", str(cfg), *[a for s in sets for a in ("--set", s)], "--runs-dir", str(runs), "--json", env=ENV, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)["id"]


def done(runs: Path) -> list[dict]:
    return q.read_queue(runs)["done"]


def queue_empty(runs: Path) -> bool:
    return not q.read_queue(runs)["entries"] and not q.runner_alive(runs)


def run_status(runs: Path, run_id: str) -> dict:
    return json.loads((runs / run_id / "status.json").read_text())


def started_run(runs: Path, entry_id: str) -> str | None:
    return next((e["run_id"] for e in q.read_queue(runs)["entries"] if e["id"] == entry_id and e.get("run_id")), None)


# -- the queue file: order, rm, move (no runner: entries written with the module's own functions) --


def test_move_and_rm_change_the_order(tmp_path):
    runs = tmp_path / "runs"
    ids = [q.add_entry(runs, f"c{i}.yaml", [f"seed={i}"], str(tmp_path))["id"] for i in range(4)]
    assert [e["position"] for e in q.listing(runs)] == [1, 2, 3, 4]
    assert q.move_entry(runs, ids[3], 1) == {ids[3]: 1, ids[0]: 2, ids[1]: 3, ids[2]: 4}
    assert q.move_entry(runs, ids[3], 99)[ids[3]] == 4  # clamped to the end
    q.remove_entry(runs, ids[1][:4])  # a unique prefix names it
    rows = q.listing(runs)
    assert [r["id"] for r in rows] == [ids[0], ids[2], ids[3]] and [r["position"] for r in rows] == [1, 2, 3]
    assert rows[0]["config"] == str(tmp_path / "c0.yaml") and rows[0]["overrides"] == ["seed=0"]
    with pytest.raises(LookupError):
        q.remove_entry(runs, ids[1])
    assert not q.runner_alive(runs)


def test_runs_and_queue_list_the_queued_entries_with_their_overrides(tmp_path):
    """Issue 62, item 9: `cockpit runs` lists the queued entries (above the runs, as the Runs screen
    does) and `cockpit queue`'s plain output shows each entry's --set overrides."""
    import fcntl

    runs = tmp_path / "runs"
    first = q.add_entry(runs, "a.yaml", ["learning_rate=1e-4", "run_name=two words"], str(tmp_path))["id"]
    lock = os.open(runs / "queue" / ".runner.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a live runner (this process): nothing starts
    try:
        listed = cockpit("runs", "--runs-dir", str(runs))
        as_json = json.loads(cockpit("runs", "--runs-dir", str(runs), "--json").stdout)
        shown = queue_cli(runs)
    finally:
        os.close(lock)
    overrides = "--set learning_rate=1e-4 --set 'run_name=two words'"
    assert f"queue:{first}" in listed.stdout and "queued #1" in listed.stdout, listed.stdout
    assert f"{tmp_path / 'a.yaml'} {overrides}" in listed.stdout
    assert as_json == [{"queue_entry": first, "run_id": None, "state": "queued", "position": 1,
                        "config": str(tmp_path / "a.yaml"), "overrides": ["learning_rate=1e-4", "run_name=two words"],
                        "added": as_json[0]["added"]}]
    assert shown.returncode == 0 and f"{tmp_path / 'a.yaml'} {overrides}" in shown.stdout, shown.stdout


def test_add_refuses_what_check_refuses_slurm_and_multi_node_runs(tmp_path, tiny_model_dir):
    runs = tmp_path / "runs"
    bad = config(tmp_path, tiny_model_dir, "bad", learning_rate="fast")
    checked = cockpit("check", str(bad), env=ENV, timeout=300)
    res = queue_cli(runs, "add", str(bad))
    assert res.returncode == checked.returncode == 2
    assert "learning_rate" in res.stderr and res.stderr == checked.stderr
    slurm = queue_cli(runs, "add", str(config(tmp_path, tiny_model_dir, "s", slurm_gres="gpu:mi300x")))
    assert slurm.returncode == 2 and "queued by Slurm, not by this queue" in slurm.stderr
    nodes = queue_cli(runs, "add", str(config(tmp_path, tiny_model_dir, "n", nnodes=2, master_addr="10.0.0.1", master_port=29500)))
    assert nodes.returncode == 2 and "nnodes: 2: a run on several nodes starts on every node" in nodes.stderr
    assert queue_cli(runs, "rm", "nope").returncode == 2
    assert not q.read_queue(runs)["entries"] and not (runs / "queue" / "runner.json").exists()


def test_assign_starts_entries_in_order_while_their_gpus_are_free():
    """The fitting logic: free GPUs in inventory order, head of line, whole-host entries alone."""
    two, four = ["0", "1"], ["0", "1", "2", "3"]
    assert q.assign(two, [], [1, 1, 1]) == [["0"], ["1"]]  # the third waits
    assert q.assign(two, [["0"]], [1, 1]) == [["1"]]  # the GPU a run holds is not handed out
    assert q.assign(four, [["1"]], [2, 1]) == [["0", "2"], ["3"]]
    assert q.assign(four, [["0", "1"]], [3, 1]) == []  # head of line: the 1-GPU entry does not overtake
    assert q.assign(two, [], [q.ALL, 1]) == [two]  # a whole-host entry runs alone
    assert q.assign(two, [["1"]], [q.ALL]) == []
    assert q.assign(two, [], [3]) == [two]  # more than the host has: alone, with every GPU
    assert q.assign([], [], [1, 1]) == [[]] and q.assign([], [[]], [1]) == []  # no GPUs: one at a time
    assert q.assign(two, [two], [1]) == []  # a run without a record holds every GPU (held_gpus)


def two_amd_gpus(tmp_path: Path) -> Path:
    """A sysfs tree with two AMD GPUs and an Intel display controller on the PCI bus."""
    sysfs = tmp_path / "sys"
    for bdf, vendor in (("0000:03:00.0", "0x1002"), ("0000:43:00.0", "0x1002"), ("0000:05:00.0", "0x8086")):
        dev = sysfs / "bus/pci/devices" / bdf
        dev.mkdir(parents=True)
        (dev / "vendor").write_text(vendor + "\n")
        (dev / "class").write_text("0x038000\n")
    return sysfs


def test_host_gpus_come_from_the_override_else_the_bus_narrowed_by_visible_devices(tmp_path):
    sysfs = two_amd_gpus(tmp_path)
    assert q.host_gpus({}, str(sysfs)) == ["0", "1"]  # the two AMD GPUs, not the Intel one
    assert q.host_gpus({"HIP_VISIBLE_DEVICES": "1"}, str(sysfs)) == ["1"]
    assert q.host_gpus({"ROCR_VISIBLE_DEVICES": "GPU-aa"}, str(sysfs)) == ["0"]  # HIP indexes within ROCR's mask
    assert q.host_gpus({"COCKPIT_QUEUE_DEVICES": "4,5"}, str(sysfs)) == ["4", "5"]
    assert q.host_gpus({"COCKPIT_QUEUE_DEVICES": ""}, str(sysfs)) == []
    assert q.host_gpus({}, str(tmp_path / "none")) == []  # a CPU host


def test_active_runs_hold_their_recorded_gpus_and_a_run_without_a_record_holds_all(tmp_path):
    """held_gpus reads every active run's status.json (a live supervisor: this process stands for it)."""
    import socket

    from cockpit.run.liveness import start_time
    from cockpit.store.rundir import create_run_dir

    runs = tmp_path / "runs"
    alive = {"supervisor_pid": os.getpid(), "supervisor_start": start_time(os.getpid()), "supervisor_host": socket.gethostname()}
    for name, fields in (
        ("queued-one", {"state": "running", "gpus": ["1"], **alive}),
        ("cockpit-train", {"state": "running", **alive}),  # started outside the queue: no record
        ("ended", {"state": "finished", "gpus": ["0"]}),
        ("elsewhere", {"state": "running", **alive, "supervisor_host": "another-node"}),
    ):
        create_run_dir(runs, name).update_status(**fields)
    assert sorted(q.held_gpus(runs, ["0", "1"])) == [["0", "1"], ["1"]]
    assert q.assign(["0", "1"], q.held_gpus(runs, ["0", "1"]), [1]) == []
    from cockpit.ui.screens.runs import run_row

    (one,) = [r for r in list_runs(runs) if "queued-one" in r.run_id]
    assert str(run_row(one, one.read_status(), time.time())[0][2]).endswith("running · GPU 1")  # the Runs screen's state cell


def test_a_host_without_gpus_waits_for_a_run_started_outside_the_queue(tmp_path):
    """Issue 50 item 4: with no GPUs the queue counted only its own runs as busy, so a queued entry
    started beside a `cockpit train` (or F8) run. Every active run of the runs dir holds the host."""
    import socket

    from cockpit.run.liveness import start_time
    from cockpit.store.rundir import create_run_dir

    runs = tmp_path / "runs"
    alive = {"supervisor_pid": os.getpid(), "supervisor_start": start_time(os.getpid()), "supervisor_host": socket.gethostname()}
    by_hand = create_run_dir(runs, "cockpit-train")
    by_hand.update_status(state="running", **alive)
    entry = q.add_entry(runs, "later.yaml", [], str(tmp_path))
    assert q.next_entries(runs, []) == []  # waits: the hand-started run holds the host
    assert q.read_queue(runs)["entries"][0]["state"] == "queued"
    by_hand.update_status(state="finished", ended=time.time())
    (starting,) = q.next_entries(runs, []) or []
    assert starting["id"] == entry["id"] and starting["state"] == "launching"


def test_a_run_started_outside_the_queue_holds_the_gpus_its_ranks_take(tmp_path, tiny_model_dir):
    """``cockpit train`` (and a resume) outside the queue records the GPUs its ranks take: the first
    ``nproc_per_node`` its environment shows, a hand-pinned HIP/CUDA_VISIBLE_DEVICES included, so the
    queue hands out the others; where they cannot be named the run holds every GPU, as before."""
    import yaml

    from cockpit.config.load import load_config
    from cockpit.run.launch import start_run

    sysfs = str(two_amd_gpus(tmp_path))
    gpu = load_config(str(config(tmp_path, tiny_model_dir, "gpu", use_cpu=None)))
    two = gpu.replace(nproc_per_node=2)
    assert q.taken_gpus(gpu, {}, sysfs) == ["0"] and q.taken_gpus(two, {}, sysfs) == ["0", "1"]
    assert q.taken_gpus(gpu, {"HIP_VISIBLE_DEVICES": "1"}, sysfs) == ["1"]  # pinned by hand
    assert q.taken_gpus(two, {"CUDA_VISIBLE_DEVICES": "3,1,2"}, sysfs) == ["3", "1"]
    assert q.taken_gpus(gpu, {"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "1"}, sysfs) == ["1"]
    for unnamed in (
        {"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0"},  # which one wins depends on the runtime
        {"ROCR_VISIBLE_DEVICES": "1"},  # HIP's indices count within ROCR's list
        {"CUDA_VISIBLE_DEVICES": "GPU-5e1c"},  # a UUID the queue's indices cannot match
        {"HIP_VISIBLE_DEVICES": ""},  # nothing shown
    ):
        assert q.taken_gpus(gpu, unnamed, sysfs) is None, unnamed
    assert q.taken_gpus(gpu.replace(nproc_per_node=3), {}, sysfs) is None  # more than the host shows
    assert q.taken_gpus(gpu.replace(use_cpu=True), {}, sysfs) is None  # a CPU run takes the whole host

    # a real start: the config's env pins GPU 1; status.json says so before the supervisor runs
    runs = tmp_path / "runs"
    pinned = gpu.replace(env={"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "1"})
    run = start_run(pinned, config_path=str(tmp_path / "gpu.yaml"), runs_dir=runs)
    try:
        held = run.read_status()["gpus"]
        assert held == ["1"], held
        assert q.assign(["0", "1"], [held], [1, 1]) == [["0"]]  # the queue hands out GPU 0 alone
        assert yaml.safe_load(run.config_path.read_text())["env"]["HIP_VISIBLE_DEVICES"] == "1"
    finally:  # on this CPU host the run cannot find its GPU: it ends by itself; stop it anyway
        cockpit("stop", run.run_id, "--runs-dir", str(runs), "--kill", "--wait", "60", env=ENV)
        wait_for(lambda: run.read_status().get("state") in TERMINAL_STATES, 60, "the run to end")


def test_gpus_needed_and_shown(tmp_path, tiny_model_dir):
    from cockpit.config import load_config

    cfg = load_config(config(tmp_path, tiny_model_dir, "n", use_cpu=None))
    assert q.gpus_needed(cfg) == 1 and q.gpus_needed(cfg.replace(nproc_per_node=4)) == 4
    assert q.gpus_needed(cfg.replace(use_cpu=True)) == q.ALL
    assert q.gpus_text({"gpus": ["0", "1"]}) == "GPU 0,1" and q.gpus_text({"gpus_needed": 2}) == "needs 2 GPUs"
    assert q.gpus_text({"gpus_needed": q.ALL}) == "needs all GPUs" and q.gpus_text({}) == ""


# -- real runs ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_queued_runs_finish_in_order_and_a_failure_does_not_block(tmp_path, tiny_model_dir):
    """A, a run that fails in its rank (its model's weights gone), C, D moved before C, E removed:
    A, broken, D, C run one at a time in that order; E never runs."""
    runs = tmp_path / "runs"
    broken_model = tmp_path / "broken-model"
    broken_model.mkdir()
    for f in tiny_model_dir.iterdir():
        (broken_model / f.name).write_bytes(f.read_bytes())
    for w in broken_model.glob("*.safetensors"):
        w.unlink()  # the rank finds no weights
    cfgs = [config(tmp_path, m, n) for m, n in ((tiny_model_dir, "a"), (broken_model, "broken"), (tiny_model_dir, "c"))]
    a, broken, c, d, e = [q.add_entry(runs, str(p), [], str(tmp_path))["id"] for p in (*cfgs, cfgs[2], cfgs[0])]
    assert not q.runner_alive(runs)  # written without the CLI: no runner yet
    assert queue_cli(runs, "move", d, "3").returncode == 0  # the first command starts the runner
    assert queue_cli(runs, "rm", e).returncode == 0
    listed = json.loads(queue_cli(runs, "--json").stdout)
    assert [r["id"] for r in listed] == [a, broken, d, c][-len(listed):]
    wait_for(lambda: queue_empty(runs), 240, "the queue to empty")
    ended = done(runs)
    assert [x["id"] for x in ended] == [a, broken, d, c]
    states = {x["id"]: run_status(runs, x["run_id"]) for x in ended}
    assert [states[i]["state"] for i in (a, broken, d, c)] == ["finished", "failed", "finished", "finished"]
    assert states[d]["queue_entry"] == d
    spans = [(states[i]["started"], states[i]["ended"]) for i in (a, broken, d, c)]
    assert all(prev[1] <= nxt[0] + 0.001 for prev, nxt in zip(spans, spans[1:])), spans  # one at a time
    assert len([p for p in runs.iterdir() if (p / "status.json").exists()]) == 4  # e never ran


@pytest.mark.slow
def test_killing_the_runner_loses_nothing(tmp_path, tiny_model_dir):
    runs = tmp_path / "runs"
    first = add(runs, config(tmp_path, tiny_model_dir, "first", max_steps=4))  # the CLI starts the runner
    second = q.add_entry(runs, str(config(tmp_path, tiny_model_dir, "second")), [], str(tmp_path))["id"]  # at once
    run1 = wait_for(lambda: started_run(runs, first), 60, "the first run to start")
    runner = json.loads((runs / "queue" / "runner.json").read_text())["pid"]
    os.kill(runner, signal.SIGKILL)
    wait_for(lambda: not q.runner_alive(runs), 10, "the runner to die")
    # the run in flight ends normally under its own supervisor; nothing starts the next meanwhile
    wait_for(lambda: run_status(runs, run1).get("state") in TERMINAL_STATES, 120, "the first run to end")
    assert run_status(runs, run1)["state"] == "finished"
    assert [e["id"] for e in q.read_queue(runs)["entries"]] == [first, second]
    listed = queue_cli(runs)  # any queue command adopts the queue
    assert listed.returncode == 0 and second in listed.stdout
    wait_for(lambda: queue_empty(runs), 120, "the adopted queue to empty")
    assert [(x["id"], x["state"]) for x in done(runs)] == [(first, "finished"), (second, "finished")]
    assert run_status(runs, done(runs)[1]["run_id"])["state"] == "finished"


def rank_visible(runs: Path, run_id: str) -> dict:
    """The *_VISIBLE_DEVICES rank 0 saw (its own environment, in its rank_started event)."""
    events = [json.loads(line) for line in (runs / run_id / "events.jsonl").read_text().splitlines()]
    return next(e["visible_devices"] for e in events if e["kind"] == "rank_started")


@pytest.mark.slow
def test_runs_share_the_gpus_two_at_a_time(tmp_path, tiny_model_dir, monkeypatch):
    """Two GPUs declared, three 1-GPU entries: the first two run at once, each seeing only its own
    GPU; the third starts when one has ended, on the GPU it freed."""
    runs = tmp_path / "runs"
    monkeypatch.setenv(q.DEVICES_ENV, "0,1")
    cfgs = [config(tmp_path, tiny_model_dir, n, use_cpu=None, max_steps=2) for n in ("a", "b", "c")]
    ids = [q.add_entry(runs, str(cfg), [], str(tmp_path))["id"] for cfg in cfgs]  # all queued at once
    assert queue_cli(runs).returncode == 0  # starts the runner, which inherits COCKPIT_QUEUE_DEVICES
    wait_for(lambda: started_run(runs, ids[1]), 60, "the second run to start")
    shown = {line.split()[0]: line for line in queue_cli(runs).stdout.splitlines()}  # while both run (~10 s)
    assert " GPU 0 " in shown[ids[0]] and " GPU 1 " in shown[ids[1]] and " needs 1 GPU " in shown[ids[2]]
    wait_for(lambda: queue_empty(runs), 300, "the queue to empty")
    ended = {x["id"]: x for x in done(runs)}
    assert [ended[i]["state"] for i in ids] == ["finished"] * 3
    status = {i: run_status(runs, ended[i]["run_id"]) for i in ids}
    a, b, c = (status[i] for i in ids)
    assert a["started"] < b["ended"] and b["started"] < a["ended"]  # a and b ran at the same time
    assert {tuple(a["gpus"]), tuple(b["gpus"])} == {("0",), ("1",)}
    for st in (a, b, c):
        shown = ",".join(st["gpus"])
        assert rank_visible(runs, st["run_id"]) == {"HIP_VISIBLE_DEVICES": shown, "CUDA_VISIBLE_DEVICES": shown}
    assert ended[ids[2]]["added"] < min(a["ended"], b["ended"])  # c was waiting while both ran
    freed = [st["gpus"] for st in (a, b) if st["ended"] <= c["started"]]
    assert freed and c["gpus"] in freed  # c waited for a GPU, and took the one that was freed
    log = (runs / "queue" / "runner.log").read_text()
    assert "GPUs: 0,1" in log and " on GPU 0" in log and " on GPU 1" in log


# -- the cockpit: Runs shows the queued entries above the runs; Delete takes one out, [ ] move one


def test_runs_screen_shows_the_queue_above_the_runs_delete_removes_and_brackets_move(tmp_path):
    import asyncio
    import fcntl
    import shutil

    from test_ui_pilot import runs_listed, wait_for

    from cockpit.ui.app import CockpitApp

    runs = tmp_path / "runs"
    shutil.copytree(ROOT / "tests" / "fixtures" / "ui_run", runs)
    first, second, third = (q.add_entry(runs, f"{n}.yaml", [], str(tmp_path))["id"] for n in ("sweep-a", "sweep-b", "sweep-c"))
    lock = os.open(runs / "queue" / ".runner.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a live runner (this process): the screen adopts nothing

    async def scenario() -> None:
        app = CockpitApp(str(runs), start="runs", follow=False)
        async with app.run_test(size=(100, 24)) as pilot:
            await wait_for(pilot, lambda: runs_listed(app), 10, "the runs")
            table = app.screen.query_one("#runs-table")
            rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
            assert [r[1:3] for r in rows[:3]] == [["sweep-a", "◷ queued #1"], ["sweep-b", "◷ queued #2"], ["sweep-c", "◷ queued #3"]]
            assert table.row_count == 3 + len([p for p in runs.iterdir() if (p / "status.json").exists()])
            await pilot.press("delete")  # the cursor is on the first queued entry: asked first (issue 62, item 9)
            await pilot.pause(0.3)
            from cockpit.ui.screens.modals import Confirm

            assert isinstance(app.screen, Confirm) and "sweep-a.yaml" in app.screen.question
            await pilot.press("n")  # no: it stays
            await pilot.pause(0.3)
            assert [e["id"] for e in q.read_queue(runs)["entries"]] == [first, second, third]
            await pilot.press("delete", "y")
            await pilot.pause(0.3)
            assert [e["id"] for e in q.read_queue(runs)["entries"]] == [second, third]
            assert [str(c) for c in table.get_row_at(0)][1:3] == ["sweep-b", "◷ queued #1"]
            await pilot.press("down", "left_square_bracket")  # sweep-c one place earlier
            await pilot.pause(0.3)
            assert [e["id"] for e in q.read_queue(runs)["entries"]] == [third, second]
            assert [[str(c) for c in table.get_row_at(i)][1:3] for i in (0, 1)] == [["sweep-c", "◷ queued #1"], ["sweep-b", "◷ queued #2"]]
            assert table.cursor_row == 0  # still on the moved entry

    try:
        asyncio.run(scenario())
    finally:
        os.close(lock)
    assert first not in [e["id"] for e in q.read_queue(runs)["entries"]]


def test_setup_adds_its_config_to_the_queue(tmp_path, monkeypatch):
    """Setup's Queue (F10): the form's config, checked by ``cockpit queue add``, waits in the queue
    (a held runner lock stands for a live runner: nothing starts)."""
    import asyncio
    import fcntl

    from test_ui_pilot import wait_for as wait_in

    from cockpit.ui.app import CockpitApp

    runs = tmp_path / "runs"
    (runs / "queue").mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    lock = os.open(runs / "queue" / ".runner.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)

    def text_of(app, selector: str) -> str:
        return str(app.screen.query_one(selector).render())

    async def scenario() -> None:
        app = CockpitApp(str(runs), start="setup", follow=False)
        async with app.run_test(size=(120, 32)) as pilot:
            await wait_in(pilot, lambda: "config valid" in text_of(app, "#problems"), 30, "a valid config (cpu-demo)")
            await pilot.press("f10")
            await wait_in(pilot, lambda: q.read_queue(runs)["entries"], 180, "the queued entry")
            await wait_in(pilot, lambda: any("queued" in str(n.message) for n in app._notifications), 10, "the toast")

    try:
        asyncio.run(scenario())
    finally:
        os.close(lock)
    (entry,) = q.read_queue(runs)["entries"]
    assert ".ui-configs" in entry["config"] and Path(entry["config"]).is_file()
