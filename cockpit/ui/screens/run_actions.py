"""What an ended run offers, on the Summary and the Runs screen alike: merge, export, serve, chat,
resume (a stopped, failed or lost run) and delete. Each goes through the CLI (``cockpit
export|serve|chat|resume|rm``) in a subprocess."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on, work
from textual.binding import Binding
from textual.screen import Screen

from cockpit.store.rundir import TERMINAL_STATES, RunDir
from cockpit.ui.cli_calls import vllm_url
from cockpit.ui.messages import WorkerMessage, post_or_run
from cockpit.ui.palette import themed

ACTION_BINDINGS = [
    Binding("c", "chat", "Chat"),
    Binding("s", "serve", "Serve"),
    Binding("m", "export(True)", "Merge+export"),
    Binding("e", "export(False)", "Export adapter"),
    Binding("R", "resume", "Resume"),
    Binding("delete", "delete", "Delete"),
]
ENDED_HOW = {
    "stopped": "was stopped",
    "killed": "was killed",
    "failed": "failed",
    "lost": "was lost",
}  # the resume question
RESUMABLE = TERMINAL_STATES - {"finished"}  # what cockpit resume continues: stopped, failed, killed, lost, ...


def serve_text(res, url: str | None) -> Text:
    """``cockpit serve RUN --json``'s result, for a person: the command to start, or the hand-off."""
    data = res.data if isinstance(res.data, dict) else None
    if res.rc != 0 or data is None:
        return Text(f"cockpit serve failed: {res.error_text}", style=themed("$text-error"))
    t = Text()
    if "command" in data:
        what = "base model + adapter" if data.get("mode") == "adapter" else "the merged model"
        t.append(f"Start vLLM serving {what}:\n\n", style="bold")
        t.append(data["command"] + "\n\n", style=themed("$text-primary"))
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
    t.append(f"Loaded into {data.get('url') or url}: model {data.get('model')!r}", style=themed("bold $text-success"))
    t.append(f" (base {data.get('base_model_id')!r}, LoRA rank {data.get('lora_rank')})\n")
    probe = data.get("probe")
    if probe:
        from cockpit.serve.side_by_side import side_by_side

        t.append(f"\nprobe: {probe.get('prompt')}\n", style="bold")
        t.append(side_by_side(probe.get("base", ""), probe.get("tuned", ""), width=96))
    return t


def export_text(res) -> tuple[Text, bool]:
    """``cockpit export RUN --json``'s result, for a person, and whether it worked."""
    ok = res.rc == 0 and isinstance(res.data, dict)
    if not ok:
        return Text(f"export failed: {res.error_text}", style=themed("$text-error")), False
    msg = Text(f"exported {res.data.get('kind')} to {res.data.get('path')}", style=themed("$text-success"))
    for n in res.data.get("notes") or []:
        msg.append(f"\nnote: {n}", style="dim")
    return msg, True


def delete_question(run: RunDir, plan: dict) -> str:
    """The confirmation for deleting ``run``, from ``cockpit rm --dry-run --json``: what goes, what stays."""
    from cockpit.run.remove import fmt_bytes

    found = (plan.get("runs") or [{}])[0]
    parts = ", ".join(
        f"{k} {fmt_bytes(v)}" for k, v in sorted((found.get("parts") or {}).items(), key=lambda kv: -kv[1])
    )
    text = f"Delete {run.run_id} ({found.get('state')})? {fmt_bytes(plan.get('freed_bytes') or 0)} freed"
    text += f" ({parts})." if parts else "."
    if found.get("output_dir"):
        text += f" Its output_dir {found['output_dir']} stays."
    return text


class RunMessage(WorkerMessage):
    """A worker's answer about one run: ``result`` (a ``cli_calls.CliResult``) and ``run``."""

    def __init__(self, result: Any, run: RunDir) -> None:
        super().__init__(result)
        self.run = run


