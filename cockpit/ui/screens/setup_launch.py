"""The Setup screen's launches: Launch (the doctor's checks for this config first, then ``cockpit train
--detach``), Queue (``cockpit queue add``), Launch on Slurm (``cockpit train --slurm``) and Tune (``cockpit
tune``), each a subprocess in a worker, answered by a message handled on the UI thread.
:class:`cockpit.ui.screens.setup.SetupScreen` is this screen with its form."""

from __future__ import annotations

import shlex
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Button, Input, Static

from cockpit.ui import cli_calls, forms
from cockpit.ui.forms import FormModel
from cockpit.ui.messages import WorkerMessage

if TYPE_CHECKING:
    from textual import getters

    from cockpit.ui.app import CockpitApp


def sbatch_options_modal():
    from cockpit.ui.screens.modals import Prompt

    class SbatchOptions(Prompt):
        """Enter with nothing typed: the cluster's defaults (''); Esc: None."""

        def on_input_submitted(self, event) -> None:
            event.prevent_default()  # not Prompt's handler too (it would dismiss a second time)
            self.dismiss(event.value.strip())

    return SbatchOptions


def _wid(field_id: str) -> str:
    return f"f-{field_id}"


_doctor_lock = threading.Lock()


def doctor_checks(app, needs=()) -> tuple[list[dict] | None, str]:
    """``cockpit doctor --json [--needs TAGS]`` for this session: the app's injected checks (a list: for
    every set of needs; a mapping: per set, ``"cuda,gpu,rocm"``, ``""`` none; a set it lacks asks the
    doctor), else run once per set of needs (a subprocess: the doctor imports torch) and kept on the app.
    Blocking: call it from a thread worker. Returns (checks or None, error text)."""
    key = ",".join(sorted(needs))
    injected = getattr(app, "doctor_checks", None)
    if isinstance(injected, Mapping):
        injected = injected.get(key)
    if injected is not None:
        return injected, ""
    with _doctor_lock:
        cache = getattr(app, "_doctor_cache", None)
        if cache is None:
            cache = app._doctor_cache = {}
        if key not in cache:
            res = cli_calls.run_cli("doctor", "--json", *(["--needs", key] if key else []), timeout=300)
            if not isinstance(res.data, list):
                return None, res.error_text
            cache[key] = res.data
        return cache[key], ""


