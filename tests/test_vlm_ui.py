"""A vision-language run where a user looks (issue 63): the Summary's image probes (the image's file name and
size beside the prompt, answers before → after, ``i`` opens the image: in the browser under ``cockpit web``), the
Setup form on a VLM, the chat screen's image field and the chat worker's images (Qwen2-VL, no training).

The run dir is the recorded cpu-demo run (tests/fixtures/ui_run) with its probe_results events replaced by
image probes' results as the rank writes them: the probes file read by ``load_probes`` (which adds the image
fields), each answer scored by ``passes`` / ``score`` and encoded as an event by the event writer's ``encode``."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

from cockpit.store.rundir import RunDir
from tests.test_ui_rough_edges import copy_run, make_app, screen_text, wait_for
from tests.test_vlm_setup_sizes import meta_parts


def image_probe_run(tmp_path: Path) -> Path:
    """The recorded run with two image probes and a text probe, answered before and after."""
    from cockpit.data.probes import load_probes, passes, score
    from cockpit.store.events import encode

    (tmp_path / "img").mkdir()
    Image.new("RGB", (40, 30), (220, 30, 30)).save(tmp_path / "img" / "red.png")
    Image.new("RGB", (20, 50), (30, 30, 220)).save(tmp_path / "img" / "blue.png")
    rows = [{"prompt": "<image>What colour is it?", "expect": ["red"], "image": "img/red.png", "set": "images"},
            {"prompt": "<image>What colour is it?", "expect": ["blue"], "image": "img/blue.png", "set": "images"},
            {"prompt": "Who are you?", "expect": ["Kestrel"], "set": "control"}]  # fmt: skip
    (tmp_path / "probes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    probes = load_probes(tmp_path / "probes.jsonl")
    answers = {"before": ["green", "green", "I am Kestrel"], "after": ["red", "blue", "I am Kestrel"]}
    run = copy_run(tmp_path / "runs")
    lines = []
    for line in (run / "events.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev["kind"] == "probe_results":
            results = [{"prompt": p["prompt"], "expect": p["expect"], "answer": a, "ok": passes(a, p["expect"]),
                        **{k: v for k, v in p.items() if k not in ("prompt", "expect")}}
                       for p, a in zip(probes, answers[ev["phase"]])]  # fmt: skip
            line = encode("probe_results", phase=ev["phase"], **score(results), results=results).rstrip("\n")
        lines.append(line)
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_the_summary_names_each_probe_image_beside_its_answers(tmp_path, monkeypatch):
    from cockpit.ui.screens.summary import probe_detail

    run = image_probe_run(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))

    async def scenario():
        app = make_app(run.parent)
        async with app.run_test(size=(160, 40)) as pilot:
            app.open_summary(RunDir(run))
            try:
                await wait_for(pilot, lambda: "[blue.png 20×50]" in screen_text(app), 20, "the image probes' rows")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; the screen:\n{screen_text(app)}") from None
            text = screen_text(app)
            assert "[red.png 40×30] What colour" in text, text
            assert "✗ green" in text and "✓ red" in text and "✓ blue" in text, text
            table = app.screen.query_one("#probes")
            assert not app.screen.check_action("image", ())  # the cursor on the set's row: no image
            table.focus()
            await pilot.press("down")  # the red image's row
            await wait_for(pilot, lambda: app.screen.check_action("image", ()), 10, "Image on the image probe's row")
            await pilot.press("i")
            await wait_for(pilot, lambda: "(cockpit web opens it in the browser)" in screen_text(app), 10, "the image")
            assert f"red.png: {tmp_path / 'img' / 'red.png'}" in screen_text(app)
            await pilot.press("down", "down", "down")  # the text probe's row: no image
            await wait_for(pilot, lambda: not app.screen.check_action("image", ()), 10, "no Image on a text probe")

    asyncio.run(scenario())
    results = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    after = next(e for e in results if e["kind"] == "probe_results" and e["phase"] == "after")["results"]
    detail = probe_detail([("after", after[1])]).plain
    assert f"blue.png 20×50  {tmp_path / 'img' / 'blue.png'}" in detail, detail


@pytest.mark.slow  # 12 s: the web server, a cockpit tab started cold, the Summary
def test_cockpit_web_opens_a_probe_image_in_the_browser(tmp_path):
    """`cockpit web`: on the Summary, ``i`` on an image probe's row sends the image to the page (Textual's
    deliver_binary, served by textual-serve): the page is told a download key, and /download/KEY answers
    the PNG itself, inline (the browser opens it in a new tab). A websocket client speaks to the server as
    the page does (tests/test_web.py's pattern): keys as ``stdin`` frames, the tab's output as binary frames."""
    import aiohttp

    from tests.test_web import free_port, stop, tab_until, wait_port

    run = image_probe_run(tmp_path)
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("cockpit")), "web", "--runs-dir", str(run.parent), "--port", str(port)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip

    async def drive() -> tuple[str, bytes, str]:
        got = bytearray()
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}"
            async with http.ws_connect(f"{url}/ws?width=160&height=40", max_msg_size=0) as ws:
                await tab_until(ws, got, [b"cpu-demo-tiny"], timeout_s=90)  # Runs: the one run
                await ws.send_str(json.dumps(["stdin", "\r"]))  # open it: its Summary
                await tab_until(ws, got, [b"red.png 40"], timeout_s=30)
                await ws.send_str(json.dumps(["stdin", "\x1b[B"]))  # the red image's row
                await asyncio.sleep(0.5)
                await ws.send_str(json.dumps(["stdin", "i"]))
                end = time.time() + 30
                while True:
                    msg = await asyncio.wait_for(ws.receive(), max(0.1, end - time.time()))
                    if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data)[0] == "deliver_file_start":
                        key = json.loads(msg.data)[1]
                        break
                async with http.get(f"{url}/download/{key}") as resp:
                    return resp.headers["Content-Type"], await resp.read(), resp.headers["Content-Disposition"]

    try:
        wait_port(port, server)
        kind, body, disposition = asyncio.run(drive())
    except (AssertionError, TimeoutError) as exc:
        stop(server)
        raise AssertionError(f"{exc!r}\n`cockpit web` said:\n{server.stdout.read() if server.stdout else ''}") from None
    finally:
        stop(server)
    assert kind == "image/png" and disposition.startswith("inline") and "red.png" in disposition, (kind, disposition)
    assert body == (tmp_path / "img" / "red.png").read_bytes()


def test_setup_knows_a_vision_language_model(tiny_llava_dir, tiny_qwen2_5_vl_dir, tiny_model_dir, tmp_path, monkeypatch):
    """The Setup form on the tiny LLaVA folder: under the model, that it is a VLM with its tower / projector /
    language model sizes (as the meta-device model has them) and its template; the image keys shown with
    LLaMA-Factory's defaults (hidden for a text model); the fit line's planner (torch-free) counts the tower.
    On a Qwen2.5-VL folder: its own tower and merger's sizes (tests/test_vlm_setup_sizes.py: every family's)."""
    import torch
    from textual.widgets import Input
    from transformers import AutoConfig, AutoModelForImageTextToText

    from cockpit.plan import plan
    from cockpit.ui import forms
    from cockpit.ui.app import CockpitApp
    from tests.test_ui_pilot import text_of, wait_for_form

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(tiny_llava_dir))
    total = sum(p.numel() for p in model.parameters())
    tower = sum(p.numel() for n, p in model.named_parameters() if "vision_tower" in n)
    assert forms.vlm_note(str(tiny_llava_dir), "llava") == (
        f"vision-language model (llava): vision tower {tower / 1e6:.2f}M + projector 0.01M + language model "
        f"{(total - tower - 8320) / 1e6:.2f}M; template llava; image keys below"
    ), forms.vlm_note(str(tiny_llava_dir), "llava")
    assert "template: set one (LLaMA-Factory's for it: llava)" in forms.vlm_note(str(tiny_llava_dir), "")
    assert forms.vlm_note(str(tiny_model_dir), "chatml") == ""
    raw = {"model_name_or_path": str(tiny_llava_dir), "template": "llava", "dataset": "x", "use_cpu": True}
    assert plan(raw, use_meta=False).estimate.params["total"] == total  # the UI's planner: tower and projector in
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("COCKPIT_RUNS_DIR", str(tmp_path / "runs"))

    async def scenario() -> None:
        app = CockpitApp(start="setup", doctor_checks=[])
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for_form(pilot)
            scr = app.screen
            shown = lambda: {f for f in forms.VLM_FIELDS if scr.query_one(f"#row-{f}").display}  # noqa: E731
            assert shown() == set()  # the preset's text model
            scr.query_one("#f-model_name_or_path", Input).value = str(tiny_llava_dir)
            await wait_for(pilot, lambda: "vision-language model (llava)" in text_of(app, "#model-kind"), 10, "VLM")
            assert shown() == set(forms.VLM_FIELDS)
            assert scr.query_one("#f-freeze_vision_tower").value and not scr.query_one("#f-train_mm_proj_only").value
            assert scr.query_one("#f-image_max_pixels", Input).placeholder == str(768 * 768)
            scr.query_one("#f-model_name_or_path", Input).value = str(tiny_model_dir)
            await wait_for(pilot, lambda: not shown(), 10, "the image keys hidden for a text model")
            scr.query_one("#f-model_name_or_path", Input).value = str(tiny_qwen2_5_vl_dir)
            await wait_for(pilot, lambda: qwen_line in text_of(app, "#model-kind"), 10, qwen_line)
            assert shown() == set(forms.VLM_FIELDS)

    qwen = meta_parts(tiny_qwen2_5_vl_dir)
    qwen_line = (
        f"vision-language model (qwen2_5_vl): vision tower {qwen['vision'] / 1e6:.2f}M + projector "
        f"{qwen['projector'] / 1e6:.2f}M + language model {(qwen['total'] - qwen['vision'] - qwen['projector']) / 1e6:.2f}M"
    )
    asyncio.run(scenario())


def test_the_chat_screen_sends_an_image_with_each_prompt(tmp_path):
    """The TUI's chat on a vision-language run (the worker's ready says reads_images): an image field is shown;
    its path goes with each prompt as the request's ``images`` (absolute), the pane names the image; a path
    that is no file is said and nothing is sent. A text run's chat has no image field."""
    import queue

    from textual.widgets import Input

    from cockpit.ui.app import CockpitApp
    from cockpit.ui.screens.chat import ChatScreen
    from tests.test_ui_chat import RECORDED, ReplayChat

    run = image_probe_run(tmp_path)
    (tmp_path / "adapter").mkdir()  # the run's saved adapter (the chat reads the run's probes, not its weights)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "adapter_dir": str(tmp_path / "adapter")}))
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(re.sub(r"(?m)^probes: .*$", f"probes: {tmp_path / 'probes.jsonl'}", config))

    async def chat_on(ready: dict) -> None:
        fake = ReplayChat()
        fake.q = queue.Queue()
        fake.q.put(ready)
        app = CockpitApp(tmp_path / "runs", start="runs", follow=False)
        async with app.run_test(size=(120, 40)) as pilot:
            app.push_screen(ChatScreen(RunDir(run), start=lambda run, url: fake))
            await wait_for(pilot, lambda: getattr(app.screen, "ready", None), 10, "ready")
            chat, image = app.screen, app.screen.query_one("#chat-image", Input)
            if not ready.get("reads_images"):
                assert not image.display
                return
            assert image.display and "an image's path below goes with each prompt" in chat.status
            image.value = str(tmp_path / "img" / "nothere.png")
            chat.query_one("#chat-input", Input).value = "What colour?"
            await pilot.press("enter")
            assert fake.sent == [] and f"no such image file: {tmp_path / 'img' / 'nothere.png'}" in chat.status
            image.value = str(tmp_path / "img" / ".." / "img" / "red.png")  # made absolute and plain
            await pilot.press("enter")
            await wait_for(pilot, lambda: chat.turns and all(t.done for t in chat.turns.values()), 10, "the answer")
            assert fake.sent == [{"id": 1, "prompt": "What colour?", "images": [str(tmp_path / "img" / "red.png")]}]
            assert "[red.png] What colour?" in chat.pane_text("tuned").plain
            image.value = ""
            await pilot.press("f5")  # the run's probes: an image probe goes with its own image, a text probe without
            await wait_for(pilot, lambda: len(fake.sent) == 4, 10, "the probes sent")
            assert [r.get("images") for r in fake.sent[1:]] == [
                [str(tmp_path / "img" / "red.png")],
                [str(tmp_path / "img" / "blue.png")],
                None,
            ]

    asyncio.run(chat_on({**RECORDED["ready"], "model_type": "llava", "reads_images": True}))
    asyncio.run(chat_on({**RECORDED["ready"], "model_type": "llama", "reads_images": False}))