class RunActionsMixin(Screen):
    """Base of a Screen (Summary, Runs): ``action_target()`` names the run; merge / export / serve /
    chat act on it when it has ended, and say so when it has not. The workers post
    :class:`Exported` / :class:`Served`, handled here."""

    class Exported(RunMessage):
        """``cockpit export RUN --json`` answered: ``result`` the ``cli_calls.CliResult``, ``run`` the run."""

    class Resumed(RunMessage):
        """``cockpit resume RUN --detach --json`` answered (a ``cli_calls.CliResult``)."""

    class Deleted(RunMessage):
        """``cockpit rm RUN --yes --json`` answered (a ``cli_calls.CliResult``)."""

    class Served(WorkerMessage):
        """``cockpit serve RUN --json`` answered: ``result`` the ``cli_calls.CliResult``, ``url`` the server."""

        def __init__(self, result: Any, run: RunDir, url: str | None) -> None:
            super().__init__(result)
            self.run, self.url = run, url

    def action_target(self) -> RunDir | None:
        raise NotImplementedError

    def show_action_progress(self, msg: str) -> None:
        self.notify(msg, timeout=4, markup=False)

    def show_action_result(self, title: str, msg: Text, ok: bool) -> None:
        self.notify(msg.plain, title=title, severity="information" if ok else "error", timeout=15, markup=False)

    def _finished_target(self) -> RunDir | None:
        run = self.action_target()
        if run is None:
            return None
        state = run.read_status().get("state")
        if state not in TERMINAL_STATES:
            self.notify(
                f"{run.run_id} is still {state or 'starting'}: merge, export, serve and chat need a finished run",
                severity="warning",
            )
            return None
        return run

    def action_chat(self) -> None:
        run = self._finished_target()
        if run is not None:
            from cockpit.ui.screens.chat import ChatScreen

            self.app.push_screen(ChatScreen(run))

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
        from cockpit.ui import cli_calls

        res = cli_calls.export_run(run.path, merge)
        if not self.post_message(self.Exported(res, run)):  # the screen was left meanwhile: a notification
            RunActionsMixin.show_action_result(
                self, f"export {run.run_id}", *export_text(res)
            )  # (App.notify is thread-safe)

    @on(Exported)
    def _exported(self, message: Exported) -> None:
        self.show_action_result(f"export {message.run.run_id}", *export_text(message.result))

    def action_serve(self) -> None:
        run = self._finished_target()
        if run is None:
            return
        url = vllm_url(self.app)
        self.show_action_progress(
            f"hot-loading the adapter into {url} …" if url else "cockpit serve: building the vllm serve command …"
        )
        self._serve(run, url)

    @work(thread=True, exclusive=True, group="serve")
    def _serve(self, run: RunDir, url: str | None) -> None:
        from cockpit.ui import cli_calls

        # the command (or the hand-off) is shown even when the person left the screen meanwhile
        post_or_run(self, self.Served(cli_calls.serve_run(run.path, url), run, url), self._served)

    @on(Served)
    def _served(self, message: Served) -> None:
        from cockpit.ui.screens.modals import TextView

        title = f"Serve {message.run.run_id}" + (f" — {message.url}" if message.url else " — vllm serve")
        self.app.push_screen(TextView(title, serve_text(message.result, message.url)))

    # -- resume / delete --------------------------------------------------------------------
    def action_resume(self) -> None:
        run = self.action_target()
        if run is not None:
            self.resume_selected(run)

    def resume_selected(self, run: RunDir) -> None:
        from cockpit.ui.screens.modals import Confirm

        state = run.read_status().get("state")
        if state not in RESUMABLE:
            self.notify(f"{run.run_id} is {state or 'starting'}: resume continues a run that ended before finishing")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.show_action_progress(f"resuming {run.run_id} from its last good checkpoint … (cockpit resume)")
                self._resume(run)

        how = ENDED_HOW.get(str(state), f"ended {state}")
        question = (
            f"Resume {run.run_id}?\nIt {how} before its last step. It goes on from its last good checkpoint,"
            " as a new attempt in the same run dir."
        )
        self.app.push_screen(Confirm(question, "Resume", danger=False), answered)

    @work(thread=True, exclusive=True, group="resume")
    def _resume(self, run: RunDir) -> None:
        from cockpit.ui import cli_calls

        res = cli_calls.run_cli("resume", str(run.path), "--detach", "--json", timeout=900)
        post_or_run(self, self.Resumed(res, run), self._resumed)

    @on(Resumed)
    def _resumed(self, message: Resumed) -> None:
        res = message.result
        if res.rc == 0 and isinstance(res.data, dict):
            self.notify(f"{message.run.run_id}: attempt {res.data.get('attempt')} from {res.data.get('checkpoint')}")
            self.app.open_live(message.run)  # type: ignore[attr-defined]  # the CockpitApp
        else:
            self.show_action_result(f"resume {message.run.run_id}", Text(f"resume failed: {res.error_text}"), False)

    def action_delete(self) -> None:
        run = self.action_target()
        if run is None:
            return
        state = run.read_status().get("state")
        if state not in TERMINAL_STATES:
            self.notify(f"{run.run_id} is still {state or 'starting'}: stop it first (x on its Live screen)")
            return
        self._plan_delete(run)

    class DeletePlanned(RunMessage):
        """``cockpit rm RUN --dry-run --json`` answered: what deleting would free."""

    @work(thread=True, exclusive=True, group="delete")
    def _plan_delete(self, run: RunDir) -> None:
        from cockpit.ui import cli_calls

        self.post_message(self.DeletePlanned(cli_calls.run_cli("rm", str(run.path), "--dry-run", "--json"), run))

    @on(DeletePlanned)
    def _confirm_delete(self, message: DeletePlanned) -> None:
        from cockpit.ui.screens.modals import Confirm

        run, data = message.run, message.result.data
        if not isinstance(data, dict) or data.get("error"):
            why = data.get("error") if isinstance(data, dict) else message.result.error_text
            self.notify(f"cannot delete {run.run_id}: {why}", severity="error")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._delete(run)

        self.app.push_screen(Confirm(delete_question(run, data), "Delete"), answered)

    @work(thread=True, exclusive=True, group="delete")
    def _delete(self, run: RunDir) -> None:
        from cockpit.ui import cli_calls

        post_or_run(self, self.Deleted(cli_calls.run_cli("rm", str(run.path), "--yes", "--json"), run), self._deleted)

    @on(Deleted)
    def _deleted(self, message: Deleted) -> None:
        res = message.result
        if res.rc != 0:
            self.show_action_result(f"delete {message.run.run_id}", Text(f"cockpit rm failed: {res.error_text}"), False)
            return
        self.notify(f"deleted {message.run.run_id}")
        self.after_delete(message.run)

    def after_delete(self, run: RunDir) -> None:
        """The run dir is gone: the screen follows (Runs redraws, Summary goes back)."""
