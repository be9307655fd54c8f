"""Ask a warm start server (:mod:`cockpit.train.warm_start`) for a process, as
:class:`subprocess.Popen` would start it cold.

Only where ``COCKPIT_WARM_START`` names a server's socket (the test suite sets it) and only for a
``python -m MODULE ARGS`` command of the server's own interpreter; otherwise, or when the server
refuses (another import-time environment and no room in its pool for a server of that one) or is
gone, :func:`start` returns None and the caller starts the process cold. A redirect to a pool server
is followed once (the first one for an environment waits for it to import, as a cold start would). Stdlib only: the supervisor imports this.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

ENV_VAR = "COCKPIT_WARM_START"
last_refusal: str | None = None  # why the last start() returned None after asking a server


class WarmProcess:
    """The part of :class:`subprocess.Popen` the supervisor and the tests use: ``pid``, ``poll``,
    ``wait``, ``returncode``. The server says the exit code when the child ends."""

    def __init__(self, conn: socket.socket, pid: int, buffer: bytes = b"") -> None:
        self.conn = conn
        self.pid = pid
        self.returncode: int | None = None
        self._buffer = buffer
        self._said()

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(block=False)
        return self.returncode

    def _said(self) -> None:
        if b"\n" in self._buffer:
            message = json.loads(self._buffer.split(b"\n", 1)[0])
            self.returncode = int(message["returncode"])
            self.conn.close()

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["warm start", str(self.pid)], timeout or 0)
            self._read(block=True, timeout=0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic())))
        assert self.returncode is not None
        return self.returncode

    def _read(self, block: bool, timeout: float = 0.0) -> None:
        self.conn.settimeout(timeout if block else 0.0)
        try:
            chunk = self.conn.recv(4096)
        except (BlockingIOError, TimeoutError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # the server is gone before saying: the child's own status, if it is ours to see
            self.returncode = self._lost()
            return
        self._buffer += chunk
        self._said()

    def _lost(self) -> int:
        """The server died: wait for the child by its pid (not our child, so no exit status: -9 as a
        lost process's code once it is gone)."""
        from cockpit.run.liveness import is_alive

        while is_alive(self.pid, None):
            time.sleep(0.2)
        return -9


def start(
    command: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    stdout: str,
    stderr: str = "stdout",
) -> WarmProcess | None:
    """Start ``command`` (``PYTHON [-P] -m MODULE ARGS...``) warm, its output appended to ``stdout`` (and
    ``stderr``, the same file unless named); None where it cannot, the caller starting it cold."""
    global last_refusal
    last_refusal = None
    path = env.get(ENV_VAR)
    safe_path = command[1:2] == ["-P"]  # `python -P -m`: the working directory is not put on sys.path
    if safe_path:
        command = [command[0], *command[2:]]
    if not path or len(command) < 3 or command[1] != "-m":
        return None
    request: dict[str, Any] = {
        "executable": command[0],
        "module": command[2],
        "safe_path": safe_path,
        "args": list(command[3:]),
        "env": dict(env),
        "cwd": cwd,
        "stdout": stdout,
        "stderr": stderr,
    }
    try:
        conn, message, rest = _ask(path, request)
        if "redirect" in message:  # a pool server with this request's import-time environment
            conn.close()
            path = str(message["redirect"])
            _wait_listening(path, int(message["server_pid"]))
            conn, message, rest = _ask(path, request)
    except (OSError, ValueError) as exc:
        last_refusal = f"no warm start server at {path}: {exc}"
        return None
    if "pid" not in message:
        conn.close()
        last_refusal = str(message.get("refused"))
        return None
    return WarmProcess(conn, int(message["pid"]), rest)


def _ask(path: str, request: dict[str, Any]) -> tuple[socket.socket, dict[str, Any], bytes]:
    """Send ``request`` to the server at ``path``: the open connection, its first answer, and what
    came after that answer's line."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(30)
        conn.connect(path)
        conn.sendall((json.dumps(request) + "\n").encode())
        answer = b""
        while b"\n" not in answer:
            chunk = conn.recv(4096)
            if not chunk:
                raise OSError("the warm start server closed the connection")
            answer += chunk
        line, rest = answer.split(b"\n", 1)
        message = json.loads(line)
    except (OSError, ValueError):
        conn.close()
        raise
    if not isinstance(message, dict):
        conn.close()
        raise ValueError(f"an answer that is not an object: {line!r}")
    return conn, message, rest


def _wait_listening(path: str, server_pid: int, timeout: float = 180.0) -> None:
    """Until a pool server (just started: importing torch and the rest, as a cold process would)
    listens at ``path``; OSError if it dies first or takes longer than ``timeout``."""
    from cockpit.run.liveness import is_alive

    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if not is_alive(server_pid, None):
            raise OSError(f"the pool server {server_pid} ended before it listened")
        if time.monotonic() > deadline:
            raise OSError(f"the pool server {server_pid} did not listen within {timeout:.0f} s")
        time.sleep(0.05)


def run(
    command: list[str],
    env: Mapping[str, str],
    cwd: str | None,
    timeout: float,
    on_stderr: Callable[[str], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, capture_output=True, text=True, stdin=DEVNULL, ...)``: the process forked
    by the warm start server where ``env`` names one and it takes the command, else started cold. A
    timeout kills the warm process's session and raises :class:`subprocess.TimeoutExpired`, as ``run`` does.
    ``on_stderr``: called with each line of stderr as the process writes it (its stages, shown live)."""
    import tempfile

    where = cwd or os.getcwd()
    with tempfile.TemporaryDirectory(prefix="cockpit-warm-") as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        proc: WarmProcess | subprocess.Popen[bytes] | None = start(command, env, where, out, err)
        if proc is None:
            if on_stderr is None:
                return subprocess.run(
                    command,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    env=dict(env),
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                )
            with open(out, "wb") as out_fh, open(err, "wb") as err_fh:
                proc = subprocess.Popen(
                    command, stdout=out_fh, stderr=err_fh, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL
                )
        try:
            code = _wait(proc, timeout, err, on_stderr)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise subprocess.TimeoutExpired(command, timeout, output=_text(out), stderr=_text(err)) from None
        return subprocess.CompletedProcess(command, code, _text(out), _text(err))


def _wait(
    proc: WarmProcess | subprocess.Popen[bytes], timeout: float, err: str, on_stderr: Callable[[str], None] | None
) -> int:
    """``proc``'s exit code; with ``on_stderr``, each complete line of the ``err`` file handed to it
    as it comes (every 0.2 s), the rest at the end."""
    if on_stderr is None:
        return proc.wait(timeout)
    deadline, offset, partial = time.monotonic() + timeout, 0, b""
    while True:
        try:
            code: int | None = proc.wait(max(0.0, min(0.2, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            code = None
        try:
            with open(err, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
        except FileNotFoundError:
            chunk = b""
        offset += len(chunk)
        *lines, partial = (partial + chunk).split(b"\n")
        if code is not None and partial:
            lines, partial = [*lines, partial], b""
        for line in lines:
            on_stderr(line.decode("utf-8", "replace"))
        if code is not None:
            return code
        if time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(["warm start"], timeout)


def _kill(proc: WarmProcess | subprocess.Popen[bytes]) -> None:
    """A warm process's session (it is a session leader), or a cold child."""
    import signal

    if isinstance(proc, subprocess.Popen):
        proc.kill()
        proc.wait()
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except FileNotFoundError:
        return ""
