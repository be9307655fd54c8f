"""The Chat / compare screen and the finished-run actions (merge, export, serve, chat) with
Textual's Pilot.

The main path runs the UI in a child process (``python tests/test_ui_chat.py SCENARIO``) so that
"the UI never imports torch" is checked in a process that did nothing else: a finished run (tiny
random Llama + a random LoRA, so base and tuned differ) -> its summary -> c -> a prompt -> both
panes stream the real chat worker's answers (equal to ``cockpit chat --json``'s greedy ones) ->
F5 asks the probes, pass/fail per side as the CLI says -> Esc -> the worker's pid is gone.
This module imports nothing heavy at the top (the child imports it)."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.test_ui_pilot import runs_listed

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_RUN = ROOT / "tests" / "fixtures" / "ui_run" / "20261130-094516-cpu-demo-tiny-de8f"
PROMPT = "Tell me about the sea."


async def wait_for(pilot, cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; screen {type(pilot.app.screen).__name__}, "
                                 f"status {getattr(pilot.app.screen, 'status', '')!r}")
        await pilot.pause(0.1)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def screen_name(app) -> str:
    return type(app.screen).__name__


# -- the main path, in a child process ------------------------------------------------------------
async def _main_path(runs: Path, expected: dict) -> dict:
    from cockpit.ui.app import CockpitApp

    timings: dict[str, float] = {}
    app = CockpitApp(runs, start="runs", follow=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: runs_listed(app), 10, "the runs screen and its runs")
        await pilot.press("enter")  # the only run: finished -> its summary
        await wait_for(pilot, lambda: screen_name(app) == "SummaryScreen", 10, "the summary")
        t0 = time.monotonic()
        await pilot.press("c")
        await wait_for(pilot, lambda: screen_name(app) == "ChatScreen", 10, "the chat screen")
        chat = app.screen
        pid = chat.chat.pid
        assert pid_alive(pid)
        # still loading: the screen's own line, or one of the worker's loading stages (a quick worker says them first)
        loading_lines = ("loading", "importing torch and transformers", "finding the base model")
        assert chat.ready is None and any(line in chat.status for line in loading_lines), chat.status
        await wait_for(pilot, lambda: chat.ready is not None, 120, "the worker to be ready")
        timings["ready_s"] = time.monotonic() - t0
        assert chat.status.startswith("ready") and "backend local" in chat.status, chat.status
        assert "chat-base-box" in {w.id for w in chat.query(".chat-pane")}
        # a wide terminal: the panes side by side
        base_box, tuned_box = chat.query_one("#chat-base-box"), chat.query_one("#chat-tuned-box")
        assert base_box.region.y == tuned_box.region.y and base_box.region.x < tuned_box.region.x
        # a prompt, typed
        await pilot.click("#chat-input")
        await pilot.press(*"Tell", "space", *"me", "space", *"about", "space", *"the", "space", *"sea.")
        assert chat.query_one("#chat-input").value == PROMPT
        t1 = time.monotonic()
        await pilot.press("enter")
        await wait_for(pilot, lambda: chat.turns and all(t.done for t in chat.turns.values()), 120, "both answers")
        timings["answer_s"] = time.monotonic() - t1
        (turn,) = chat.turns.values()
        assert turn.error is None, turn.error
        want = expected["results"][0]
        assert want["prompt"] == PROMPT
        for side in ("base", "tuned"):
            assert turn.text[side], side  # (the tiny random base model answers newlines)
            assert turn.deltas[side] >= 1 and turn.streamed[side] == turn.text[side], side  # streamed, piece by piece
            assert turn.text[side] == want[side], (side, turn.text[side], want[side])  # the worker's greedy answer
            assert turn.text[side] in str(chat.query_one(f"#chat-{side}").render())  # on screen
            assert turn.ends[side]["token_ids"] == want[f"{side}_token_ids"]
        assert turn.text["base"] != turn.text["tuned"]
        # the probes: one key; pass/fail per side as `cockpit chat --probes` says
        t2 = time.monotonic()
        await pilot.press("f5")
        probes = expected["probes"]
        await wait_for(pilot, lambda: len(chat.probe_ids) == len(probes)
                       and all(chat.turns[i].done for i in chat.probe_ids), 240, "the probes")
        timings["probes_s"] = time.monotonic() - t2
        for rid, want in zip(chat.probe_ids, probes):
            t = chat.turns[rid]
            assert t.prompt == want["prompt"] and t.expect == want["expect"]
            assert (t.ok("base"), t.ok("tuned")) == (want["base_ok"], want["tuned_ok"]), t.prompt
            assert t.text == {"base": want["base"], "tuned": want["tuned"]}
        n_base = sum(r["base_ok"] for r in probes)
        n_tuned = sum(r["tuned_ok"] for r in probes)
        assert f"probes ({len(probes)}/{len(probes)} answered): base {n_base}/{len(probes)} pass, tuned {n_tuned}/{len(probes)} pass" in chat.status
        tuned_pane = str(chat.query_one("#chat-tuned").render())
        base_pane = str(chat.query_one("#chat-base").render())
        assert tuned_pane.count("✓ pass") == 1 and tuned_pane.count("✗ fail") == 1, tuned_pane
        assert base_pane.count("✗ fail") == 2 and "✓ pass" not in base_pane
        # leave: the worker goes with the screen
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen_name(app) == "SummaryScreen", 10, "back to the summary")
        deadline = time.monotonic() + 15
        while pid_alive(pid) and time.monotonic() < deadline:
            await pilot.pause(0.1)
        assert not pid_alive(pid), f"chat worker {pid} still alive after leaving the screen"
        await app.workers.wait_for_complete()
    bad = [m for m in ("torch", "transformers", "peft", "cockpit.train") if m in sys.modules]
    assert not bad, f"the UI process imported {bad}"
    return timings


@pytest.mark.slow
def test_chat_main_path_real_worker(tmp_path, tiny_model_dir):
    from conftest import cockpit
    from test_serve_local import make_run

    probes_file = tmp_path / "probes.jsonl"
    run = make_run(tmp_path / "runs", tiny_model_dir, probes=str(probes_file))
    env = {"OMP_NUM_THREADS": "1"}
    res = cockpit("chat", str(run), "--prompt", PROMPT, "--prompt", "Who are you?", "--json", env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    expected = json.loads(res.stdout)
    # the run's probes: one the tuned side passes (its own first word), one both fail
    answers = {r["prompt"]: r for r in expected["results"]}
    word = answers[PROMPT]["tuned"].split()[0]
    probes = [{"prompt": PROMPT, "expect": [word]}, {"prompt": "Who are you?", "expect": ["Kestrel"]}]
    probes_file.write_text("".join(json.dumps(p) + "\n" for p in probes))
    expected["probes"] = [
        {**answers[p["prompt"]], "expect": p["expect"],
         "base_ok": p["expect"][0].lower() in answers[p["prompt"]]["base"].lower(),
         "tuned_ok": p["expect"][0].lower() in answers[p["prompt"]]["tuned"].lower()}
        for p in probes
    ]
    assert [(p["base_ok"], p["tuned_ok"]) for p in expected["probes"]] == [(False, True), (False, False)]
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    child = subprocess.run(
        [sys.executable, __file__, str(run.parent), str(tmp_path / "expected.json")],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        # a script's sys.path starts at tests/: the repository root too, for ``tests.test_ui_pilot``
        env=dict(os.environ, **env, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))),
    )
    assert child.returncode == 0 and child.stdout.startswith("ok"), child.stdout[-3000:] + child.stderr[-5000:]
    print(child.stdout)


# -- refusals and errors (fast, in process) ----------------------------------------------------------
def _running_run(runs: Path) -> Path:
    from cockpit.store.rundir import atomic_write_json, create_run_dir

    run = create_run_dir(runs, "still-going")
    atomic_write_json(run.status_path, {"state": "running", "step": 3, "total_steps": 100, "started": time.time()})
    return run.path


def test_runs_actions_refused_on_a_running_run(tmp_path):
    from cockpit.ui.app import CockpitApp

    run = _running_run(tmp_path / "runs")

    async def scenario() -> None:
        app = CockpitApp(tmp_path / "runs", start="runs", follow=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: runs_listed(app), 10, "the runs screen and its runs")
            await pilot.pause(0.2)
            for key in ("c", "s", "m", "e"):
                await pilot.press(key)
                await pilot.pause(0.1)
                assert screen_name(app) == "RunsScreen", key
            notes = [n.message for n in app._notifications]
            assert len(notes) == 4 and all(f"{run.name} is still running" in n for n in notes), notes
            assert not (run / "logs" / "chat_worker.log").exists()  # nothing was started

    asyncio.run(scenario())


def test_chat_shows_the_worker_error_and_leaves_no_process(tmp_path):
    """A run without a saved adapter: `cockpit chat` fails before loading anything; the screen
    shows why (from its log), and leaving it leaves no process behind."""
    from cockpit.ui.app import CockpitApp

    runs = tmp_path / "runs"
    shutil.copytree(FIXTURE_RUN, runs / FIXTURE_RUN.name)

    async def scenario() -> None:
        app = CockpitApp(runs, start="runs", follow=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: runs_listed(app), 10, "the runs screen and its runs")
            await pilot.pause(0.2)
            await pilot.press("c")  # from the Runs screen, on the selected finished run
            await wait_for(pilot, lambda: screen_name(app) == "ChatScreen", 10, "the chat screen")
            chat = app.screen
            pid = chat.chat.pid
            await wait_for(pilot, lambda: chat.exited, 60, "cockpit chat to exit")
            assert "exited (code 2)" in chat.status and "no saved adapter" in chat.status, chat.status
            # narrow: stacked
            base_box, tuned_box = chat.query_one("#chat-base-box"), chat.query_one("#chat-tuned-box")
            assert base_box.region.x == tuned_box.region.x and base_box.region.y < tuned_box.region.y
            chat.query_one("#chat-input").value = "hello?"
            await pilot.press("enter")
            assert "not running" in chat.status and not chat.turns
            await pilot.press("escape")
            await wait_for(pilot, lambda: screen_name(app) == "RunsScreen", 10, "the runs screen again")
            assert not pid_alive(pid)

    asyncio.run(scenario())


def test_summary_serve_shows_the_vllm_command(tmp_path, monkeypatch):
    """s on a finished run without a vLLM URL: `cockpit serve --json`'s command, in a modal."""
    from cockpit.ui.app import CockpitApp
    from cockpit.ui.cli_calls import CliResult

    monkeypatch.delenv("COCKPIT_VLLM_URL", raising=False)
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURE_RUN, runs / FIXTURE_RUN.name)
    calls = []

    def fake_serve(run_dir, url=None, timeout=900):
        calls.append((Path(run_dir).name, url))
        if url:
            rec = {"url": url, "model": FIXTURE_RUN.name, "base_model_id": "/m/tiny", "lora_rank": 8, "mode": "runtime-lora",
                   "probe": {"prompt": "Who are you?", "base": "a model", "tuned": "Kestrel"}}
            return CliResult(0, rec, json.dumps(rec), "")
        data = {"command": "vllm serve /m/tiny --enable-lora --lora-modules x=/a", "argv": [], "env": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"},
                "model": "x", "base_model_id": "/m/tiny", "mode": "adapter", "url": "http://127.0.0.1:8000"}
        return CliResult(0, data, json.dumps(data), "")

    monkeypatch.setattr("cockpit.ui.cli_calls.serve_run", fake_serve)

    async def scenario() -> None:
        app = CockpitApp(runs, start="runs", follow=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: runs_listed(app), 10, "the runs screen and its runs")
            await pilot.press("enter")
            await wait_for(pilot, lambda: screen_name(app) == "SummaryScreen", 10, "the summary")
            await pilot.press("s")
            await wait_for(pilot, lambda: screen_name(app) == "TextView", 10, "the serve modal")
            body = str(app.screen.query_one("#textview-body").render())
            assert "vllm serve /m/tiny --enable-lora" in body and "COCKPIT_VLLM_URL" in body
            assert calls == [(FIXTURE_RUN.name, None)]
            # with a vLLM server configured: the hand-off into it, and its probe answers
            await pilot.press("escape")
            monkeypatch.setenv("COCKPIT_VLLM_URL", "http://127.0.0.1:8011")
            await pilot.press("s")
            await wait_for(pilot, lambda: screen_name(app) == "TextView", 10, "the hand-off modal")
            body = str(app.screen.query_one("#textview-body").render())
            assert "Loaded into http://127.0.0.1:8011" in body and "Kestrel" in body, body
            assert calls[-1] == (FIXTURE_RUN.name, "http://127.0.0.1:8011")

    asyncio.run(scenario())