class SetupLaunch(Screen):
    """The launch actions of the Setup screen (its base class): the form's state they read is set by
    :class:`cockpit.ui.screens.setup.SetupScreen`."""

    if TYPE_CHECKING:  # as Textual types MessagePump.app, for mypy only: the attributes used on the app are checked
        app = getters.app(CockpitApp)
        # set by SetupScreen
        model: FormModel
        checked: forms.Checked | None
        secrets: dict[str, str]
        _launching: bool
        _tuning: bool

        def _config_file(self, folder: Path, stem: str, extra: dict | None = None) -> Path: ...
        def _run_name(self) -> str: ...
        def validate_now(self) -> None: ...

    _launch_line = ""  # "launching: cockpit train NAME --detach …", above the launch's current stage
    _launch_t0 = 0.0

    # what the workers tell the screen (each a subprocess's answer, handled on the UI thread below)
    class Preflighted(WorkerMessage):
        """The doctor's checks that block this config (``result``), or why the doctor did not run."""

        def __init__(self, result: list, error: str) -> None:
            super().__init__(result)
            self.error = error

    class Launched(WorkerMessage):
        """``cockpit train --detach`` answered (a ``cli_calls.CliResult``)."""

    class LaunchStage(WorkerMessage):
        """A line of ``cockpit train --detach --progress``'s stderr, as it is written (``result``)."""

    class SlurmSubmitted(WorkerMessage):
        """``cockpit train --slurm`` answered (a ``cli_calls.CliResult``)."""

    class Tuned(WorkerMessage):
        """``cockpit tune --json`` answered (a ``cli_calls.CliResult``)."""

    class Queued(WorkerMessage):
        """``cockpit queue add --json`` answered (a ``cli_calls.CliResult``)."""

    def _set_launching(self, on: bool, message: str = "") -> None:
        self._launching = on
        self.query_one("#b-launch", Button).disabled = on
        if message:
            self.query_one("#problems", Static).update(Content.styled(message, "bold $text-warning"))

    def action_launch(self) -> None:
        if self._launching:
            return
        if not (self.checked and self.checked.ok):
            self.notify("fix the config problems first", severity="error")
            return
        self._set_launching(True, "checking this machine for this config (cockpit doctor --json) …")
        self._preflight(self.checked.cfg.keys_only())

    @work(thread=True, exclusive=True, group="preflight")
    def _preflight(self, cfg: Mapping[str, Any]) -> None:
        from cockpit.doctor.relevance import blocking_for_config, config_tags

        checks, err = doctor_checks(self.app, config_tags(cfg))
        self.post_message(self.Preflighted(blocking_for_config(checks or [], cfg), err))

    @on(Preflighted)
    def _after_doctor(self, message: Preflighted) -> None:
        from cockpit.ui import formatting
        from cockpit.ui.screens.modals import Decide

        blocking, err = message.result, message.error

        if err:
            self.notify(f"cockpit doctor did not run, launching without it: {err[-300:]}", severity="warning")
        if not blocking:
            self._start_launch()
            return

        def done(anyway: bool | None) -> None:
            if anyway:
                self._start_launch()
            else:
                self._set_launching(False)
                self.validate_now()
                self.notify(
                    "launch cancelled: fix the doctor's findings (F4 Doctor) or launch anyway", severity="warning"
                )

        self.app.push_screen(
            Decide(
                f"Doctor: {len(blocking)} problem(s) for this config",
                formatting.blocking_checks(blocking),
                "Launch anyway",
                "Cancel",
            ),
            done,
        )

    def _start_launch(self) -> None:
        runs_dir = Path(self.app.runs_dir)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        # the run is named by the preset (or the user's run_name): the run id adds the one timestamp
        name = self._run_name()
        path = self._config_file(runs_dir / ".ui-configs", f"{name}-{stamp}", {"run_name": name})
        self._launch_line = f"launching: cockpit train {path.name} --detach …"
        self._launch_t0 = time.monotonic()
        self._set_launching(True, f"{self._launch_line}\n(checks the data, starts the supervisor)")
        self._launch(path, runs_dir)

    @work(thread=True, exclusive=True, group="launch")
    def _launch(self, path: Path, runs_dir: Path) -> None:
        def said(line: str) -> None:
            self.post_message(self.LaunchStage(line))

        res = cli_calls.train_detached(path, runs_dir, secrets=self.secrets, on_stage=said)
        self.post_message(self.Launched(res))

    @on(LaunchStage)
    def _on_launch_stage(self, message: LaunchStage) -> None:
        line = str(message.result)
        if self._launching and line.startswith("stage: "):
            elapsed = time.monotonic() - self._launch_t0
            self._set_launching(True, f"{self._launch_line}\n{line.removeprefix('stage: ')} … ({elapsed:.0f} s)")

    @on(Launched)
    def _on_launched(self, message: Launched) -> None:
        self._launched(message.result)

    def _launched(self, res: cli_calls.CliResult) -> None:
        from cockpit.store.rundir import RunDir

        self._set_launching(False)
        if res.rc == 0 and isinstance(res.data, dict) and res.data.get("run_dir"):
            self.validate_now()
            self.app.open_live(RunDir(Path(res.data["run_dir"])))
            return
        self.query_one("#problems", Static).update(
            Content.styled(f"launch failed (exit {res.rc}):\n{res.error_text}", "$text-error")
        )

    # -- the run queue: cockpit queue add (runs start in order as the GPUs they need come free) ------
    def action_queue_run(self) -> None:
        if self._launching:
            return
        if not (self.checked and self.checked.ok):
            self.notify("fix the config problems first", severity="error")
            return
        runs_dir = Path(self.app.runs_dir)
        name = self._run_name()
        path = self._config_file(
            runs_dir / ".ui-configs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}", {"run_name": name}
        )
        if self.secrets:  # they reach a run through the launching command's environment, not the queue's
            self.notify(
                "this config holds secrets (tokens): launch it (F8); a queued run would start without them",
                severity="error",
            )
            return
        self._set_launching(True, f"queueing: cockpit queue add {path.name} … (checks the data)")
        self._queue(path, runs_dir)

    @work(thread=True, exclusive=True, group="launch")
    def _queue(self, path: Path, runs_dir: Path) -> None:
        self.post_message(self.Queued(cli_calls.queue_add(path, runs_dir)))

    @on(Queued)
    def _on_queued(self, message: Queued) -> None:
        res = message.result
        self._set_launching(False)
        if res.rc == 0 and isinstance(res.data, dict) and res.data.get("id"):
            where = f"position {res.data['position']}" if res.data.get("position") else "next: starting now"
            self.notify(f"queued {res.data['id']} ({where}); F3 Runs shows the queue")
            return
        self.query_one("#problems", Static).update(
            Content.styled(f"queueing failed (exit {res.rc}):\n{res.error_text}", "$text-error")
        )

    # -- Slurm: cockpit train --slurm (the button is there when sbatch is on PATH) ------------------
    def action_launch_slurm(self) -> None:
        if self._launching:
            return
        if not (self.checked and self.checked.ok):
            self.notify("fix the config problems first", severity="error")
            return

        def submit(options: str | None) -> None:
            if options is None:  # Esc
                return
            try:
                sbatch_args = shlex.split(options or "")
            except ValueError as exc:
                self.notify(f"sbatch options: {exc}", severity="error")
                return
            runs_dir = Path(self.app.runs_dir)
            path = self._config_file(runs_dir / ".ui-configs", f"{self._run_name()}-{time.strftime('%Y%m%d-%H%M%S')}")
            self._set_launching(True, f"submitting: cockpit train {path.name} --slurm {' '.join(sbatch_args)} …")
            self._submit_slurm(path, runs_dir, sbatch_args)

        self.app.push_screen(
            sbatch_options_modal()(
                "sbatch options (e.g. --partition=mi300x --time=4:00:00 --account=proj; empty: the cluster's defaults)"
            ),
            submit,
        )

    @work(thread=True, exclusive=True, group="launch")
    def _submit_slurm(self, path: Path, runs_dir: Path, sbatch_args: list[str]) -> None:
        res = cli_calls.run_cli(
            "train",
            str(path),
            "--slurm",
            "--json",
            "--runs-dir",
            str(runs_dir),
            *(f"--sbatch-arg={a}" for a in sbatch_args),
            env=self.secrets,  # sbatch passes its environment to the job
        )
        self.post_message(self.SlurmSubmitted(res))

    @on(SlurmSubmitted)
    def _submitted(self, message: SlurmSubmitted) -> None:
        res: cli_calls.CliResult = message.result
        if res.rc == 0 and isinstance(res.data, dict) and res.data.get("job_id"):
            self.notify(f"queued as Slurm job {res.data['job_id']}: the Live screen follows it once the job starts")
        self._launched(res)

    # -- tune: cockpit tune measures micro-batch x accumulation on this machine -------------------
    def action_tune(self) -> None:
        if self._tuning:
            self.notify("cockpit tune is already running", severity="warning")
            return
        if not (self.checked and self.checked.ok):
            self.notify("fix the config problems first", severity="error")
            return
        folder = Path(tempfile.mkdtemp(prefix="cockpit-tune-"))
        path = self._config_file(folder, self._run_name())
        self._tuning = True
        self.query_one("#b-tune", Button).disabled = True
        self.notify("cockpit tune: trying micro-batch sizes on this machine (a subprocess; minutes) …")
        self._tune(path, folder / f"{self._run_name()}.tuned.yaml")

    @work(thread=True, exclusive=True, group="tune")
    def _tune(self, path: Path, out: Path) -> None:
        self.post_message(
            self.Tuned(
                cli_calls.run_cli("tune", str(path), "--json", "--out", str(out), timeout=3600, env=self.secrets)
            )
        )

    @on(Tuned)
    def _tuned(self, message: Tuned) -> None:
        from cockpit.ui import formatting
        from cockpit.ui.screens.modals import Decide, TextView

        res: cli_calls.CliResult = message.result

        self._tuning = False
        self.query_one("#b-tune", Button).disabled = False
        data = res.data if isinstance(res.data, dict) else None
        if data is None:
            missing = "invalid choice: 'tune'" in (res.stderr or "")
            why = (
                "this cockpit has no `cockpit tune` command yet (issue #8): set micro-batch and accumulation by hand"
                if missing
                else f"cockpit tune failed (exit {res.rc}): {res.error_text[-600:]}"
            )
            self.notify(why, severity="error", timeout=15)
            return
        chosen = data.get("chosen") or {}
        mb, acc = chosen.get("per_device_train_batch_size"), chosen.get("gradient_accumulation_steps")
        if not (data.get("ok") and mb):
            self.app.push_screen(TextView("cockpit tune: nothing to use", formatting.tune_table(data)))
            return

        def done(use: bool | None) -> None:
            if not use:
                return
            for fid, value in (("per_device_train_batch_size", mb), ("gradient_accumulation_steps", acc)):
                if value is not None:
                    self.model.values[fid] = str(value)
                    self.query_one(f"#{_wid(fid)}", Input).value = str(value)
            self.validate_now()
            self.notify(f"micro-batch {mb}, accumulation {acc} (from cockpit tune)")

        self.app.push_screen(
            Decide(
                "cockpit tune: the trials",
                formatting.tune_table(data),
                f"Use micro-batch {mb}, accumulation {acc}",
                "Keep mine",
                danger=False,
            ),
            done,
        )
