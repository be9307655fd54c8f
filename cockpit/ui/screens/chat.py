"""Chat / compare: the same prompt to the base and the tuned model of a finished run, side by
side (stacked on a narrow terminal), streamed as it is generated.

Generation happens in ``cockpit chat RUN --jsonl`` (a long-lived subprocess: the chat worker, or
the vLLM backend with ``--vllm-url``), spoken to in the chat worker's JSON-lines protocol
(``cockpit.serve.chat_worker``). Its stdout is read by a thread worker; its stderr goes to
``RUN/logs/chat_worker.log`` and is shown when it exits early. The process is stopped when the
screen goes away. F5 asks the run's probes and marks each side pass/fail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from cockpit.store.rundir import RunDir
from cockpit.ui.palette import themed

SIDES = ("base", "tuned")


@dataclass
class Turn:
    """One request: a prompt (or a probe) and what each side answered so far."""

    rid: int
    prompt: str
    expect: list[str] | None = None  # a probe: substrings every passing answer contains
    text: dict[str, str] = field(default_factory=lambda: {s: "" for s in SIDES})
    streamed: dict[str, str] = field(default_factory=lambda: {s: "" for s in SIDES})  # the deltas alone
    deltas: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SIDES})
    ends: dict[str, dict] = field(default_factory=dict)  # side -> its {"end": true, ...} event
    error: str | None = None
    done: bool = False

    def ok(self, side: str) -> bool | None:
        if self.expect is None or side not in self.ends:
            return None
        from cockpit.data.probes import passes

        return passes(self.text[side], self.expect)


def turn_text(turn: Turn, side: str) -> Text:
    t = Text()
    t.append("› ", style=themed("bold $text-primary"))
    t.append(turn.prompt, style="bold")
    if turn.expect is not None:
        t.append(f"   [probe · expect {', '.join(turn.expect)}]", style="dim")
    t.append("\n")
    t.append(turn.text[side])
    end = turn.ends.get(side)
    if end is not None:
        if not turn.text[side]:
            t.append("(empty answer)", style="dim")
        ok = turn.ok(side)
        if ok is not None:
            t.append("\n✓ pass" if ok else "\n✗ fail", style=themed("bold $text-success" if ok else "bold $text-error"))
        meta = [
            f"{end['tokens']} tokens" if end.get("tokens") is not None else "",
            f"{end['seconds']:.1f} s" if end.get("seconds") is not None else "",
        ]
        meta_s = ", ".join(m for m in meta if m)
        if end.get("cancelled"):
            meta_s = ", ".join(filter(None, [meta_s, "cancelled"]))
        elif end.get("cut"):
            meta_s = ", ".join(filter(None, [meta_s, "cut at max_new_tokens"]))
        if meta_s:
            t.append(("  " if ok is not None else "\n") + f"({meta_s})", style="dim")
    elif turn.error:
        t.append(f"\nerror: {turn.error}", style=themed("$text-error"))
    elif not turn.done:
        t.append("▌", style="blink")
    t.append("\n\n")
    return t


class ChatScreen(Screen):
    BINDINGS = [
        Binding("f5", "probes", "Ask probes"),
        Binding("f6", "cancel", "Cancel"),
        Binding("ctrl+l", "clear", "Clear"),
        Binding("escape", "leave", "Back"),
    ]

    class Event(Message):
        """One protocol object from the chat process."""

        def __init__(self, ev: dict[str, Any]) -> None:
            super().__init__()
            self.ev = ev

    class Exited(Message):
        """The chat process's output ended: its exit code and the tail of its log."""

        def __init__(self, rc: int | None, tail: str) -> None:
            super().__init__()
            self.rc, self.tail = rc, tail

    def __init__(self, run: RunDir, start: Callable[[RunDir, str | None], Any] | None = None) -> None:
        """``start(run, vllm_url)`` returns the chat process (default ``cli_calls.ChatProcess``); tests
        pass one that replays recorded output."""
        super().__init__(name=f"chat-{run.run_id}")
        self.run = run
        self._start = start
        self.chat: Any = None  # a cli_calls.ChatProcess (or the tests' stand-in) once mounted
        self.ready: dict[str, Any] | None = None
        self.turns: dict[int, Turn] = {}
        self.next_id = 0
        self.probe_ids: list[int] = []
        self.closing = False
        self.exited = False
        self.status = ""

    def compose(self) -> ComposeResult:
        yield Static(id="chat-title", classes="screen-title")
        yield Static(id="chat-status", classes="pane")
        with Horizontal(id="chat-panes"):
            for side in SIDES:
                with VerticalScroll(id=f"chat-{side}-box", classes="chat-pane"):
                    yield Static(id=f"chat-{side}")
        yield Input(placeholder="a prompt for both models · Enter sends · F5 asks the run's probes", id="chat-input")
        image = Input(placeholder="an image for each prompt: a path (empty: none)", id="chat-image")
        image.display = False  # shown once the worker says its model reads images (a vision-language run)
        yield image
        yield Footer()

    def on_mount(self) -> None:
        from cockpit.ui.cli_calls import vllm_url

        self.app.sub_title = f"chat {self.run.run_id}"
        self.vllm_url = vllm_url(self.app)
        self.backend = f"vLLM at {self.vllm_url}" if self.vllm_url else "local (chat worker subprocess)"
        self.query_one("#chat-title", Static).update(
            Text.assemble(
                ("Chat — ", "bold"), (self.run.run_id, "bold"), ("   base | tuned, same prompt, greedy", "dim")
            )
        )
        for side in SIDES:
            self.query_one(f"#chat-{side}-box").border_title = side
        self.set_status(f"starting cockpit chat … loading the base and tuned models ({self.backend})", "$text-warning")
        self.query_one("#chat-input", Input).focus()
        try:
            if self._start is not None:
                self.chat = self._start(self.run, self.vllm_url)
            else:
                from cockpit.ui.cli_calls import ChatProcess

                self.chat = ChatProcess(self.run.path, self.vllm_url)
        except OSError as exc:
            self.set_status(f"cannot start cockpit chat: {exc}", "$text-error")
            return
        self._read()

    # -- the chat process ------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="chat-reader")
    def _read(self) -> None:
        import subprocess

        chat = self.chat
        while True:
            ev = chat.read()
            if ev is None:
                break
            self.post_message(self.Event(ev))
        try:
            rc = chat.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            rc = None
        self.post_message(self.Exited(rc, chat.stderr_tail()))

    def on_chat_screen_event(self, message: Event) -> None:
        ev = message.ev
        if "progress" in ev and self.ready is None:  # the worker's load, stage by stage
            self.set_status(f"{ev['progress']} … ({ev.get('elapsed_s', 0):.0f} s)")
            return
        if ev.get("ready"):
            self.ready = ev
            for side in SIDES:
                name = str(ev.get("base_model" if side == "base" else "adapter") or "")
                short = "/".join(name.rstrip("/").split("/")[-2:])  # a path's last two parts
                self.query_one(f"#chat-{side}-box").border_title = f"{side} · {short}" if short else side
            self.query_one("#chat-image", Input).display = bool(ev.get("reads_images"))
            self.set_status(self._progress_line(), "$text-success")
            return
        turn = self.turns.get(ev.get("id")) if ev.get("id") is not None else None
        if "error" in ev:
            if turn is not None:
                turn.error = str(ev["error"])
                turn.done = True
                self._draw()
            prefix = "fatal: " if ev.get("fatal") else ""
            self.set_status(f"{prefix}error from the chat process: {ev['error']}", "$text-error")
            return
        if turn is None:
            return
        side = ev.get("side")
        if "delta" in ev and side in SIDES:
            turn.text[side] += ev["delta"]
            turn.streamed[side] += ev["delta"]
            turn.deltas[side] += 1
        elif ev.get("end") and side in SIDES:
            turn.text[side] = ev.get("text", turn.text[side])  # the whole answer: authoritative
            turn.ends[side] = ev
        elif ev.get("done"):
            turn.done = True
            self.set_status(self._progress_line(), "$text-success")
        self._draw(side if side in SIDES else None)

    def on_chat_screen_exited(self, message: Exited) -> None:
        self.exited = True
        if self.closing:
            return
        for turn in self.turns.values():
            if not turn.done:
                turn.done, turn.error = True, turn.error or "the chat process exited"
        self._draw()
        why = message.tail.strip() or "(nothing in its log)"
        self.set_status(
            f"cockpit chat exited (code {message.rc}) — {why}\nlog: {getattr(self.chat, 'log_path', '?')}",
            "$text-error",
        )

    # -- drawing ---------------------------------------------------------------------------------
    def set_status(self, text: str, style: str = "") -> None:
        """``style``: a Textual style string (``"$text-error"``), resolved by the theme."""
        self.status = text
        self.query_one("#chat-status", Static).update(Content.styled(text, style))

    def _ready_line(self) -> str:
        r = self.ready or {}
        if self.vllm_url:
            where = f"backend vLLM at {self.vllm_url} (base {r.get('base_model')!r}, tuned {r.get('adapter')!r})"
        else:
            load = f", loaded in {r['load_s']:.1f} s" if r.get("load_s") is not None else ""
            where = f"backend local: chat worker on {r.get('device')} ({r.get('dtype')}{load})"
        images = (
            " · a vision-language model: an image's path below goes with each prompt" if r.get("reads_images") else ""
        )
        return f"ready · {where} · type a prompt, F5 asks the probes{images}"

    def _progress_line(self) -> str:
        pending = sum(1 for t in self.turns.values() if not t.done)
        line = self._ready_line() if not pending else f"generating … {pending} request(s) in flight (F6 cancels)"
        probes = [self.turns[i] for i in self.probe_ids]
        if probes:
            finished = [t for t in probes if all(s in t.ends for s in SIDES)]
            counts = {s: sum(1 for t in finished if t.ok(s)) for s in SIDES}
            line += f"\nprobes ({len(finished)}/{len(probes)} answered): base {counts['base']}/{len(probes)} pass, tuned {counts['tuned']}/{len(probes)} pass"
        return line

    def pane_text(self, side: str) -> Text:
        t = Text()
        for turn in self.turns.values():
            t.append_text(turn_text(turn, side))
        return t

    def _draw(self, side: str | None = None) -> None:
        for s in (side,) if side else SIDES:
            self.query_one(f"#chat-{s}", Static).update(self.pane_text(s))
            self.query_one(f"#chat-{s}-box", VerticalScroll).scroll_end(animate=False)

    # -- requests --------------------------------------------------------------------------------
    def ask(self, prompt: str, expect: list[str] | None = None, image: Path | None = None) -> int | None:
        """Send one prompt; ``image``: an image probe's own (else the image field's, when filled)."""
        if self.chat is None or self.exited:
            self.set_status("the chat process is not running: leave (Esc) and open the chat again", "$text-error")
            return None
        usable, field_image = self._image() if image is None else (True, image)
        if not usable:
            return None
        image = field_image
        self.next_id += 1
        rid = self.next_id
        req: dict[str, Any] = {"id": rid, "prompt": prompt, **({"images": [str(image)]} if image else {})}
        if not self.chat.send(req):
            self.set_status("the chat process does not take requests any more (see its log)", "$text-error")
            return None
        self.turns[rid] = Turn(rid, f"[{image.name}] {prompt}" if image else prompt, expect)
        self._draw()
        if self.ready is not None:
            self.set_status(self._progress_line(), "$text-warning")
        return rid

    def _image(self) -> tuple[bool, Path | None]:
        """(usable, the image field's file, absolute): None when the field is hidden or empty; not usable (said
        in the status line) when its path is not a file."""
        box = self.query_one("#chat-image", Input)
        if not (box.display and box.value.strip()):
            return True, None
        path = Path(box.value.strip()).expanduser().resolve()
        if not path.is_file():
            self.set_status(f"no such image file: {path}", "$text-error")
            return False, None
        return True, path

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "chat-image":  # Enter in the image field: on to the prompt
            self.query_one("#chat-input", Input).focus()
            return
        prompt = event.value.strip()
        if not prompt:
            return
        if self.ask(prompt) is not None:  # refused (no such image): the prompt stays to send again
            event.input.value = ""

    def action_probes(self) -> None:
        from cockpit.errors import InputError
        from cockpit.serve.artifacts import load_run, load_run_probes

        try:
            probes = load_run_probes(load_run(self.run))
        except InputError as exc:
            self.set_status(f"no probes to ask: {exc}", "$text-error")
            return
        self.probe_ids = []
        for p in probes:
            rid = self.ask(p["prompt"], p["expect"], Path(p["image_path"]) if p.get("image_path") else None)
            if rid is None:
                return
            self.probe_ids.append(rid)
        if self.ready is None:
            self.set_status(f"{len(probes)} probes queued; the models are still loading …", "$text-warning")

    def action_cancel(self) -> None:
        if self.chat is not None and any(not t.done for t in self.turns.values()):
            self.chat.send({"cancel": True})

    def action_clear(self) -> None:
        self.turns = {rid: t for rid, t in self.turns.items() if not t.done}
        self.probe_ids = [i for i in self.probe_ids if i in self.turns]
        self._draw()

    def action_leave(self) -> None:
        self.app.sub_title = ""
        self.dismiss()

    def on_unmount(self) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the chat process (idempotent): no orphan survives the screen."""
        self.closing = True
        if self.chat is not None:
            self.chat.close()


def open_chat(app, run: RunDir) -> None:
    """The chat screen of ``run`` on top of the Runs mode (the command palette's "Chat: RUN")."""
    app.show_on_runs(ChatScreen(run))
