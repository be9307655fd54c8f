"""A warm start server: one process that has imported torch, transformers and the rest once, and
forks a child for each ``python -m MODULE ARGS`` asked of it over a Unix socket.

A rank spends about 4 s of its start importing torch and transformers (and ``cockpit check``
about 3 s), which is noise before an hour of training and most of a 6-step test run. The test
suite starts one server per test process and sets ``COCKPIT_WARM_START`` to its socket; the
supervisor (:mod:`cockpit.run.warm_start`) then asks it for a single-process rank, and the tests'
CLI helper for ``python -m cockpit.cli``. The child is a real process of its own: its own session
(``setsid``), environment, working directory, log, signals and exit status; only its start differs.

Nothing of cockpit is imported here before the fork (its modules read the environment at import);
only third-party packages. A request whose import-time environment (``PYTHONPATH``, ``HF_*``,
``OMP_*``, ...) differs from the server's cannot be forked from it: the packages read those at
import (transformers, for one, looks its optional packages up on ``sys.path`` once). With a pool
(``--pool N``) the server starts a second server with that request's import-time environment (cold,
once) and redirects the request, and the next ones with the same environment, to it: the side
folders' ``PYTHONPATH`` of the QLoRA and tracker runs, a test's ``OMP_NUM_THREADS``. A pool server
ends after ``--idle-exit`` seconds with no request and no child (the pool holds at most N at once;
one more is refused). Without a pool, or with a full one, the answer is ``{"refused": why}`` and the
caller starts a cold process.

Protocol, one JSON line each way: the request ``{"executable", "module", "args", "env", "cwd",
"stdout", "stderr"}`` (paths the child appends to; ``stderr`` may be ``"stdout"``); the answers
``{"pid": N}`` at the fork and ``{"returncode": N}`` at the child's end (a negative N: the signal
that ended it, as :class:`subprocess.Popen` says it), or ``{"redirect": PATH, "server_pid": N}``
(ask the pool server at PATH, listening once its imports are done; N: its pid, to see it die).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any

# packages a rank or `cockpit check` imports anyway, in the order they are imported
PREIMPORTS = (
    "torch",
    "transformers",
    "transformers.trainer",
    "transformers.models.llama.modeling_llama",
    "datasets",
    "accelerate",
    "peft",
    "trl",
    "safetensors.torch",
    "tokenizers",
    "yaml",
)
# environment variables read at those packages' import (or by the interpreter at its start): a
# child must see the values the server imported them with (not ACCELERATE_*: accelerate reads those
# when an Accelerator is made, and sets some in the environment of the process that made one, e.g. a
# test process that trained in-process)
IMPORT_TIME_ENV = (
    "PYTHON",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "DATASETS_",
    "TORCH",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "CUDA_",
    "HIP_",
    "ROCR_",
    "ROCM_",
    "TOKENIZERS_",
    "PEFT_",
    "TRL_",
    "LD_",
    "HOME",
    "XDG_CACHE_HOME",  # huggingface_hub's default cache; XDG_CONFIG_HOME (the UI's settings) is read when used
)
UNBUFFERED = "PYTHONUNBUFFERED"  # applied in the child: its streams are made anew there
# read when used, not at import (torch sets these in the environment of a process that used inductor or
# asked for CUDA, e.g. the `cockpit check` that started the supervisor)
RUNTIME_ENV = (UNBUFFERED, "TORCHINDUCTOR_CACHE_DIR", "PYTORCH_NVML_BASED_CUDA_CHECK")
ENV_VAR = "COCKPIT_WARM_START"


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV) and k not in RUNTIME_ENV}


def refusal(request: dict[str, Any]) -> str | None:
    """Why this server cannot start the request warm (None: it can)."""
    return command_refusal(request) or env_refusal(request)


def command_refusal(request: dict[str, Any]) -> str | None:
    if request.get("executable") != sys.executable:
        return f"another interpreter ({request.get('executable')}, this server runs {sys.executable})"
    if not isinstance(request.get("module"), str) or not request["module"]:
        return "no module to run"
    return None


def env_refusal(request: dict[str, Any]) -> str | None:
    mine, theirs = import_time_env(dict(os.environ)), import_time_env(request.get("env") or {})
    if mine != theirs:
        differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        return f"its import-time environment differs ({', '.join(differ)})"
    return None


class Pool:
    """The servers this one started for other import-time environments: at most ``size`` at once,
    each keyed by the environment it imported with. Its own children: reaped by :func:`_reap`."""

    def __init__(self, path: str, size: int, idle_exit: float) -> None:
        self.path = path
        self.size = size
        self.idle_exit = idle_exit
        self.servers: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}  # env key -> (socket, process)
        self.started = 0

    def redirect(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """Where to ask for ``request`` (a server with its import-time environment, started now if
        none runs); None when the pool is full."""
        theirs = import_time_env(request.get("env") or {})
        key = json.dumps(sorted(theirs.items()))
        if key not in self.servers:
            if len(self.servers) >= self.size:
                return None
            self.started += 1
            path = f"{self.path}.{self.started}"
            env = {k: v for k, v in os.environ.items() if k not in import_time_env(dict(os.environ))}
            env.update(theirs)
            env[UNBUFFERED] = "1"
            command = [sys.executable, "-m", "cockpit.train.warm_start", path, "--idle-exit", str(self.idle_exit)]
            self.servers[key] = (path, subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL))
        path, process = self.servers[key]
        return {"redirect": path, "server_pid": process.pid}

    def close(self) -> None:
        """End the pool servers (their children, forked ranks in sessions of their own, live on)."""
        for _, process in self.servers.values():
            process.terminate()
        for _, process in self.servers.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        self.servers.clear()

    def ended(self, pid: int, code: int) -> None:
        for key, (_, process) in list(self.servers.items()):
            if process.pid == pid:
                process.returncode = code  # reaped by _reap: Popen must not wait for it again
                del self.servers[key]


def _stream(fd: int, unbuffered: bool, errors: str) -> Any:
    import io

    raw = io.FileIO(fd, "w", closefd=False)
    if unbuffered:
        return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, write_through=True)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8", errors=errors, line_buffering=fd == 2)


def run_child(request: dict[str, Any]) -> int:
    """In the forked child: become the asked process, run its module as ``__main__``; its exit code."""
    import atexit
    import runpy

    os.setsid()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the interpreter's own at its start
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    err = (
        out
        if request.get("stderr", "stdout") == "stdout"
        else os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    )
    os.dup2(err, 2)
    unbuffered = bool(request["env"].get(UNBUFFERED))
    sys.stdout = _stream(1, unbuffered, "strict")
    sys.stderr = _stream(2, True, "backslashreplace")
    sys.stdin = open(0, encoding="utf-8", closefd=False)
    if request.get("safe_path"):
        del sys.path[0]  # `python -P -m`: nothing put first
    else:
        sys.path[0] = request["cwd"]  # `python -m` puts the working directory first
    sys.argv = [request["module"], *request.get("args", [])]
    code: int
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 (as the interpreter would: the traceback on stderr, exit 1)
        import traceback

        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:  # the asker is gone: its child lives on, reaped below
        pass


def serve(path: str, pool: Pool | None = None, idle_exit: float | None = None) -> int:
    """Accept requests on the socket ``path`` until the process that started this server is gone (or,
    with ``idle_exit``, it has had no request and no child for that many seconds); in a forked child,
    the child's exit code (the caller exits with it)."""
    for name in PREIMPORTS:
        __import__(name)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    os.rename(path + ".tmp", path)  # callers see the socket once it listens
    listener.listen(64)
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection that asked for it
    busy = time.monotonic()
    while os.getppid() == parent:
        if waiting:
            busy = time.monotonic()
        elif idle_exit is not None and time.monotonic() - busy > idle_exit:
            os.unlink(path)  # no new caller finds it; one that just did gets a refused connection: cold
            break
        ready, _, _ = select.select([listener], [], [], 0.2)
        if ready:
            busy = time.monotonic()
            conn, _ = listener.accept()
            request = _read_request(conn)
            answer = _answer_without_fork(request, pool)
            if answer is not None:
                _send(conn, answer)
                conn.close()
            else:
                assert request is not None
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in waiting.values():
                        other.close()
                    conn.close()
                    return run_child(request)
                _send(conn, {"pid": pid})
                waiting[pid] = conn
        _reap(waiting, pool)
    return 0