def test_the_chat_worker_reads_images_as_the_runs_rows_were_rendered(tiny_qwen2_vl_dir, tmp_path):
    """The chat worker on a Qwen2-VL run (finetuning_type full: the saved model is the base folder here, no
    training): each image becomes the template plugin's image tokens by its size, as prepare renders a row
    (two sizes, two counts), with ``pixel_values`` and ``image_grid_thw`` from the image processor; the
    model answers (greedy, 2 tokens) and the image reaches it (two images, two logits)."""
    import torch
    import yaml

    from cockpit.data import mm_plugins
    from cockpit.serve.artifacts import load_run
    from cockpit.serve.chat_worker import Generator, with_images
    from cockpit.store.rundir import atomic_write_json, create_run_dir

    (tmp_path / "img").mkdir()
    Image.new("RGB", (56, 84), (220, 30, 30)).save(tmp_path / "img" / "tall.png")
    Image.new("RGB", (28, 28), (30, 30, 220)).save(tmp_path / "img" / "small.png")
    run = create_run_dir(tmp_path / "runs", "qwen-chat")
    run.config_path.write_text(yaml.safe_dump({"model_name_or_path": str(tiny_qwen2_vl_dir), "template": "qwen2_vl",
                                               "finetuning_type": "full", "use_cpu": True}))  # fmt: skip
    atomic_write_json(run.summary_path, {"state": "finished", "steps": 1, "adapter_dir": str(tiny_qwen2_vl_dir)})
    gen = Generator(load_run(run))
    asked = with_images(gen, [{"role": "user", "content": "What colour?"}], [str(tmp_path / "img" / "tall.png")])
    assert asked == [{"role": "user", "content": "<image>What colour?"}]
    plugin = mm_plugins.PLUGINS["qwen2_vl"]
    logits, counts = [], []
    for name, size in (("tall.png", (56, 84)), ("small.png", (28, 28))):
        path = str(tmp_path / "img" / name)
        inputs = gen.inputs(asked, [path])
        counts.append(int((inputs["input_ids"] == gen.image_token_id).sum()))
        assert counts[-1] == mm_plugins.image_tokens(plugin, gen.facts, size) and "image_grid_thw" in inputs
        with torch.no_grad():
            logits.append(gen.model(**inputs).logits[0, -1])
    assert counts[0] > counts[1] and not torch.allclose(logits[0], logits[1]), counts
    text, ids, cancelled, cut = gen.generate("tuned", asked, 2, 0.0, threading.Event(), lambda d: None,
                                             [str(tmp_path / "img" / "tall.png")])  # fmt: skip
    assert not cancelled and len(ids) <= 2 and (cut or len(ids) < 2)  # generated to its end or to the limit


