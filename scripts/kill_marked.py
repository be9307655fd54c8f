"""Kill every process whose environment carries NAME=VALUE, a test session's own marker.

``python scripts/kill_marked.py NAME=VALUE`` (scripts/test.sh, when the suite is interrupted and at
its end) kills them all but itself and its parent shell, and prints how many; ``tests/conftest.py``
imports :func:`kill_marked` for each test process's session end. The suite's detached supervisors
and their ranks run in their own sessions (setsid), so neither the terminal's Ctrl-C nor pytest's
end reaches them; every one inherits the environment of the test that started it, marker included.
A process's environment as it was at its start (``/proc/PID/environ``); Linux only. Stdlib only.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable


def marked(name: str, value: str) -> list[int]:
    """The pids (not this process) whose starting environment has ``name=value``."""
    want = f"{name}={value}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:  # gone, or another user's
            continue
        if want in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_marked(name: str, value: str, exclude: Iterable[int] = (), sig: int = signal.SIGKILL) -> list[int]:
    """Send ``sig`` to every marked process but ``exclude``; the pids signalled."""
    skip = set(exclude)
    done = []
    for pid in marked(name, value):
        if pid in skip:
            continue
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
        done.append(pid)
    return done


def main(argv: list[str]) -> int:
    name, _, value = (argv[1] if len(argv) == 2 else "").partition("=")
    if not name or not value:
        print("usage: kill_marked.py NAME=VALUE", file=sys.stderr)
        return 2
    pids = kill_marked(name, value, exclude=[os.getppid()])
    if pids:
        print(f"[test] killed {len(pids)} leftover process(es) of this test session: {' '.join(map(str, pids))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
