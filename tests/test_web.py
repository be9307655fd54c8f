"""``cockpit web``: the cockpit served by textual-serve, opened in a real headless Chromium.

Chromium is Debian's ``chromium`` package (``bash scripts/chromium.sh``, which .ci/run calls); it is
driven over the DevTools protocol (a websocket, with aiohttp, which textual-serve brings). Without
Chromium the browser test skips, unless ``CI=true`` (then it fails).

textual-serve's page draws the terminal with xterm.js on a canvas, so the screen's text is not in
the DOM: a script added before the page's own (``Page.addScriptToEvaluateOnNewDocument``) keeps
each xterm.js ``Terminal`` the page creates (its ``this.terminal = new Terminal(...)`` goes through
a setter on ``Object.prototype``), and the test reads the rows xterm.js parsed from the app's output
(``terminal.buffer.active``): what the canvas shows. Keys are real key events sent to the page
(``Input.dispatchKeyEvent``), which xterm.js turns into the escape sequences a terminal sends.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import prerequisite

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT = ROOT / "screenshots" / "web.png"

HOOK = """
window.__terminals = [];
Object.defineProperty(Object.prototype, "terminal", {
  configurable: true,
  set(value) {
    Object.defineProperty(this, "terminal", {value, writable: true, configurable: true, enumerable: true});
    if (value && value.buffer && value.buffer.active) window.__terminals.push(value);
  },
});
"""

SCREEN_TEXT = """
(() => {
  const t = window.__terminals && window.__terminals[0];
  if (!t) return null;
  const b = t.buffer.active, rows = [];
  for (let i = 0; i < t.rows; i++) { const l = b.getLine(b.viewportY + i); rows.push(l ? l.translateToString(true) : ""); }
  return rows.join("\\n");
})()
"""


def chromium() -> str:
    found = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    prerequisite(found is not None, "no chromium (install it with: bash scripts/chromium.sh)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, deadline_s: float = 30.0) -> None:
    end = time.time() + deadline_s
    while time.time() < end:
        if proc.poll() is not None:
            raise AssertionError(f"cockpit web exited {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {deadline_s} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


class Cdp:
    """A minimal DevTools-protocol client over one page's websocket."""

    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, **params):
        self.next_id += 1
        my_id = self.next_id
        await self.ws.send_json({"id": my_id, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), 60)
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def evaluate(self, expression: str):
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    async def screen_until(self, words: list[str], timeout_s: float) -> str:
        end = time.time() + timeout_s
        text = ""
        while time.time() < end:
            text = await self.evaluate(SCREEN_TEXT) or ""
            if all(w in text for w in words):
                return text
            await asyncio.sleep(0.3)
        raise AssertionError(f"{words} not on the screen after {timeout_s} s; the screen:\n{text}")

    async def press(self, key: str, code: str, key_code: int) -> None:
        common = {"key": key, "code": code, "windowsVirtualKeyCode": key_code, "nativeVirtualKeyCode": key_code}
        await self.call("Input.dispatchKeyEvent", type="rawKeyDown", **common)
        await self.call("Input.dispatchKeyEvent", type="keyUp", **common)

    async def screenshot(self, path: Path) -> None:
        import base64

        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))