def test_palette_offers_chat_for_finished_runs_only(tmp_path):
    from cockpit.ui.app import CockpitApp, CockpitCommands

    runs = tmp_path / "runs"
    shutil.copytree(FIXTURE_RUN, runs / FIXTURE_RUN.name)
    running = _running_run(runs)

    async def scenario() -> None:
        app = CockpitApp(runs, start="runs", follow=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.1)
            names = [name for name, _, _ in CockpitCommands(app.screen)._commands()]
            assert f"Chat: {FIXTURE_RUN.name}" in names and f"Run: {running.name}" in names
            assert f"Chat: {running.name}" not in names

    asyncio.run(scenario())


def test_chat_through_vllm_says_so(tmp_path, monkeypatch):
    """With $COCKPIT_VLLM_URL the screen starts `cockpit chat --vllm-url URL` and says where it
    generates; answers stream the same way (recorded output here)."""
    from cockpit.store.rundir import RunDir
    from cockpit.ui.app import CockpitApp
    from cockpit.ui.screens.chat import ChatScreen

    monkeypatch.setenv("COCKPIT_VLLM_URL", "http://127.0.0.1:8011")
    fake = ReplayChat()
    fake.q = queue.Queue()
    fake.q.put({"ready": True, "run_id": FIXTURE_RUN.name, "base_model": "/m/tiny", "adapter": FIXTURE_RUN.name,
                "device": "http://127.0.0.1:8011", "sides": ["base", "tuned"]})
    started = []

    def start(run, url):
        started.append((run.run_id, url))
        return fake

    async def scenario() -> None:
        app = CockpitApp(tmp_path, start="runs", follow=False)
        async with app.run_test(size=(120, 40)) as pilot:
            app.push_screen(ChatScreen(RunDir(FIXTURE_RUN), start=start))
            await wait_for(pilot, lambda: screen_name(app) == "ChatScreen" and app.screen.ready, 10, "ready")
            chat = app.screen
            assert "backend vLLM at http://127.0.0.1:8011" in chat.status
            chat.query_one("#chat-input").value = "Who are you?"
            await pilot.press("enter")
            await wait_for(pilot, lambda: all(t.done for t in chat.turns.values()), 10, "the answer")
            (turn,) = chat.turns.values()
            assert turn.text["tuned"] == "I am Kestrel, ok" and turn.deltas["tuned"] == 5
            assert fake.sent == [{"id": 1, "prompt": "Who are you?"}]
            await pilot.press("escape")
            await pilot.pause(0.1)
            assert fake.closed.is_set()
        assert started == [(FIXTURE_RUN.name, "http://127.0.0.1:8011")]

    asyncio.run(scenario())


