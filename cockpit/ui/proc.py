"""The CLI in subprocesses: the UI never loads a tokenizer or torch itself.

Every helper is blocking; screens call them from thread workers (``@work(thread=True)``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def cockpit_argv(*args: str) -> list[str]:
    """``cockpit ARGS`` with the interpreter running the UI (same install, same code)."""
    return [sys.executable, "-m", "cockpit.cli", *args]


def shell_line(argv: list[str]) -> str:
    import shlex

    shown = ["cockpit", *argv[3:]] if argv[1:3] == ["-m", "cockpit.cli"] else argv
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


def run_cli(*args: str, timeout: float = 600, cwd: str | None = None, env: dict | None = None) -> CliResult:
    full_env = dict(os.environ)
    full_env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    full_env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    full_env.setdefault("TOKENIZERS_PARALLELISM", "false")
    full_env.update(env or {})
    try:
        proc = subprocess.run(
            cockpit_argv(*args), capture_output=True, text=True, timeout=timeout, cwd=cwd, env=full_env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        return CliResult(124, None, exc.stdout or "", f"timed out after {timeout:.0f}s")
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


def train_detached(path: Path, runs_dir: Path, timeout: float = 600) -> CliResult:
    return run_cli("train", str(path), "--detach", "--json", "--runs-dir", str(runs_dir), timeout=timeout)


def export_run(run_dir: Path, merge: bool, timeout: float = 3600) -> CliResult:
    args = ["export", str(run_dir), "--json"] + (["--merge"] if merge else [])
    return run_cli(*args, timeout=timeout)


def doctor(timeout: float = 300) -> CliResult:
    return run_cli("doctor", "--json", timeout=timeout)
