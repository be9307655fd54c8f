"""Shared pieces of the telemetry backends: the device record, unit helpers, guarded calls.

A backend is any object with ``name`` (str), ``devices() -> list[dict]`` and ``close()``.
``devices()`` returns one plain dict per GPU with at least the keys of :data:`DEVICE_KEYS`
(``None`` where the backend cannot measure a value); backends may add more keys.

Units (the ``telemetry`` event in ``cockpit/store/events.py``): memory in MiB (2**20 bytes) under
``*_mb`` keys, utilisation in percent, temperature in degrees Celsius, power in watts.

No torch, no textual here.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

MIB = 2**20

DEVICE_KEYS = ("index", "name", "vram_used_mb", "vram_total_mb", "util_pct", "temp_c", "power_w")


def empty_device(index: int, name: str | None = None) -> dict[str, Any]:
    device: dict[str, Any] = dict.fromkeys(DEVICE_KEYS)
    device["index"] = index
    device["name"] = name
    return device


def mib(n_bytes: float | int | None) -> float | None:
    """Bytes -> MiB, rounded to 0.1; None stays None."""
    if n_bytes is None:
        return None
    return round(float(n_bytes) / MIB, 1)


def number(value: Any, invalid_at: int | None = None) -> float | None:
    """A measured number, or None for "N/A" strings, non-numbers and sentinel values.

    ``invalid_at``: values >= this are the libraries' "not supported" sentinels (amdsmi uses
    0xFFFF and UINT32_MAX, NVML 0xFFFFFFFF)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        if invalid_at is not None and value >= invalid_at:
            return None
        return value
    return None


def short_reason(exc: BaseException, limit: int = 160) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        ctypes.CDLL(None).fflush(None)  # libc: flush every C stdio stream
    except Exception:
        pass


@contextlib.contextmanager
def quiet_output() -> Iterator[io.StringIO]:
    """Silence stdout/stderr, Python-level *and* file descriptors 1 and 2.

    Vendor libraries print from Python (amdsmi prints "Unable to find libamd_smi.so ..." on
    import) and sometimes from C. The cockpit's stdout may be the TUI, so neither may get
    through. What was printed is collected in the yielded buffer (to build a reason string).
    Not for use while other threads write to stdout: the redirection is process-wide.
    """
    captured = io.StringIO()
    saved_fds: list[tuple[int, int]] = []
    tmp = tempfile.TemporaryFile(mode="w+b")
    _flush_all()  # what was printed before belongs to the real stdout
    try:
        for fd in (1, 2):
            try:
                saved_fds.append((fd, os.dup(fd)))
                os.dup2(tmp.fileno(), fd)
            except OSError:
                pass
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            yield captured
    finally:
        _flush_all()  # C stdio buffers filled inside go to the temporary file, not later to stdout
        for fd, saved in saved_fds:
            os.dup2(saved, fd)
            os.close(saved)
        try:
            tmp.seek(0)
            captured.write(tmp.read().decode("utf-8", "replace"))
        finally:
            tmp.close()


def call_with_timeout(fn: Callable[[], Any], timeout_s: float) -> tuple[bool, Any]:
    """Run ``fn`` in a daemon thread; (True, result) or (False, exception or TimeoutError).

    For vendor initialisation that may block in C (a wedged driver): the caller goes on
    after ``timeout_s`` and treats the backend as unavailable; the thread is abandoned.
    KeyboardInterrupt/SystemExit raised by ``fn`` are re-raised in the caller.
    """
    box: dict[str, Any] = {}

    def runner() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            box["error"] = exc

    thread = threading.Thread(target=runner, name="cockpit-telemetry-init", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return False, TimeoutError(f"did not return within {timeout_s:g} s")
    if "error" in box:
        if isinstance(box["error"], (KeyboardInterrupt, SystemExit)):
            raise box["error"]
        return False, box["error"]
    return True, box.get("result")


def open_backend(
    cls: Any, module: Any, loader: Callable[[], tuple[Any, str | None]], label: str
) -> tuple[Any, str | None]:
    """Shared ``open`` of the vendor backends: (backend, None) or (None, reason); never raises
    except KeyboardInterrupt/SystemExit. ``module``: an already initialised library module
    (a fake in tests); None loads the real one with ``loader``."""
    if module is None:
        module, reason = loader()
        if module is None:
            return None, reason
    try:
        backend = cls(module)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - any vendor failure means "not available"
        return None, f"{label} device discovery failed: {short_reason(exc)}"
    if not backend.device_count:
        backend.close()
        return None, f"{label} found no GPU"
    return backend, None


class VendorBackend:
    """Shared shape of the amdsmi and NVML backends: ``open`` and ``device_count``.

    Subclasses set ``label``, ``load`` (a staticmethod returning (module, reason)) and fill
    ``self._handles`` in ``__init__(module)``."""

    label = "GPU library"
    _handles: list[Any]

    @staticmethod
    def load() -> tuple[Any, str | None]:
        raise NotImplementedError

    @classmethod
    def open(cls, module: Any = None) -> tuple[Any, str | None]:
        """(backend, None) or (None, reason); never raises. ``module``: an initialised
        library-like module (the fakes in tests); None imports and initialises the real one."""
        return open_backend(cls, module, cls.load, cls.label)

    @property
    def device_count(self) -> int:
        return len(self._handles)
