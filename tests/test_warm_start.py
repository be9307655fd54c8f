"""The warm start server (cockpit/train/warm_start.py) and its client (cockpit/run/warm_start.py): a
process it forks is a process of its own (its session, environment, directory, output, exit code and
signals); a request with another import-time environment is served by a pool server started with
that environment (what the child sees is what a cold start sees), and refused, the caller then
starting it cold, where the pool is full."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import WARM_START_ENV, wait_for

from cockpit.run import warm_start

HERE = str(Path(__file__).resolve().parent)


@pytest.fixture
def server(warm_start_server) -> str:
    """This test process's server, once it listens."""
    if warm_start_server is None:
        pytest.skip("COCKPIT_TEST_WARM_START=0: no warm start server")
    wait_for(lambda: Path(warm_start_server).exists(), 60, "the warm start server's socket")
    return warm_start_server


def _start(tmp_path: Path, server: str, *args: str, **env: str) -> warm_start.WarmProcess | None:
    full = dict(WARM_START_ENV, COCKPIT_WARM_START=server, **env)  # not os.environ: another test may have leaked into it
    return warm_start.start([sys.executable, "-m", "warm_child", *args], full, HERE, str(tmp_path / "out"), str(tmp_path / "err"))


def test_a_warm_child_is_its_own_process_and_says_its_exit_code(tmp_path, server):
    proc = _start(tmp_path, server, "3", "an argument", WARM_CHILD_MARKER="mine")
    assert proc is not None, warm_start.last_refusal
    assert proc.pid != os.getpid()
    assert proc.wait(60) == 3
    seen = json.loads((tmp_path / "out").read_text().splitlines()[0])
    del seen["ppid"], seen["sys_path"]
    assert seen == {
        "argv": ["3", "an argument"],
        "cwd": HERE,
        "own_session": True,
        "marker": "mine",
        "torch_imported": True,  # forked from the server: torch was imported before
        "name": "__main__",
    }
    assert (tmp_path / "err").read_text() == "to stderr\n"


def test_a_signal_ends_a_warm_child_as_it_ends_a_popen(tmp_path, server):
    proc = _start(tmp_path, server, "wait")
    assert proc is not None, warm_start.last_refusal
    assert proc.poll() is None
    wait_for(lambda: (tmp_path / "out").exists() and (tmp_path / "out").read_text(), 30, "the child's first line")
    os.killpg(proc.pid, signal.SIGTERM)  # the supervisor's stop: its process group
    assert proc.wait(30) == -signal.SIGTERM


def _seen(out: Path) -> dict:
    return json.loads(out.read_text().splitlines()[0])


def _server_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_another_import_time_environment_is_served_by_a_pool_server_as_a_cold_start_sees_it(tmp_path, server):
    side = tmp_path / "side"
    side.mkdir()
    env = {"PYTHONPATH": str(side), "OMP_NUM_THREADS": "3"}
    proc = _start(tmp_path, server, "0", **env)
    assert proc is not None, warm_start.last_refusal
    assert proc.wait(120) == 0
    warm = _seen(tmp_path / "out")
    pool_server = warm.pop("ppid")
    assert _server_env(pool_server)["PYTHONPATH"] == str(side)  # imported with the child's environment
    assert _server_env(pool_server)["OMP_NUM_THREADS"] == "3"
    cold = subprocess.run(
        [sys.executable, "-m", "warm_child", "0"], cwd=HERE, capture_output=True, text=True, timeout=120,
        env=dict(WARM_START_ENV, **env),
    )
    assert cold.returncode == 0, cold.stderr
    seen_cold = json.loads(cold.stdout.splitlines()[0])
    del seen_cold["ppid"]
    assert warm["sys_path"][:2] == [HERE, str(side)]
    assert {**warm, "own_session": None, "torch_imported": None} == {**seen_cold, "own_session": None, "torch_imported": None}
    # the same environment again: the same pool server
    again = _start(tmp_path, server, "0", **env)
    assert again is not None and again.wait(60) == 0
    assert json.loads((tmp_path / "out").read_text().splitlines()[-2])["ppid"] == pool_server
    # read when used, not at import: served by the server itself
    proc = _start(tmp_path, server, "0", PYTORCH_NVML_BASED_CUDA_CHECK="1")
    assert proc is not None and proc.wait(60) == 0