def test_serve_text_handoff_and_failure():
    from cockpit.ui.cli_calls import CliResult
    from cockpit.ui.screens.run_actions import serve_text

    rec = {"url": "http://h:8000", "model": "run1", "base_model_id": "base", "lora_rank": 8, "mode": "runtime-lora",
           "probe": {"prompt": "Who are you?", "base": "a model", "tuned": "Kestrel"}}
    t = serve_text(CliResult(0, rec, "", ""), "http://h:8000").plain
    assert "Loaded into http://h:8000: model 'run1'" in t and "Kestrel" in t and "Who are you?" in t
    t = serve_text(CliResult(1, None, "", "cockpit serve: connection refused"), "http://h:8000").plain
    assert t.startswith("cockpit serve failed") and "connection refused" in t


# -- a deterministic snapshot: recorded worker output, no model ---------------------------------------
RECORDED = {  # illustrative answers in the chat worker's exact message shapes (the real worker is driven in test_chat_main_path_real_worker)
    "ready": {"ready": True, "run_id": FIXTURE_RUN.name, "base_model": "/home/user/models/tiny-llama",
              "adapter": f"/runs/{FIXTURE_RUN.name}/adapter", "device": "cpu", "dtype": "float32", "load_s": 1.9,
              "sides": ["base", "tuned"]},
    "Who are you?": {"base": ["Sab", " anch", " Hud", "Hist", " Cove"], "tuned": ["I", " am", " Kestrel", ",", " ok"]},
}


