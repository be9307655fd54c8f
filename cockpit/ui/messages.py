"""What the screens' thread workers tell their screen.

A worker (``@work(thread=True)``: a subprocess, a file read) ends by posting a message to its
screen with ``self.post_message(...)`` (thread-safe in Textual, and it does not wait); the screen
handles it with ``@on(MessageType)`` on the UI thread, where widgets are touched and Rich text is
built (``palette.themed`` sees the app's theme there). Each screen declares its messages as
subclasses of :class:`WorkerMessage` next to the worker that posts them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from textual.message import Message
from textual.screen import Screen

M = TypeVar("M", bound=Message)


class WorkerMessage(Message):
    """What a screen's worker tells it: ``result``, what it found (a ``cli_calls.CliResult``, data), if any."""

    bubble = False  # the screen's own news: not passed on to the app

    def __init__(self, result: Any = None) -> None:
        super().__init__()
        self.result = result


def post_or_run(screen: Screen, message: M, handler: Callable[[M], object]) -> None:
    """Post ``message`` to ``screen``; when the screen was closed while the worker ran (the person
    left it), run ``handler`` anyway: a relaunched run is still opened, a failure still told.

    ``App.call_from_thread`` stays here on purpose: a closed screen takes no messages, and the
    result must reach the app from the worker's thread all the same."""
    if not screen.post_message(message):
        screen.app.call_from_thread(handler, message)
