"""What a finished run offers, on the Summary and the Runs screen alike: merge, export, serve,
chat. Each goes through the CLI (``cockpit export|serve|chat``) in a subprocess."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.binding import Binding

from cockpit.run.rundir import TERMINAL_STATES, RunDir
from cockpit.ui.proc import vllm_url

ACTION_BINDINGS = [
    Binding("c", "chat", "Chat"),
    Binding("s", "serve", "Serve"),
    Binding("m", "export(True)", "Merge+export"),
    Binding("e", "export(False)", "Export adapter"),
]


def serve_text(res, url: str | None) -> Text:
    """``cockpit serve RUN --json``'s result, for a person: the command to start, or the hand-off."""
    data = res.data if isinstance(res.data, dict) else None
    if res.rc != 0 or data is None:
        return Text(f"cockpit serve failed: {res.error_text}", style="red")
    t = Text()
    if "command" in data:
        what = "base model + adapter" if data.get("mode") == "adapter" else "the merged model"
        t.append(f"Start vLLM serving {what}:\n\n", style="bold")
        t.append(data["command"] + "\n\n", style="cyan")
        for k, v in (data.get("env") or {}).items():
            t.append(f"env {k}={v}\n", style="dim")
        t.append(f"The tuned model is served as {data.get('model')!r} on {data.get('url')}/v1 (OpenAI API)")
        if data.get("base_model_id"):
            t.append(f", the base as {data['base_model_id']!r}")
        t.append(
            ".\n\nSet COCKPIT_VLLM_URL to a running server to hot-load the adapter from here instead;"
            " `cockpit serve RUN --start` starts this command detached.",
            style="dim",
        )
        return t
    t.append(f"Loaded into {data.get('url') or url}: model {data.get('model')!r}", style="bold green")
    t.append(f" (base {data.get('base_model_id')!r}, LoRA rank {data.get('lora_rank')})\n")
    probe = data.get("probe")
    if probe:
        from cockpit.serve.compare import side_by_side

        t.append(f"\nprobe: {probe.get('prompt')}\n", style="bold")
        t.append(side_by_side(probe.get("base", ""), probe.get("tuned", ""), width=96))
    return t


class RunActions:
    """Mixin for a Screen: ``action_target()`` names the run; merge / export / serve / chat act on
    it when it has ended, and say so when it has not."""

    def action_target(self) -> RunDir | None:
        raise NotImplementedError

    def show_action_progress(self, msg: str) -> None:
        self.notify(msg, timeout=4, markup=False)  # type: ignore[attr-defined]

    def show_action_result(self, title: str, msg: Text, ok: bool) -> None:
        self.notify(msg.plain, title=title, severity="information" if ok else "error", timeout=15, markup=False)  # type: ignore[attr-defined]

    def _finished_target(self) -> RunDir | None:
        run = self.action_target()
        if run is None:
            return None
        state = run.read_status().get("state")
        if state not in TERMINAL_STATES:
            self.notify(  # type: ignore[attr-defined]
                f"{run.run_id} is still {state or 'starting'}: merge, export, serve and chat need a finished run",
                severity="warning",
            )
            return None
        return run

    def action_chat(self) -> None:
        run = self._finished_target()
        if run is not None:
            from cockpit.ui.screens.chat import ChatScreen

            self.app.push_screen(ChatScreen(run))  # type: ignore[attr-defined]

    def action_export(self, merge: bool) -> None:
        run = self._finished_target()
        if run is None:
            return
        self.show_action_progress(
            ("merging the adapter into the base model" if merge else "exporting the adapter")
            + " … (cockpit export in a subprocess)"
        )
        self._export(run, merge)

    @work(thread=True, exclusive=True, group="export")
    def _export(self, run: RunDir, merge: bool) -> None:
        from cockpit.ui import proc

        res = proc.export_run(run.path, merge)
        ok = res.rc == 0 and isinstance(res.data, dict)
        if ok:
            msg = Text(f"exported {res.data.get('kind')} to {res.data.get('path')}", style="green")
            for n in res.data.get("notes") or []:
                msg.append(f"\nnote: {n}", style="dim")
        else:
            msg = Text(f"export failed: {res.error_text}", style="red")
        self.app.call_from_thread(self.show_action_result, f"export {run.run_id}", msg, ok)  # type: ignore[attr-defined]

    def action_serve(self) -> None:
        run = self._finished_target()
        if run is None:
            return
        url = vllm_url(self.app)  # type: ignore[attr-defined]
        self.show_action_progress(
            f"hot-loading the adapter into {url} …" if url else "cockpit serve: building the vllm serve command …"
        )
        self._serve(run, url)

    @work(thread=True, exclusive=True, group="serve")
    def _serve(self, run: RunDir, url: str | None) -> None:
        from cockpit.ui import proc
        from cockpit.ui.screens.modals import TextView

        res = proc.serve_run(run.path, url)
        title = f"Serve {run.run_id}" + (f" — {url}" if url else " — vllm serve")
        self.app.call_from_thread(self.app.push_screen, TextView(title, serve_text(res, url)))  # type: ignore[attr-defined]