def _answer_without_fork(request: dict[str, Any] | None, pool: Pool | None) -> dict[str, Any] | None:
    """The answer to a request this server does not fork for (a refusal, a redirect to a pool
    server); None: fork it."""
    why: str | None
    if request is None:
        why = "an unreadable request"
    else:
        why = command_refusal(request)
        if why is None:
            why = env_refusal(request)
            if why is None:
                return None
            redirect = pool.redirect(request) if pool is not None else None
            if redirect is not None:
                return redirect
            why += " (the pool is full)" if pool is not None else ""
    print(f"refused {request and request.get('module')}: {why}", flush=True)
    return {"refused": why}


def _read_request(conn: socket.socket) -> dict[str, Any] | None:
    conn.settimeout(10)
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        request = json.loads(data)
    except (OSError, ValueError):
        return None
    return request if isinstance(request, dict) else None


def _reap(waiting: dict[int, socket.socket], pool: Pool | None) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pool is not None:
            pool.ended(pid, _exit_code(status))
        conn = waiting.pop(pid, None)
        if conn is not None:
            _send(conn, {"returncode": _exit_code(status)})
            conn.close()


def main(argv: list[str]) -> int:
    """``python -m cockpit.train.warm_start SOCKET [--pool N] [--idle-exit SECONDS]``"""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m cockpit.train.warm_start")
    parser.add_argument("socket")
    parser.add_argument(
        "--pool", type=int, default=0, help="at most this many servers for other import-time environments"
    )
    parser.add_argument(
        "--idle-exit", type=float, default=None, help="end after this many seconds with no request and no child"
    )
    parser.add_argument("--pool-idle-exit", type=float, default=60.0, help="a pool server's --idle-exit")
    args = parser.parse_args(argv)
    pool = Pool(args.socket, args.pool, args.pool_idle_exit) if args.pool > 0 else None
    server = os.getpid()
    signal.signal(signal.SIGTERM, _terminated)  # a forked child resets it (run_child)
    try:
        return serve(args.socket, pool, args.idle_exit)
    finally:
        if pool is not None and os.getpid() == server:  # not in a forked child on its way out
            pool.close()


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except SystemExit as end:  # SIGTERM (_terminated), argparse: os._exit too. The interpreter's teardown of the
        code = end.code if isinstance(end.code, int) else 1  # preimports took 4 s a server, a pool's servers first
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
