"""Issue 19's rough edges, each on the real screens (Pilot) or the pure parts they draw from:
Runs columns that follow their values, the Summary's after column at 80x24, the fit line on a CPU
run, the readable log pane, the notice when the followed run ends, short run names, Setup's tab
keys, the bearings line, ``?``, and NO_COLOR / 16 colours."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from tests.test_ui_pilot import runs_listed, text_of, wait_for, wait_for_form

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "ui_run"
RUN_ID = "20261130-094516-cpu-demo-tiny-de8f"
DOCTOR = json.loads((FIXTURES / "doctor.json").read_text(encoding="utf-8"))


def cpu_box(**over):
    from cockpit.ui.widgets import Machine

    return Machine(**{"host": "cpu-box", "gpus": 0, "gpu_kind": "", "gpu_memory_gb": None, "ram_gb": 24.0, **over})


def make_app(runs: Path, **kw):
    from cockpit.ui.app import CockpitApp

    kw.setdefault("machine", cpu_box())
    return CockpitApp(runs, start=kw.pop("start", "runs"), doctor_checks=DOCTOR, runs_refresh_s=3600, **kw)


def screen_text(app) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


def copy_run(runs: Path, run_id: str = RUN_ID) -> Path:
    dst = runs / run_id
    shutil.copytree(FIXTURES / run_id, dst)
    return dst


def append_text(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)


def running_at(runs: Path, step: int) -> tuple[Path, str]:
    """The recorded run copied into ``runs``, its event log cut after ``step`` and its status running
    (its supervisor on another node: the screens follow the log only); and the cut-off rest of the log."""
    run_dir = copy_run(runs)
    events = (run_dir / "events.jsonl").read_text().splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(events) if f'"step":{step},' in ln) + 1
    (run_dir / "events.jsonl").write_text("".join(events[:cut]))
    set_status(run_dir, state="running", step=step, ended=None, supervisor_host="node-b")
    return run_dir, "".join(events[cut:])


def set_status(run_dir: Path, **fields) -> None:
    st = json.loads((run_dir / "status.json").read_text())
    st.update(fields)
    (run_dir / "status.json").write_text(json.dumps(st))


def test_runs_screen_is_drawn_first_and_its_runs_are_read_after_by_a_worker(env, monkeypatch):
    """The Runs screen's first frame waits for no run: the listing (every status read, its liveness
    checked) is read by a worker, off the UI thread, and the table fills when it arrives."""
    import threading

    from cockpit.ui.screens import runs as runs_screen

    runs = env / "runs"
    copy_run(runs)
    gate, readers = threading.Event(), []
    read = runs_screen.read_listing

    def held_read(*args, **kw):
        readers.append(threading.current_thread() is threading.main_thread())
        gate.wait(10)  # a slow filesystem: the screen is up meanwhile
        return read(*args, **kw)

    monkeypatch.setattr(runs_screen, "read_listing", held_read)

    async def scenario():
        app = make_app(runs)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: readers, 5, "the listing to start")
            await pilot.pause(0.1)
            table = app.screen.query_one("#runs-table")
            before = (type(app.screen).__name__, table.row_count, app.screen.listed, "runs active" in screen_text(app))
            gate.set()
            await wait_for(pilot, lambda: runs_listed(app), 10, "the runs")
            return before, table.row_count, screen_text(app)

    before, rows, text = asyncio.run(scenario())
    assert readers == [False]  # read by a worker thread
    assert before == ("RunsScreen", 0, False, True)  # the screen drawn (the bearings line), no run yet
    assert rows == 1 and "cpu-demo-tiny-de8f" in text


# -- 2. Runs columns grow and shrink with their values; short names; the bearings line (6, 8) ------
def test_runs_columns_follow_their_values_and_names_are_short(env):
    runs = env / "runs"
    run_dir = copy_run(runs)
    set_status(run_dir, state="running", step=2, total_steps=27, ended=None, supervisor_host="node-b")

    async def scenario():
        app = make_app(runs)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause(0.3)
            scr = app.screen
            set_status(run_dir, state="finished", step=26, total_steps=27, ended=1796031949.0)
            scr.refresh_runs()
            await pilot.pause(0.3)
            text = screen_text(app)
            assert "✓ finished" in text and "26/27" in text, text
            # the run column is the id without its timestamp; started shows the time once
            assert "cpu-demo-tiny-de8f" in text and "20261130-094516" not in text
            assert "11-30 09:45" in text
            table = scr.query_one("#runs-table")
            wide = table.columns["state"].content_width
            set_status(run_dir, state="failed", step=3, total_steps=27)
            scr.refresh_runs()
            await pilot.pause(0.3)
            assert table.columns["state"].content_width < wide  # "✗ failed" is shorter than "✓ finished"
            assert "✗ failed" in screen_text(app)
            # bearings: host, GPUs found, active runs, the runs dir
            bearings = str(scr.query_one("#bearings").render())
            assert "cpu-box" in bearings and "no GPU: CPU runs" in bearings
            # the runs dir, cut from the left where the line is short of room (issue 29: no dangling ·)
            assert bearings.endswith(str(runs)) or (bearings.split(" · ")[-1].startswith("…") and str(runs).endswith(bearings.split(" · ")[-1][1:]))
            assert "0/1 runs active" in bearings

    asyncio.run(scenario())


def test_bearings_count_active_runs_and_gpus():
    from cockpit.ui.widgets import bearings

    line = bearings(cpu_box(gpus=8, gpu_kind="AMD", gpu_memory_gb=192.0), Path("/runs"), 2, 5).plain
    assert line == "cockpit · cpu-box · 8× AMD GPU 192 GiB · 2/5 runs active · /runs"


# -- 2. the Summary's probe table shows the after column at 80x24 -------------------------------
def test_summary_probe_table_shows_after_at_80x24(env):
    async def scenario():
        app = make_app(FIXTURES)
        async with app.run_test(size=(80, 24)) as pilot:
            from cockpit.store.rundir import RunDir

            app.open_summary(RunDir(FIXTURES / RUN_ID))
            await wait_for(pilot, lambda: type(app.screen).__name__ == "SummaryScreen"
                           and any(t.row_count > 1 for t in app.screen.query("#probes")), 10, "the probes")
            await pilot.pause(0.5)
            table = app.screen.query_one("#probes")
            used = sum(c.get_render_width(table) for c in table.columns.values())
            assert used <= table.size.width, (used, table.size.width)
            text = screen_text(app)
            assert "after" in text and "✓ I Kestrel" in text  # an after answer, on screen

    asyncio.run(scenario())


# -- 3. the fit line compares a CPU run with the host's RAM and says so ----------------------------
def test_fit_line_on_cpu_uses_host_ram_and_names_the_source():
    from cockpit.ui.forms import FormModel, fit_line

    m = FormModel()
    m.values.update(dataset="cockpit_identity", device="cpu")
    checked = m.check()
    assert checked.ok, checked.problems
    line = fit_line(checked.cfg, cpu_box(), m.gpu_memory())
    assert "on 24 GiB of host RAM (a CPU run)" in line and "64" not in line, line
    # a GPU run: the detected GPUs, unless the field says otherwise
    m.values["device"] = "gpu"
    gpu = cpu_box(gpus=8, gpu_kind="AMD", gpu_memory_gb=192.0)
    cfg = m.check().cfg
    assert "on 192 GiB of the 8 GPU(s) of this machine" in fit_line(cfg, gpu, m.gpu_memory())
    m.values["gpu_memory_gb"] = "64"
    assert "on 64 GiB of the GPU memory field" in fit_line(cfg, gpu, m.gpu_memory())


# -- 4. the log pane: step lines, warnings folded and counted, the raw log one key away ------------
def test_readable_log_folds_warnings_and_hides_metric_dicts():
    from cockpit.store.rundir import RunDir
    from cockpit.ui.logtail import LogTail, ReadableLog
    from cockpit.ui.state import RunFollower

    f = RunFollower(RunDir(FIXTURES / RUN_ID))
    f.poll()
    log = ReadableLog()
    raw = LogTail(FIXTURES / RUN_ID / "logs").read_new()
    log.add(raw, f.state.log_seq)
    lines = log.view(list(f.state.recent), rows=12)
    assert lines[-1].startswith("⚠ 2 warning(s) folded")
    assert any(ln.startswith("step 40/40") for ln in lines), lines
    assert not any("{'loss'" in ln or "FutureWarning" in ln for ln in lines)
    assert "[rank0] probes after training" in lines  # what the rank says, after the steps
    expanded = log.view(list(f.state.recent), rows=12, expanded=True)
    assert any("FutureWarning" in ln for ln in expanded) and "w: fold them" in expanded[-1]


def test_live_log_pane_is_readable_w_expands_l_is_raw(env):
    async def scenario():
        from cockpit.store.rundir import RunDir

        app = make_app(FIXTURES, follow=False)
        async with app.run_test(size=(100, 40)) as pilot:
            app.open_live(RunDir(FIXTURES / RUN_ID))
            live = None
            await wait_for(pilot, lambda: type(app.screen).__name__ == "LiveScreen" and app.screen.replay_progress is None, 10, "live")
            live = app.screen
            await wait_for(pilot, lambda: "folded" in str(live.query_one("#log").render()), 5, "the log pane")
            pane = str(live.query_one("#log").render())
            assert "step 40/40" in pane and "{'loss'" not in pane and "FutureWarning" not in pane
            await pilot.press("w")
            await pilot.pause(0.2)
            assert "FutureWarning" in str(live.query_one("#log").render())
            await pilot.press("l")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "LogView", 5, "the raw log")
            await pilot.pause(0.5)
            assert "{'loss'" in screen_text(app)

    asyncio.run(scenario())


# -- 5. a run that ends while followed: the header says so (no toast over the log: issue 29), Enter opens its Summary
def test_followed_run_that_finishes_says_so_and_enter_opens_summary(env):
    runs = env / "runs"
    run_dir, rest = running_at(runs, 20)

    async def scenario():
        from cockpit.store.rundir import RunDir

        app = make_app(runs, poll_s=0.1)
        async with app.run_test(size=(100, 30)) as pilot:
            app.open_live(RunDir(run_dir))
            await wait_for(pilot, lambda: type(app.screen).__name__ == "LiveScreen" and app.screen.state.step == 20, 10, "step 20")
            live = app.screen
            assert not live.check_action("summary", ())  # no Summary key while it runs
            append_text(run_dir / "events.jsonl", rest)
            set_status(run_dir, state="finished", step=40)
            await wait_for(pilot, lambda: "Enter: its Summary" in text_of(app, "#live-title"), 10, "the header's notice")
            assert not app._notifications  # nothing covers the log, nothing stays over the Summary
            assert live.check_action("summary", ())
            await pilot.press("enter")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "SummaryScreen", 5, "the summary")

    asyncio.run(scenario())


# -- 7. Setup's tab keys: in the footer, and Tab reaches the tab bar ------------------------------
def test_setup_tab_keys_are_in_the_footer_and_tab_reaches_the_tab_bar(env):
    async def scenario():
        app = make_app(env / "runs", start="setup", start_preset=Path("presets") / "cpu-demo.yaml")
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for_form(pilot)  # the footer is there from the first frame, the tabs with the form
            await pilot.pause(0.2)
            keys = {k.key: k for k in app.screen.query("FooterKey")}
            for key in ("ctrl+left", "ctrl+right"):  # in the footer, on screen at 80 columns
                assert key in keys and keys[key].region.width and keys[key].region.right <= 80, key
            tabs = app.screen.query_one("#setup-tabs")
            first = tabs.active
            await pilot.press("ctrl+right")
            assert tabs.active != first
            app.screen.query_one("#preset").focus()
            await pilot.press("tab")
            assert type(app.focused).__name__ == "ContentTabs"
            await pilot.press("right")
            await pilot.pause(0.1)
            assert tabs.active not in (first,)

    asyncio.run(scenario())


# -- ? : the keys of the current screen -----------------------------------------------------------
def test_question_mark_lists_the_current_screens_keys(env):
    async def scenario():
        from cockpit.store.rundir import RunDir

        app = make_app(FIXTURES, follow=False)
        async with app.run_test(size=(100, 40)) as pilot:
            app.open_live(RunDir(FIXTURES / RUN_ID))
            await wait_for(pilot, lambda: type(app.screen).__name__ == "LiveScreen", 10, "live")
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "KeysView", 5, "the keys")
            text = screen_text(app)
            for expected in ("Stop", "Save ckpt", "Raw log", "Warnings", "Quit (runs keep going)"):
                assert expected in text, expected
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "LiveScreen", 5, "closed")

    asyncio.run(scenario())


# -- NO_COLOR and 16 colours: states and verdicts are words and symbols ----------------------------
def _colours(app) -> set:
    out = set()
    for strip in app.screen._compositor.render_strips():
        for seg in strip:
            for c in (seg.style.color, seg.style.bgcolor) if seg.style else ():
                if c is not None and not c.is_default:
                    out.add(c)
    return out


def test_no_color_draws_in_greys_and_keeps_states_as_words(env, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")

    async def scenario():
        app = make_app(FIXTURES)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause(0.3)
            assert app.no_color
            triplets = [c.get_truecolor() for c in _colours(app)]
            assert triplets and all(t.red == t.green == t.blue for t in triplets), triplets
            text = screen_text(app)
            assert "✓ finished" in text  # the state says itself without colour

    asyncio.run(scenario())


def test_sixteen_colour_theme_uses_only_the_terminals_palette(env):
    from rich.color import ColorType

    async def scenario():
        app = make_app(FIXTURES)
        app.theme = "ansi-dark"
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause(0.3)
            kinds = {c.type for c in _colours(app)}
            assert kinds <= {ColorType.STANDARD, ColorType.DEFAULT}, kinds
            assert "✓ finished" in screen_text(app)

    asyncio.run(scenario())


# -- the demo's probe sets: identity (to learn) and control (not to forget), counted apart ----------
def test_probe_sets_are_loaded_counted_and_shown(tmp_path):
    from cockpit.errors import InputError
    from cockpit.store.rundir import RunDir
    from cockpit.train.probes import load_probes, probe_summary, score
    from cockpit.ui.screens.summary import summary_text

    probes = load_probes(ROOT / "cockpit" / "demo_data" / "demo_probes.jsonl")
    sets = [p.get("set") for p in probes]
    assert sets.count("identity") == 10 and sets.count("control") >= 8
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "hi", "expect": "x", "set": ""}\n')
    with pytest.raises(InputError, match="'set' must be a non-empty string"):
        load_probes(bad)
    results = [{"ok": i < 3, "set": "identity"} for i in range(10)] + [{"ok": i != 0, "set": "control"} for i in range(10)]
    counts = probe_summary({**score(results), "results": results})
    assert counts == {"passed": 12, "total": 20, "rate": 0.6, "sets": {
        "identity": {"passed": 3, "total": 10, "rate": 0.3}, "control": {"passed": 9, "total": 10, "rate": 0.9}}}
    before = {"passed": 10, "total": 20, "rate": 0.5, "sets": {"identity": {"passed": 0, "total": 10, "rate": 0.0},
                                                              "control": {"passed": 10, "total": 10, "rate": 1.0}}}
    text = summary_text(RunDir(tmp_path), {"state": "finished", "probes_before": before, "probes_after": counts}, {}).plain
    assert "probes identity: 0/10 (0%) before → 3/10 (30%) after  ✓ learned" in text
    assert "probes control: 10/10 (100%) before → 9/10 (90%) after  ✗ forgot some" in text


def test_a_refresh_timer_firing_while_the_app_tears_down_is_harmless(env):
    """CI once failed here: Runs' refresh timer fired after the app had emptied its screen stack, and
    ``app.screen`` raised ScreenStackError. A tick then must do nothing."""
    from cockpit.ui.screens.runs import RunsScreen

    runs = env / "runs"
    copy_run(runs)
    app = make_app(runs)

    async def drive():
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, RunsScreen)
        return screen

    from textual._context import active_app

    screen = asyncio.run(drive())
    assert not app._screen_stack  # the torn-down state the timer met
    active_app.set(app)  # as in the timer's own task
    screen._tick()  # raised ScreenStackError before `on_top`
