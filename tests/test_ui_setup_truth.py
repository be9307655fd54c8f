"""Issue 62, item 3: Setup said "✓ config valid (the same checks as cockpit check)" where ``cockpit check``
refused: a YAML with a bad row opened with Ctrl+O (the tick beside F5's ``.jsonl:7`` problem), and the
``mi300x-lora-8b`` preset on a CPU box (the tick while check said "this config needs GPUs"). After Ctrl+O
the picker still named the previous preset, and the Data pane kept the previous file's report until F5.
Pilot on the real Setup screen; F5 runs the real ``cockpit check --json`` (a bad row: refused before any
tokenizer loads, within a second). Item 4's fit line for the preset is asserted beside (plan's 192 GiB). The
preset's refusal is every line ``cockpit check`` prints, the doctor's reasons and their fix included (the doctor's
answer for the config's needs: on this machine, as check asks it)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from test_ui_rough_edges import DOCTOR, env, make_app, screen_text  # noqa: F401 - env: a fixture

from tests.test_ui_pilot import text_of, wait_for, wait_for_form

ROOT = Path(__file__).resolve().parent.parent
TICK = "✓"


def bad_rows_yaml(folder: Path) -> Path:
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]} for i in range(9)]
    rows[6] = {"messages": [{"role": "user"}]}  # line 7: no content
    data = folder / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = folder / "mine.yaml"
    cfg.write_text(f"model_name_or_path: smollm2-135m-instruct\ndataset: {data}\ncutoff_len: 64\nuse_cpu: true\n")
    return cfg


def gpu_doctor_and_check(preset: Path) -> tuple[str, list[dict], list[str]]:
    """This machine's doctor for the preset's needs (its GPU checks: what ``cockpit doctor --json --needs``
    answers Setup) and what ``cockpit check`` refuses the preset for (its device gate, ``device_checks``)."""
    from cockpit.config import load_config
    from cockpit.doctor import run_checks
    from cockpit.doctor.relevance import GPU_CHECK_IDS, config_tags
    from cockpit.errors import InputError
    from cockpit.preflight.checks import device_checks

    cfg = load_config(str(preset))
    needs = sorted(config_tags(cfg.keys_only()))
    checks = [c.to_dict() for c in run_checks(needs=needs, only=GPU_CHECK_IDS)]
    with pytest.raises(InputError) as refused:
        device_checks(cfg)
    return ",".join(needs), checks, [str(p) for p in refused.value.problems]


def test_setup_shows_what_cockpit_check_says_and_the_file_it_came_from(env):
    from textual.widgets import Input, Select

    mine = bad_rows_yaml(env)
    gpu_preset = ROOT / "presets" / "mi300x-lora-8b.yaml"
    needs, doctor_for_needs, said = gpu_doctor_and_check(gpu_preset)
    assert len(said) == 4 and sum("doctor: " in p for p in said) == 2, said  # gate, 2 doctor lines with a fix, hint

    async def scenario():
        app = make_app(env / "runs", start="setup", start_preset=str(gpu_preset))
        app.doctor_checks = {"": DOCTOR, needs: doctor_for_needs}  # the doctor's answers without and with needs
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for_form(pilot)
            # the GPU preset on a box without GPUs: check's refusal, from the same gate, before any F5
            problems = text_of(app, "#problems")
            assert "this config needs GPUs (use_cpu: false)" in problems and TICK not in problems, problems
            # with the doctor's reasons (and their fix) once it answers for the config's needs: every line check says
            await wait_for(pilot, lambda: "doctor: " in text_of(app, "#problems"), 20, "the doctor's reasons")
            problems = text_of(app, "#problems")
            assert f"✗ {len(said)} problem(s)" in problems and all(p in problems for p in said), (problems, said)
            assert problems.index(said[1]) < problems.index(said[2]) < problems.index(said[3]), problems
            await wait_for(pilot, lambda: "GiB" in text_of(app, "#fit"), 20, "the fit line")
            assert "on 192 GiB of an MI300X" in text_of(app, "#fit"), text_of(app, "#fit")
            # Ctrl+O: a YAML of one's own with a bad row at line 7
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "OpenConfig", 5, "the open dialog")
            app.screen.query_one("#open-path", Input).value = str(mine)
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.screen.query_one("#f-cutoff_len", Input).value == "64", 10, "the YAML")
            picker = app.screen.query_one("#preset", Select)
            assert picker.value == str(mine.resolve()), picker.value
            await pilot.pause(0.2)
            assert "mine.yaml (opened" in screen_text(app) and "mi300x-lora-8b" not in screen_text(app)
            problems = text_of(app, "#problems")
            assert TICK not in problems and "F5" in problems, problems  # valid keys, check not run: no tick
            assert text_of(app, "#data-report").startswith("F5 runs"), text_of(app, "#data-report")
            await pilot.press("f5")
            await wait_for(pilot, lambda: "mine.jsonl:7" in text_of(app, "#problems"), 60, "check's answer in the pane")
            problems = text_of(app, "#problems")
            assert TICK not in problems and "✗ 1 problem(s)" in problems, problems
            assert "mine.jsonl:7" in text_of(app, "#data-report")
            # another file loaded: its form, and neither the report nor the verdict of the one before
            app.screen.load_preset(ROOT / "presets" / "cpu-demo.yaml")
            await pilot.pause(0.2)
            assert text_of(app, "#data-report").startswith("F5 runs"), text_of(app, "#data-report")
            assert "mine.jsonl" not in text_of(app, "#problems") and TICK not in text_of(app, "#problems")

    asyncio.run(scenario())