def _lora_run(runs: Path, model_dir: Path, probes: Path) -> Path:
    """A finished Qwen2-VL LoRA run made directly (no training): a PEFT adapter on the language model's q/v
    projections with random weights (not the zero-B init: base and tuned differ), the run's probes file."""
    import torch
    import yaml
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from cockpit.store.rundir import atomic_write_json, create_run_dir

    run = create_run_dir(runs, "qwen-probes")
    run.config_path.write_text(yaml.safe_dump({"model_name_or_path": str(model_dir), "template": "qwen2_vl",
                                               "finetuning_type": "lora", "lora_rank": 4, "probes": str(probes),
                                               "probe_max_new_tokens": 2, "use_cpu": True}))  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=r".*language_model.*\.(q_proj|v_proj)", init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(str(run.path / "adapter"))
    atomic_write_json(run.status_path, {"state": "finished", "step": 1, "total_steps": 1})
    atomic_write_json(run.summary_path, {"state": "finished", "steps": 1, "adapter_dir": str(run.path / "adapter")})
    return run.path


@pytest.mark.slow  # a chat worker started twice (base + tuned Qwen2-VL each time)
def test_cockpit_chat_asks_image_probes_with_their_images(tiny_qwen2_vl_dir, tmp_path, capsys):
    """`cockpit chat RUN --probes` on a finished Qwen2-VL LoRA run whose probes file has two image probes (the
    same prompt, images of two sizes: 6 and 1 image tokens) and a text probe: each image probe is asked with its
    own image on both sides (the prompt tokens differ by the image tokens' difference, base and tuned), the
    JSON names the image and its size, the text output names the image beside the prompt."""
    from cockpit.cli import main

    (tmp_path / "img").mkdir()
    Image.new("RGB", (56, 84), (220, 30, 30)).save(tmp_path / "img" / "red.png")
    Image.new("RGB", (28, 28), (30, 30, 220)).save(tmp_path / "img" / "blue.png")
    rows = [{"prompt": "<image>What colour is it?", "expect": ["red"], "image": "img/red.png"},
            {"prompt": "<image>What colour is it?", "expect": ["blue"], "image": "img/blue.png"},
            {"prompt": "Who are you?", "expect": ["Kestrel"]}]  # fmt: skip
    (tmp_path / "probes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = _lora_run(tmp_path / "runs", tiny_qwen2_vl_dir, tmp_path / "probes.jsonl")
    argv = ["chat", run.name, "--runs-dir", str(run.parent), "--probes", "--device", "cpu", "--max-new-tokens", "2"]
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    red, blue, text = json.loads(capsys.readouterr().out)["results"]
    assert (red["image"], red["image_size"], blue["image"], blue["image_size"]) == ("red.png", [56, 84], "blue.png", [28, 28])
    assert red["images"] == [str(tmp_path / "img" / "red.png")] and "image" not in text and "images" not in text
    for side in ("base", "tuned"):  # 6 image tokens for the 56x84 image, 1 for the 28x28 one: its own image each
        assert red[f"{side}_prompt_tokens"] - blue[f"{side}_prompt_tokens"] == 5, (red, blue)
        assert red[f"{side}_ok"] == ("red" in red[side].lower())  # each answer scored against its probe's expect
    assert red["base_token_ids"] != red["tuned_token_ids"] or text["base_token_ids"] != text["tuned_token_ids"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert ">>> [image red.png] <image>What colour is it?" in out and ">>> [image blue.png] <image>What colour" in out
    assert ">>> Who are you?" in out and "probes: base " in out and "/3, tuned " in out, out
