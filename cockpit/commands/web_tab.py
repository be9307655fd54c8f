"""The process behind one browser tab of ``cockpit web``: textual-serve's ``AppService``, plus a
notice in the page when that process dies.

textual-serve alone writes a dead app's stderr to the server's terminal and leaves the page on its
splash (nothing reached the terminal) or on the last frame drawn, with nothing said. ``TabService``
keeps the tail of the process's stderr and, when the process ends with a non-zero code or a signal,
writes what happened into the tab's terminal (xterm.js draws it like the app's own output).
Imported only after ``cockpit web`` found textual-serve.
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

from textual_serve.app_service import AppService

TAIL_BYTES = 4096
# leave the alternate screen, stop mouse reports and bracketed paste, show the cursor, clear, home
RESET = "\x1b[?1049l\x1b[?1000l\x1b[?1003l\x1b[?1006l\x1b[?1015l\x1b[?2004l\x1b[?25h\x1b[0m\x1b[2J\x1b[H"


ENDING = (RESET + "cockpit is ending (its last work finishing) …\r\n").encode()


class StderrTail:
    """``process.stderr`` as ``AppService.run`` reads it (``read(n)``), keeping the last bytes."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream
        self.tail = b""

    async def read(self, n: int = -1) -> bytes:
        data = await self.stream.read(n)
        self.tail = (self.tail + data)[-TAIL_BYTES:]
        return data


def ended_how(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def death_notice(code: int, stderr_tail: bytes, lines: int = 14) -> bytes:
    """What the tab's terminal shows once its cockpit process ended badly (``code``: the
    process's return code; ``stderr_tail``: the end of its error output)."""
    said = stderr_tail.decode("utf-8", "replace").strip().splitlines()[-lines:]
    text = [f"cockpit web: this tab's cockpit process ended ({ended_how(code)})."]
    if said:
        text += ["", "Its last error output:", *(f"  {line}" for line in said)]
    text += ["", "Reload the page to start a new one; the terminal running `cockpit web` has the full output."]
    return (RESET + "\r\n".join(text) + "\r\n").encode()


class TabService(AppService):
    """One tab's cockpit process; says in the page when it dies. The app's "exit" message (sent as
    it quits, a crash included) closes the page's socket only once the process ended well: closed,
    the page covers the terminal with its "Session ended" box, hiding why."""

    _stderr_tail: StderrTail | None = None
    _exit_said = False

    async def _open_app_process(self, width: int = 80, height: int = 24) -> Any:
        process = await super()._open_app_process(width, height)
        if process.stderr is not None:
            self._stderr_tail = StderrTail(process.stderr)
            process.stderr = self._stderr_tail  # type: ignore[assignment]  # run() only calls read(n)
        return process

    async def on_meta(self, data: bytes) -> None:
        if json.loads(data).get("type") == "exit":
            self._exit_said = True  # the page is closed by run() once the process's exit code is known
            await self.remote_write_bytes(ENDING)  # its last threads may take seconds: not a frozen page
            return
        await super().on_meta(data)

    async def run(self) -> None:
        await super().run()
        if self._process is None:
            return
        code = await self._process.wait()
        if code == 0:
            if self._exit_said:
                await self.remote_close()  # the app quit: the page's own "Session ended"
            return
        tail = self._stderr_tail.tail if self._stderr_tail else b""
        try:
            await self.remote_write_bytes(death_notice(code, tail))
        except (ConnectionError, RuntimeError):
            pass  # the tab is already gone
