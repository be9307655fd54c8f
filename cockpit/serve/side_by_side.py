"""Base vs tuned, the same prompt to both, streamed. Two backends with one event stream (the
chat worker's protocol, see ``cockpit.serve.chat_worker``):

- ``LocalBackend``: the chat worker subprocess (torch lives there, never here)
- ``VLLMBackend``: a vLLM server's OpenAI streaming API (base model id vs LoRA model name)

Events: {"side", "delta"} ... {"side", "end": true, "text", ...} ... {"done": true}; a failed
request yields {"error": ...}. No torch in this module.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from cockpit.serve.artifacts import RunArtifacts
from cockpit.serve.vllm import VLLMClient, VLLMError

SIDES = ("base", "tuned")


class LocalBackend:
    def __init__(
        self,
        art: RunArtifacts,
        device: str | None = None,
        max_new_tokens: int = 128,
        python: str | None = None,
        ready_timeout: float = 600,
        on_progress=None,
    ):
        """``on_progress``: called with each of the worker's ``progress`` events while it loads."""
        self.art = art
        argv = [
            python or sys.executable,
            "-P",  # the installed cockpit, whatever the working folder holds (a cockpit/ folder: the clone's parent)
            "-m",
            "cockpit.serve.chat_worker",
            str(art.run.path),
            "--max-new-tokens",
            str(max_new_tokens),
        ]
        if device:
            argv += ["--device", device]
        art.run.logs_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = art.run.logs_dir / "chat_worker.log"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )
        self.ready = self._read()
        while self.ready is not None and "progress" in self.ready:
            if on_progress:
                on_progress(self.ready)
            self.ready = self._read()
        if not self.ready or not self.ready.get("ready"):
            err = (self.ready or {}).get("error") or f"the chat worker exited (log: {self.log_path})"
            self.close()
            raise RuntimeError(err)
        self._next_id = 0

    def _read(self) -> dict[str, Any] | None:
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def ask(
        self,
        messages: list[dict[str, str]],
        max_new_tokens: int | None = None,
        temperature: float = 0.0,
        images: list[str] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """``images``: image paths for a vision-language model (the chat worker's ``images``)."""
        self._next_id += 1
        rid = self._next_id
        req: dict[str, Any] = {"id": rid, "messages": messages, "temperature": temperature}
        if images:
            req["images"] = [str(p) for p in images]
        if max_new_tokens:
            req["max_new_tokens"] = max_new_tokens
        self.proc.stdin.write(json.dumps(req, ensure_ascii=False) + "\n")
        self.proc.stdin.flush()
        while True:
            ev = self._read()
            if ev is None:
                yield {"id": rid, "error": f"the chat worker exited (log: {self.log_path})"}
                return
            yield ev
            if ev.get("id") == rid and (ev.get("done") or "error" in ev):
                return

    def close(self) -> None:
        try:
            if self.proc.stdin and not self.proc.stdin.closed:
                self.proc.stdin.write('{"quit": true}\n')
                self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


class VLLMBackend:
    def __init__(self, art: RunArtifacts, client: VLLMClient, tuned: str, base: str, max_new_tokens: int = 128):
        self.art, self.client, self.max_new_tokens = art, client, max_new_tokens
        self.models = {"base": base, "tuned": tuned}
        self.template = art.chat_template_text()
        self.ready = {
            "ready": True,
            "run_id": art.run_id,
            "base_model": base,
            "adapter": tuned,
            "device": client.url,
            "sides": list(SIDES),
        }

    def ask(
        self,
        messages: list[dict[str, str]],
        max_new_tokens: int | None = None,
        temperature: float = 0.0,
        images: list[str] | None = None,
    ) -> Iterator[dict[str, Any]]:
        if images:
            yield {"error": "images on a vLLM server: not built yet (chat without --vllm-url: the local worker)"}
            return
        n = max_new_tokens or self.max_new_tokens
        for side in SIDES:
            t0 = time.perf_counter()
            text = []
            try:
                for piece in self.client.chat_stream(self.models[side], messages, n, temperature, self.template):
                    text.append(piece)
                    yield {"side": side, "delta": piece}
            except VLLMError as err:
                yield {"error": str(err), "code": err.code}
                return
            yield {
                "side": side,
                "end": True,
                "text": "".join(text),
                "seconds": round(time.perf_counter() - t0, 3),
                "cancelled": False,
                "cut": getattr(self.client, "last_finish_reason", None) == "length",
            }
        yield {"done": True, "cancelled": False}

    def close(self) -> None:
        pass


def collect(events: Iterator[dict[str, Any]], on_event=None) -> dict[str, Any]:
    """Run one request to completion: {"base": text, "tuned": text, "error": ...}."""
    out: dict[str, Any] = {}
    for ev in events:
        if on_event:
            on_event(ev)
        if ev.get("start") and "prompt_tokens" in ev:
            out[ev["side"] + "_prompt_tokens"] = ev["prompt_tokens"]
        if ev.get("end"):
            out[ev["side"]] = ev.get("text", "")
            if ev.get("token_ids") is not None:
                out[ev["side"] + "_token_ids"] = ev["token_ids"]
            if ev.get("cut"):
                out[ev["side"] + "_cut"] = True
        if "error" in ev:
            out["error"] = ev["error"]
    return out


def side_by_side(left: str, right: str, width: int = 100, titles=("base", "tuned")) -> str:
    import textwrap

    col = max(20, (width - 3) // 2)
    a = textwrap.wrap(left.replace("\n", " ⏎ "), col) or [""]
    b = textwrap.wrap(right.replace("\n", " ⏎ "), col) or [""]
    rows = [f"{titles[0]:<{col}} │ {titles[1]}", f"{'─' * col}─┼─{'─' * col}"]
    for i in range(max(len(a), len(b))):
        rows.append(f"{(a[i] if i < len(a) else ''):<{col}} │ {b[i] if i < len(b) else ''}")
    return "\n".join(rows)


def default_prompt(art: RunArtifacts) -> str:
    try:
        from cockpit.serve.artifacts import load_run_probes

        return load_run_probes(art)[0]["prompt"]
    except Exception:  # noqa: BLE001 - no readable probes: a neutral default prompt
        return "Who are you?"
