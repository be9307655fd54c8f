"""The CLI in subprocesses: the UI never loads a tokenizer or torch itself.

Every helper is blocking; screens call them from thread workers (``@work(thread=True)``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.run import warm_start


def vllm_url(app: Any) -> str | None:
    """The vLLM server to use: the app's, else ``$COCKPIT_VLLM_URL`` (None: local generation)."""
    return getattr(app, "vllm_url", None) or os.environ.get("COCKPIT_VLLM_URL") or None


COCKPIT = ["-P", "-m", "cockpit.cli"]


def cockpit_argv(*args: str) -> list[str]:
    """``cockpit ARGS`` with the interpreter running the UI (same install, same code: ``-P``, a
    ``cockpit/`` folder in the working directory, e.g. the clone's parent, is not imported)."""
    return [sys.executable, *COCKPIT, *args]


def shell_line(argv: list[str]) -> str:
    import shlex

    shown = ["cockpit", *argv[1 + len(COCKPIT) :]] if argv[1 : 1 + len(COCKPIT)] == COCKPIT else argv
    return " ".join(shlex.quote(a) for a in shown)


@dataclass
class CliResult:
    rc: int
    data: Any
    stdout: str
    stderr: str

    @property
    def error_text(self) -> str:
        text = (self.stderr or self.stdout or "").strip()
        return text[-2000:] or f"exit code {self.rc}"


def cli_env(env: dict | None = None) -> dict[str, str]:
    """The UI's environment for a CLI subprocess: quiet libraries, plus ``env``."""
    full_env = dict(os.environ)
    full_env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    full_env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    full_env.setdefault("TOKENIZERS_PARALLELISM", "false")
    full_env.update(env or {})
    return full_env


def run_cli(
    *args: str, timeout: float = 600, cwd: str | None = None, env: dict | None = None, on_stderr=None
) -> CliResult:
    """``on_stderr``: called (in this thread) with each stderr line as the command writes it."""
    full_env = cli_env(env)
    try:
        # cold unless a test's server is named
        proc = warm_start.run(cockpit_argv(*args), full_env, cwd, timeout, on_stderr=on_stderr)
    except subprocess.TimeoutExpired as exc:
        out = (
            exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        )  # bytes even with text=True
        return CliResult(124, None, out, f"timed out after {timeout:.0f}s")
    data = None
    out = proc.stdout.strip()
    if out:
        try:
            data = json.loads(out)
        except ValueError:
            # a JSON document on the last line (anything above it is chatter)
            try:
                data = json.loads(out.splitlines()[-1])
            except (ValueError, IndexError):
                data = None
    return CliResult(proc.returncode, data, proc.stdout, proc.stderr)


def check_config(path: Path, timeout: float = 300) -> CliResult:
    return run_cli("check", str(path), "--json", "--no-devices", timeout=timeout)


def write_config(path: Path, raw: Mapping[str, Any]) -> dict[str, str]:
    """``raw`` (the UI's flat config dict, before validation) as YAML at ``path`` with the secrets of its ``env`` redacted; returns them (name ->
    value): the command that reads the file gets them through its environment (``secrets=``),
    so no config the UI writes holds one."""
    from cockpit.config.load import to_yaml
    from cockpit.redact import redact_env, secret_values
    from cockpit.store.rundir import atomic_write_text

    secrets = secret_values(raw.get("env"))
    written = {**raw, "env": redact_env(raw.get("env"))} if raw.get("env") else raw
    atomic_write_text(path, to_yaml(written, only_changed=False))
    return secrets


def train_detached(
    path: Path, runs_dir: Path, timeout: float = 600, secrets: dict[str, str] | None = None, on_stage=None
) -> CliResult:
    """``cockpit train PATH --detach``; ``secrets`` (from :func:`write_config`) reach the run through
    the command's environment; ``on_stage``: called with each stage of the launch as it begins
    (``--progress``: the data check, the supervisor's start, the tokenizer check)."""
    progress = ["--progress"] if on_stage else []
    args = ("train", str(path), "--detach", "--json", *progress, "--runs-dir", str(runs_dir))
    return run_cli(*args, timeout=timeout, env=secrets, on_stderr=on_stage)