def test_public_address_refused_without_public(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "cockpit.cli", "web", "--runs-dir", str(tmp_path), "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "refusing to listen on 0.0.0.0" in out.stderr and "--public" in out.stderr


def test_loopback_rule():
    from cockpit.commands.web import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("127.1.2.3") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5") and not is_loopback("example.org")


def test_public_warns_and_serves(tmp_path):
    """--public: a warning, then it listens (on a wildcard address, reached here through loopback)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cockpit.cli", "web", "--runs-dir", str(tmp_path), "--host", "0.0.0.0", "--public"]
        + ["--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_port(port, proc)
    finally:
        stop(proc)
    out = proc.stdout.read()
    assert "WARNING: listening on 0.0.0.0 (--public)" in out


@pytest.mark.slow  # 10-20 s: a browser, the cockpit's start in it, a screen change
def test_web_in_headless_chromium(tmp_path):
    """Setup renders in the browser, F3 switches to Runs; screenshots of both are saved (tmp_path)."""
    browser = chromium()
    import aiohttp

    runs = tmp_path / "runs"
    runs.mkdir()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "cockpit.cli", "--runs-dir", str(runs), "web", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    profile = tmp_path / "chromium-profile"
    chrome = None
    try:
        wait_port(port, server)
        chrome = subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions"]
            + ["--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1280,800", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        active = profile / "DevToolsActivePort"
        end = time.time() + 60
        while not (active.exists() and active.read_text().strip()) and time.time() < end:
            assert chrome.poll() is None, f"chromium exited {chrome.returncode}"
            time.sleep(0.2)
        cdp_port = int(active.read_text().split()[0])

        async def drive() -> tuple[str, str]:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{cdp_port}/json/list") as resp:
                    targets = await resp.json(content_type=None)
                page = next(t for t in targets if t.get("type") == "page")
                async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    cdp = Cdp(ws)
                    await cdp.call("Page.enable")
                    await cdp.call("Page.addScriptToEvaluateOnNewDocument", source=HOOK)
                    await cdp.call("Page.navigate", url=f"http://127.0.0.1:{port}/")
                    setup = await cdp.screen_until(["Preset", "cpu-demo", "Launch F8"], timeout_s=90)
                    await asyncio.sleep(2.0)  # the plan's verdict and the footer, for the picture
                    await cdp.screenshot(tmp_path / "web-setup.png")
                    await cdp.call(
                        "Runtime.evaluate", expression="document.querySelector('.xterm-helper-textarea').focus()"
                    )
                    await cdp.press("F3", "F3", 114)
                    runs_screen = await cdp.screen_until(["No runs yet"], timeout_s=60)
                    await cdp.screenshot(tmp_path / "web-runs.png")
                    return setup, runs_screen

        setup, runs_screen = asyncio.run(drive())
    finally:
        if chrome is not None:
            stop(chrome)
        stop(server)
    assert "No runs yet" not in setup and "Launch F8" not in runs_screen  # the screen changed
    assert str(runs) in setup  # the tab's cockpit reads the runs dir given to cockpit web (its top line)
    for shot in ("web-setup.png", "web-runs.png"):
        assert (tmp_path / shot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / shot).stat().st_size > 10_000
    if not SCREENSHOT.exists():  # the README's picture, once (delete it to take a new one)
        shutil.copyfile(tmp_path / "web-setup.png", SCREENSHOT)


def test_a_busy_port_is_said_before_the_banner(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "cockpit.cli", "web", "--runs-dir", str(tmp_path), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Serving" not in out.stdout


def tab_children(server_pid: int) -> list[int]:
    """The processes the server started (its tabs), from /proc (this server's children only)."""
    path = Path(f"/proc/{server_pid}/task/{server_pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


async def tab_until(ws, got: bytearray, words: list[bytes], timeout_s: float) -> None:
    """Read the tab's terminal stream (binary frames) into ``got`` until every word is in it."""
    import aiohttp

    end = time.time() + timeout_s
    while not all(w in got for w in words):
        left = end - time.time()
        assert left > 0, f"{words} not in the tab's output after {timeout_s} s; it sent:\n{bytes(got[-3000:])!r}"
        try:
            msg = await asyncio.wait_for(ws.receive(), left)
        except asyncio.TimeoutError:
            continue
        if msg.type == aiohttp.WSMsgType.BINARY:
            got += msg.data
        elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
            raise AssertionError(f"the tab's websocket closed; it sent:\n{bytes(got[-3000:])!r}")


def test_a_tab_starts_the_installed_cockpit_and_says_when_it_dies(tmp_path):
    """Issue 62 item 2: `cockpit web` started in a folder holding a `cockpit/` folder (the clone's
    parent) serves the installed cockpit (the local folder, which cannot even be imported, is
    not); the tab's process killed, the page says so instead of freezing. A websocket client
    speaks to the server as the page does (binary frames: the tab's terminal output)."""
    import aiohttp

    parent = tmp_path / "parent"
    (parent / "cockpit").mkdir(parents=True)
    (parent / "cockpit" / "__init__.py").write_text("raise ImportError('the local cockpit/ folder was imported')\n")
    runs = tmp_path / "runs"
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("cockpit")), "web", "--runs-dir", str(runs), "--port", str(port)],
        cwd=parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )

    async def drive() -> bytes:
        got = bytearray()
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"http://127.0.0.1:{port}/ws?width=120&height=36", max_msg_size=0) as ws:
                await tab_until(ws, got, [b"cpu-demo"], timeout_s=90)  # Setup's preset: the cockpit runs
                (tab,) = tab_children(server.pid)
                os.kill(tab, signal.SIGKILL)  # as the OOM killer would
                await tab_until(ws, got, [b"this tab's cockpit process ended (killed by SIGKILL)"], timeout_s=60)
        return bytes(got)

    try:
        wait_port(port, server)
        out = asyncio.run(drive())
    except AssertionError as exc:
        stop(server)
        raise AssertionError(f"{exc}\n`cockpit web` said:\n{server.stdout.read() if server.stdout else ''}") from None
    finally:
        stop(server)
    assert b"Reload the page" in out and b"the local cockpit/ folder was imported" not in out


def test_the_death_notice_shows_the_error_output():
    """A tab that dies at start (its import failed): the page shows the end of its stderr."""
    from cockpit.commands.web_tab import death_notice

    text = death_notice(
        1, b"Traceback (most recent call last):\n  ...\nImportError: cannot import name '__version__'\n"
    )
    assert b"ended (exit code 1)" in text and b"  ImportError: cannot import name '__version__'\r\n" in text
    assert text.startswith(b"\x1b[?1049l")  # out of the app's alternate screen, where xterm.js shows it


@pytest.mark.cold_start  # a warm child has the installed cockpit imported already: this is about a cold start
def test_the_cockpits_own_cli_calls_ignore_a_local_cockpit_folder(tmp_path):
    """The page's cockpit (and the terminal's) runs its CLI calls (check, data report, launch) in
    the working folder: one holding a `cockpit/` folder still gets the installed cockpit."""
    from cockpit.ui import cli_calls

    (tmp_path / "cockpit").mkdir()
    (tmp_path / "cockpit" / "__init__.py").write_text("raise ImportError('the local cockpit/ folder was imported')\n")
    res = cli_calls.run_cli("runs", "--runs-dir", str(tmp_path / "runs"), cwd=str(tmp_path), timeout=120)
    assert res.rc == 0 and "no runs" in res.stdout.lower(), res.error_text