@pytest.mark.slow
def test_a_full_pool_refuses_by_name_and_an_idle_pool_server_ends(tmp_path):
    """... and a terminated server ends by ``os._exit`` as an idle one does, its pool servers too: not by the
    interpreter's teardown of torch and the rest (atexit, modules: 4 s a server, a pool server's before its
    parent's; every test process's last teardown waited 8-10 s for the session's server). A sitecustomize
    on their PYTHONPATH registers an atexit handler that names the process that ran it."""
    socket_path = str(tmp_path / "own.sock")
    site, ran_atexit = tmp_path / "site", tmp_path / "atexit"
    site.mkdir()
    ran_atexit.mkdir()
    (site / "sitecustomize.py").write_text(
        "import atexit, os\n"
        "atexit.register(lambda: open(os.path.join(os.environ['ATEXIT_DIR'], str(os.getpid())), 'w'))\n"
    )
    path = os.pathsep.join(filter(None, (str(site), WARM_START_ENV.get("PYTHONPATH"))))
    marked = {"PYTHONPATH": path, "ATEXIT_DIR": str(ran_atexit)}
    own = subprocess.Popen(
        [sys.executable, "-m", "cockpit.train.warm_start", socket_path, "--pool", "1", "--pool-idle-exit", "2"],
        env=dict(WARM_START_ENV, PYTHONUNBUFFERED="1", **marked), stdin=subprocess.DEVNULL,
        stdout=open(tmp_path / "server.log", "wb"), stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: Path(socket_path).exists(), 120, "the server's socket")
        first = _start(tmp_path, socket_path, "0", HF_HOME=str(tmp_path / "a"), **marked)
        assert first is not None, warm_start.last_refusal
        assert first.wait(120) == 0
        pool_server = _seen(tmp_path / "out")["ppid"]
        assert _server_env(pool_server)["HF_HOME"] == str(tmp_path / "a")
        assert _start(tmp_path, socket_path, "0", HF_HOME=str(tmp_path / "b")) is None  # one pool server at most
        assert "HF_HOME" in (warm_start.last_refusal or "") and "the pool is full" in (warm_start.last_refusal or "")
        # unused for 2 s: it ends, its socket gone, and the pool has room again
        wait_for(lambda: not Path(f"{socket_path}.1").exists(), 60, "the idle pool server's end")
        wait_for(lambda: not Path(f"/proc/{pool_server}").exists(), 30, "the idle pool server reaped")
        second = _start(tmp_path, socket_path, "0", HF_HOME=str(tmp_path / "b"), **marked)
        assert second is not None, warm_start.last_refusal
        assert second.wait(120) == 0
        second_pool_server = _seen_last(tmp_path / "out")
        assert _server_env(second_pool_server)["HF_HOME"] == str(tmp_path / "b")
    finally:
        own.terminate()  # and its pool server with it
        own.wait(30)
    ran = {int(p.name) for p in ran_atexit.iterdir()}
    assert own.returncode == 128 + signal.SIGTERM, own.returncode
    assert first.pid in ran and second.pid in ran  # a warm child runs its atexit handlers (inherited): the marker works
    assert not ran & {own.pid, pool_server, second_pool_server}, (ran, own.pid, pool_server, second_pool_server)


def _seen_last(out: Path) -> int:
    lines = [line for line in out.read_text().splitlines() if line.startswith("{")]
    return int(json.loads(lines[-1])["ppid"])


def test_without_a_server_nothing_is_started_warm(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "COCKPIT_WARM_START"}
    assert warm_start.start([sys.executable, "-m", "warm_child", "0"], env, HERE, str(tmp_path / "out")) is None
    gone = dict(env, COCKPIT_WARM_START=str(tmp_path / "no-such.sock"))
    assert warm_start.start([sys.executable, "-m", "warm_child", "0"], gone, HERE, str(tmp_path / "out")) is None
    assert "no warm start server" in (warm_start.last_refusal or "")
    assert not (tmp_path / "out").exists()