def queue_add(path: Path, runs_dir: Path, timeout: float = 600) -> CliResult:
    """``cockpit queue add PATH --json``: checked as ``cockpit check`` does, then queued (the entry)."""
    return run_cli("queue", "--runs-dir", str(runs_dir), "--json", "add", str(path), timeout=timeout)


def export_run(run_dir: Path, merge: bool, timeout: float = 3600) -> CliResult:
    args = ["export", str(run_dir), "--json"] + (["--merge"] if merge else [])
    return run_cli(*args, timeout=timeout)


def sweep_status(name: str, runs_dir: Path, timeout: float = 120) -> CliResult:
    """``cockpit sweep status NAME --json``: the trials, the best, the parameters' importance (Optuna
    stays in that process)."""
    return run_cli("sweep", "status", name, "--json", "--runs-dir", str(runs_dir), timeout=timeout)


def sweep_save_best(name: str, runs_dir: Path, path: Path, timeout: float = 120) -> CliResult:
    """``cockpit sweep best NAME --save-preset PATH --json``: the best trial's config as a preset."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    args = ("sweep", "best", name, "--save-preset", str(path), "--json", "--runs-dir", str(runs_dir))
    return run_cli(*args, timeout=timeout)


def doctor(timeout: float = 300) -> CliResult:
    return run_cli("doctor", "--json", timeout=timeout)


def serve_run(run_dir: Path, vllm_url: str | None = None, timeout: float = 900) -> CliResult:
    """``cockpit serve RUN --json``: the ``vllm serve`` command, or with a URL the hot-load record."""
    args = ["serve", str(run_dir), "--json"] + (["--vllm-url", vllm_url] if vllm_url else [])
    return run_cli(*args, timeout=timeout)


class ChatProcess:
    """A long-lived ``cockpit chat RUN --jsonl`` (the chat worker's JSON-lines protocol, see
    ``cockpit.serve.chat_worker``). stderr goes to ``RUN/logs/chat_worker.log`` (a file, never a
    pipe nobody reads); ``read`` blocks, so call it from a thread worker."""

    def __init__(self, run_dir: Path, vllm_url: str | None = None, env: dict | None = None) -> None:
        import threading

        args = ["chat", str(run_dir), "--jsonl"] + (["--vllm-url", vllm_url] if vllm_url else [])
        self.argv = cockpit_argv(*args)
        self.backend = "vllm" if vllm_url else "local"
        self.log_path = Path(run_dir) / "logs" / "chat_worker.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log_start = self._log.tell()
        self._lock = threading.Lock()
        self._closed = False
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=cli_env(env),
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
        )
        self.pid = self.proc.pid

    def send(self, obj: dict) -> bool:
        """Write one request line; False when the process no longer reads."""
        with self._lock:
            try:
                self.proc.stdin.write(json.dumps(obj, ensure_ascii=False) + "\n")
                self.proc.stdin.flush()
                return True
            except (BrokenPipeError, OSError, ValueError):
                return False

    def read(self) -> dict | None:
        """The next protocol object; None at end of output. A line that is not JSON comes back
        as an error object (shown, never dropped)."""
        line = self.proc.stdout.readline()
        if not line:
            return None
        try:
            obj = json.loads(line)
        except ValueError:
            return {"error": f"unexpected output from the chat process: {line.strip()[:300]}"}
        return obj if isinstance(obj, dict) else {"error": f"unexpected output: {line.strip()[:300]}"}

    def stderr_tail(self, lines: int = 8) -> str:
        """What this process wrote to its log (the reason it exited, usually)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                text = f.read()[-20000:].decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def close(self, grace_s: float = 0.5) -> None:
        """Stop it now (no generation is worth waiting for): cancel + quit, then SIGTERM, then
        SIGKILL; a daemon thread reaps it, so no zombie and no orphan are left behind."""
        import threading

        if self._closed:
            return
        self._closed = True
        if self.proc.poll() is None:
            self.send({"cancel": True})
            self.send({"quit": True})
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass

        def reap() -> None:
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self._log.close()

        threading.Thread(target=reap, daemon=True, name=f"chat-reap-{self.pid}").start()