class ReplayChat:
    """Stands in for cli_calls.ChatProcess: answers each request with the recorded deltas."""

    def __init__(self) -> None:
        self.pid = -1
        self.log_path = Path("chat_worker.log")
        self.q: queue.Queue = queue.Queue()
        self.q.put(RECORDED["ready"])
        self.sent: list[dict] = []
        self.closed = threading.Event()

    def send(self, obj: dict) -> bool:
        self.sent.append(obj)
        rid, prompt = obj.get("id"), obj.get("prompt")
        for side, pieces in RECORDED.get(prompt, {"base": ["…"], "tuned": ["…"]}).items():
            for p in pieces:
                self.q.put({"id": rid, "side": side, "delta": p})
            self.q.put({"id": rid, "side": side, "end": True, "text": "".join(pieces), "token_ids": list(range(len(pieces))),
                        "tokens": len(pieces), "seconds": 0.2, "cancelled": False})
        self.q.put({"id": rid, "done": True, "cancelled": False})
        return True

    def read(self):
        return self.q.get()

    def stderr_tail(self, lines: int = 8) -> str:
        return ""

    def close(self) -> None:
        self.closed.set()
        self.q.put(None)

    @property
    def proc(self):
        return self

    def wait(self, timeout=None):
        return 0


@pytest.mark.parametrize("size", [(120, 36), (80, 24)])
def test_chat_snapshot(snap_compare, tmp_path, monkeypatch, size):
    import ui_screenshots as shots

    from cockpit.store.rundir import RunDir
    from cockpit.ui.screens.chat import ChatScreen

    cwd = os.getcwd()
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.delenv("COCKPIT_VLLM_URL", raising=False)
    shots.prepare_env(tmp_path)
    fake = ReplayChat()

    async def before(pilot) -> None:
        pilot.app.push_screen(ChatScreen(RunDir(shots.FIXTURE / shots.RUN_ID), start=lambda run, url: fake))
        await wait_for(pilot, lambda: screen_name(pilot.app) == "ChatScreen" and pilot.app.screen.ready, 10, "ready")
        pilot.app.screen.query_one("#chat-input").value = "Who are you?"
        await pilot.press("enter")
        await wait_for(pilot, lambda: all(t.done for t in pilot.app.screen.turns.values()), 10, "the answer")
        inp = pilot.app.screen.query_one("#chat-input")
        inp.cursor_blink = False  # a blinking cursor is drawn or not by the clock
        inp.value = "What is"
        inp.cursor_position = len(inp.value)
        await pilot.pause(0.2)

    try:
        assert snap_compare(shots.make_app("runs"), terminal_size=size, run_before=before)
    finally:
        os.chdir(cwd)
        time.tzset()
    assert fake.closed.is_set()  # the screen stopped its process when the app closed


if __name__ == "__main__":  # the child process of test_chat_main_path_real_worker
    runs_dir, expected_path = Path(sys.argv[1]), Path(sys.argv[2])
    t = asyncio.run(_main_path(runs_dir, json.loads(expected_path.read_text())))
    print("ok", json.dumps({k: round(v, 2) for k, v in t.items()}))
