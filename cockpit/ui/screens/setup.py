"""The Setup screen: forms grouped like the schema, presets, validation as you type (the same
``validate`` and messages as ``cockpit check``), the fit line, the data check, preview; its launches
(launch, queue, Slurm, tune) are in :mod:`cockpit.ui.screens.setup_launch`.

Opening it with no preset loads ``cpu-demo`` at once, then ``cockpit doctor --json`` (a worker,
a subprocess) tells which presets this machine calls for: they go first in the picker, and the
first replaces cpu-demo while the form is untouched. Launch first looks at the doctor's results
that matter for the config (:mod:`cockpit.doctor.relevance`); the doctor runs once per session
(per set of needs) and is cached on the app."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.timer import Timer
from textual.widgets import Button, Checkbox, Footer, Input, Label, Select, Static, TabbedContent, TabPane

from cockpit.ui import cli_calls, forms, presets
from cockpit.ui.forms import FIELDS, GROUPS, FormModel
from cockpit.ui.messages import WorkerMessage
from cockpit.ui.palette import themed
from cockpit.ui.screens.setup_launch import SetupLaunch, _wid, doctor_checks
from cockpit.ui.widgets import Bearings, TickBox, machine_of

if TYPE_CHECKING:
    from textual import getters

    from cockpit.config.run_config import RunConfig
    from cockpit.ui.app import CockpitApp


def slurm_submit_available() -> bool:
    """ "Launch on Slurm" is offered where sbatch is on PATH (COCKPIT_SLURM=0 hides it, =1 shows it)."""
    forced = os.environ.get("COCKPIT_SLURM", "").strip()
    return forced == "1" if forced in ("0", "1") else shutil.which("sbatch") is not None


TABS = Binding.Group("Tab")  # Ctrl+← and Ctrl+→: one footer entry
DATA_PROMPT = "F5 runs `cockpit check --json` on this config (tokenizer + data, in a subprocess)."


def preset_dirs() -> tuple[Path, ...]:
    return (presets.REPO_PRESETS, presets.user_presets_dir())


def _home_short(path: Path) -> str:
    home = str(Path.home())
    return "~" + str(path)[len(home) :] if str(path).startswith(home + os.sep) else str(path)


class SetupScreen(SetupLaunch):
    if TYPE_CHECKING:  # as Textual types MessagePump.app, for mypy only: the attributes used on the app are checked
        app = getters.app(CockpitApp)

    BINDINGS = [  # the tab keys first: the footer shows them even at 80 columns
        # priority: a field nearly always has focus, and an Input would take Ctrl+←/→ for itself
        Binding("ctrl+left", "prev_tab", "Tab", key_display="^←", priority=True, group=TABS),
        Binding("ctrl+right", "next_tab", "Tab", key_display="^→", priority=True, group=TABS),
        Binding("ctrl+o", "open_config", "Open YAML"),
        Binding("f8,ctrl+g", "launch", "Launch"),
        Binding("f5", "check_data", "Check data"),
        Binding("f6", "preview", "Preview"),
        Binding("f7", "save_preset", "Save"),
        Binding("f9", "tune", "Tune"),
        Binding("f10", "queue_run", "Queue", show=False),  # its button says F10; the footer keeps ? Keys
    ]

    # what the workers tell the screen (each a subprocess's answer, handled on the UI thread below)
    class Detected(WorkerMessage):
        """``cockpit doctor --json``'s checks: which presets this machine calls for."""

    class GpuReasons(WorkerMessage):
        """The doctor's reasons no GPU is usable (``cockpit doctor --json --needs TAGS``), for a set of needs:
        (its key, the lines)."""

    class FitEstimated(WorkerMessage):
        """The fit line for the form's config."""

    class DataChecked(WorkerMessage):
        """``cockpit check --json``'s answer (a dict), for the form as it was (``raw``) when F5 asked."""

        def __init__(self, result: dict, raw: dict) -> None:
            super().__init__(result)
            self.raw = raw

    class Previewed(WorkerMessage):
        """``cockpit preview --json``'s ranks (a dict), for the preview modal ``view``."""

        def __init__(self, result: dict, view: Any) -> None:
            super().__init__(result)
            self.view = view

    def __init__(self) -> None:
        super().__init__()
        self.model = FormModel()
        self.checked: forms.Checked | None = None
        self._validate_timer: Timer | None = None
        self._launching = False
        self._tuning = False
        self._data_for: str | None = None
        self._offered: list[presets.Preset] = []  # the presets this machine calls for (doctor)
        self._loaded_preset: str | None = None
        self._opened: list[str] = []  # YAMLs opened from elsewhere (Ctrl+O, cockpit CONFIG): listed in the picker
        self._check_answer: tuple[dict, dict] | None = None  # (the form, cockpit check's answer) from F5
        self._torch_gpus: int | None = None  # the GPUs torch sees, as the doctor said (check counts them so)
        self._gpu_reasons: dict[str, list[str] | None] = {}  # needs -> the doctor's reasons (None: asked)
        self._previewed: Path | None = None  # the form as a file, for the preview
        self._auto: tuple[str, dict] | None = None  # (preset path, form) while untouched since loaded for you
        self.secrets: dict[str, str] = {}  # the env secrets of the config file last written (never on disk)
        self.form_ready = False  # the form is composed once the first frame is on the screen (_build)
        self._started = False  # the form is filled (_start): a preset asked for before waits for it
        self._pending_preset: tuple[Path, bool] | None = None  # asked for before the form was filled

    # -- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Bearings(id="bearings")
        if not self.form_ready:
            # The first frame: the bearings line, a placeholder and the keys. The form (some 300
            # widgets, whose mounting and styling were two thirds of the cockpit's start-up) is
            # composed right after it is drawn (_build); then the preset, validation, the fit and
            # the doctor (_start).
            yield Static("Setup: laying out the form …", id="setup-loading", classes="dim")
            yield Footer()
            return
        with Horizontal(id="setup-top"):
            yield Label("Preset", classes="field-label")
            yield Select(
                self._preset_options(),
                prompt=f"load a preset … (yours: {_home_short(presets.user_presets_dir())}; Ctrl+O: any YAML)",
                id="preset",
                compact=True,
            )
        with Horizontal(id="setup-body"):
            with TabbedContent(id="setup-tabs"):
                for group, fields in GROUPS.items():
                    with TabPane(group, id=f"tab-{group.lower()}"):
                        with VerticalScroll(classes="form"):
                            for f in fields:
                                with Horizontal(classes="field", id=f"row-{f.id}"):
                                    yield Label(f.label, classes="field-label")
                                    yield self._widget(f)
                                if f.id == "model_name_or_path":
                                    yield Static(id="model-kind", classes="field-note")
                            if group == "Dataset":
                                yield Static(DATA_PROMPT, id="data-report", classes="pane")
            with Vertical(id="setup-side"):
                yield Static(id="problems")
                yield Static(id="fit", classes="dim")
                with VerticalScroll(id="yaml-live-box"):
                    yield Static(id="yaml-live")
                with Horizontal(id="setup-buttons"):
                    yield Button("Check F5", id="b-check", compact=True)
                    yield Button("Preview F6", id="b-preview", compact=True)
                    yield Button("Save F7", id="b-save", compact=True)
                    yield Button("Launch F8", id="b-launch", variant="success", compact=True)
                    yield Button("Queue F10", id="b-queue", compact=True)
                    if slurm_submit_available():
                        yield Button("Launch on Slurm", id="b-slurm", variant="primary", compact=True)
                    yield Button("Tune F9", id="b-tune", compact=True)
        yield Footer()

    def _preset_options(self) -> list[tuple[str, str]]:
        offered = [p.path for p in self._offered]
        found = sorted(
            presets.list_presets(), key=lambda p: offered.index(p.path) if p.path in offered else len(offered)
        )
        options = [(p.label + (" (for this machine)" if p.path in offered else ""), str(p.path)) for p in found]
        listed = {v for _label, v in options}
        return options + [
            (f"{Path(p).name} (opened: {_home_short(Path(p))})", p) for p in self._opened if p not in listed
        ]

    def _widget(self, f: forms.Field):
        value = self.model.values.get(f.id)
        if f.kind == "bool":
            return TickBox(f.help[:60] if f.help else "", bool(value), id=_wid(f.id), compact=True, tooltip=f.help)
        if f.kind == "select":
            return Select(
                [(label, v) for label, v in f.options],
                value=value,
                allow_blank=False,
                id=_wid(f.id),
                compact=True,
                tooltip=f.help,
            )
        return Input(value or "", placeholder=f.placeholder, id=_wid(f.id), compact=True, tooltip=f.help)

    def on_mount(self) -> None:
        self.call_after_refresh(self._build)

    async def _build(self) -> None:
        """(after the first frame) The form in place of the placeholder, focused as Textual focuses a
        new screen; filled once its tabs' forms are all mounted (_start)."""
        self.form_ready = True
        await self.recompose()
        if not self.query("#setup-tabs"):  # the app is closing: nothing was mounted
            return
        self._update_auto_focus()
        self.refresh_bindings()
        self.call_after_refresh(self._start)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The form's keys wait for the form (shown dimmed until then); F2-F4, ? and quit do not."""
        if not self.form_ready and action in {b.action for b in self.BINDINGS if isinstance(b, Binding)}:
            return None
        return True

    def _start(self) -> None:
        if not self.is_attached:  # the app is closing (Ctrl+Q at once): its teardown removes the form's widgets
            return
        self._started = True
        preset = getattr(self.app, "start_preset", None)
        pending, self._pending_preset = self._pending_preset, None
        if pending:  # asked for while the form was being laid out (the palette's "Preset: NAME")
            self.load_preset(*pending)
        elif preset:  # cockpit CONFIG.yaml (or a test's preset): said unless it is a preset
            self.load_preset(Path(preset), quiet=Path(preset).resolve().parent in preset_dirs())
        else:  # the cheap guess now; the doctor (a subprocess) may offer another one below
            guess = presets.REPO_PRESETS / "cpu-demo.yaml"
            if guess.exists():
                self.load_preset(guess, quiet=True)
                self._auto = (str(guess), self.model.raw())
        self.validate_now()
        self._detect()

    # -- the presets this machine calls for --------------------------------------------------------
    @work(thread=True, exclusive=True, group="detect", exit_on_error=False)
    def _detect(self) -> None:
        checks, _err = doctor_checks(self.app)
        if checks is not None:
            self.post_message(self.Detected(checks))

    @on(Detected)
    def _offer(self, message: Detected) -> None:
        if not self.is_attached:  # the app is closing
            return
        checks: list[dict] = message.result
        self._torch_gpus = len(presets.detected_devices(checks))
        self._show_problems()
        offered, why = presets.offered_presets(checks)
        self._offered = offered
        sel = self.query_one("#preset", Select)
        # a preset picked whose Changed message is still queued (behind this one) is kept, and counts
        # as touching the form
        picked = sel.value if isinstance(sel.value, str) else self._loaded_preset
        sel.set_options(self._preset_options())
        if picked:
            try:
                sel.value = picked
            except Exception:  # noqa: BLE001 - a preset no longer listed
                pass
        if not offered:
            return
        auto = self._auto  # (preset, form) while untouched since loaded for you
        if auto and auto[1] == self.model.raw() and picked == self._loaded_preset and auto[0] != str(offered[0].path):
            self.load_preset(offered[0].path, quiet=True)
            self._auto = (str(offered[0].path), self.model.raw())
            self.notify(f"preset {offered[0].name} loaded: this machine has {why}")

    # -- form <-> model -------------------------------------------------------------------------
    def load_preset(self, path: Path, quiet: bool = False) -> None:
        from cockpit.errors import InputError

        if not self._started:  # loaded when the form is there, instead of the start preset (_start)
            self._pending_preset = (Path(path), quiet)
            return
        try:
            raw = presets.load_preset(path)
        except InputError as err:
            self.notify(str(err), severity="error")
            return
        self.model.fill(raw)
        self._auto = None
        self._loaded_preset = str(Path(path).resolve())
        self._show_source(self._loaded_preset)
        self.fill_widgets()
        self.validate_now()
        if not quiet:
            self.notify(f"preset {path.stem} loaded" if path.parent in preset_dirs() else f"loaded {path}")

    def _show_source(self, path: str) -> None:
        """The picker names the file the form came from (one opened from elsewhere joins its list); the
        Data pane's report, about the file before, goes."""
        sel = self.query_one("#preset", Select)
        if path not in {v for _label, v in self._preset_options()}:
            self._opened.append(path)
            sel.set_options(self._preset_options())
        sel.value = path
        self._check_answer = None
        self.query_one("#data-report", Static).update(DATA_PROMPT)

    def fill_widgets(self) -> None:
        for f in FIELDS.values():
            w = self.query_one(f"#{_wid(f.id)}")
            value = self.model.values.get(f.id)
            if isinstance(w, Input):
                w.value = value or ""
            elif isinstance(w, Checkbox):
                w.value = bool(value)
            elif isinstance(w, Select):
                w.value = value

    def _set(self, widget_id: str | None, value) -> None:
        if not widget_id or not widget_id.startswith("f-"):
            return
        fid = widget_id[2:]
        if self.model.values.get(fid) == value:
            return
        self.model.values[fid] = value
        self._schedule_validate()

    # a Changed message older than the widget's value (a preset filled the form meanwhile) is stale
    def on_input_changed(self, event: Input.Changed) -> None:
        if event.value == event.input.value:
            self._set(event.input.id, event.value)

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        if event.value == event.checkbox.value:
            self._set(event.checkbox.id, event.value)

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "preset":  # a stale Changed (the picker moved on since) loads nothing
            # (a cleared picker's value is Textual's Select.NULL sentinel, not a path)
            if (
                event.value == event.select.value
                and isinstance(event.value, str)
                and event.value != self._loaded_preset
            ):
                self.load_preset(Path(str(event.value)))
            return
        if event.value == event.select.value:
            self._set(event.select.id, event.value)

    # -- validation as you type ------------------------------------------------------------------
    def _schedule_validate(self) -> None:
        if self._validate_timer is not None:
            self._validate_timer.stop()
        self._validate_timer = self.set_timer(0.15, self.validate_now)

    def validate_now(self) -> None:
        self._validate_timer = None
        checked = self.model.check()
        self.checked = checked
        name = self.model.values.get("model_name_or_path") or ""
        vlm = forms.vlm_note(name, self.model.values.get("template"))
        self.query_one("#model-kind", Static).update(
            Text("  → " + forms.model_kind(name) + (f"\n  → {vlm}" if vlm else ""), style="dim")
        )
        bad_fields = {forms.field_for_key(k) for k in checked.keys}
        hidden = forms.hidden_fields(self.model.values)
        for fid in forms.SHOWN_IF:
            self.query_one(f"#row-{fid}").display = fid not in hidden
        for f in FIELDS.values():
            self.query_one(f"#{_wid(f.id)}").set_class(f.id in bad_fields, "-invalid")
        tabs = self.query_one(TabbedContent)
        for group in GROUPS:
            n = sum(1 for fid in bad_fields if forms.group_of(fid) == group)
            try:
                tab = tabs.get_tab(f"tab-{group.lower()}")
                tab.label = f"{group} ({n})" if n else group
            except Exception:  # noqa: BLE001 - a label is cosmetic
                pass
        self._show_problems()
        if self.screen.has_class("-wide"):
            y = Text("the config as YAML (F6: with the command):\n", style="dim")
            y.append(self.model.yaml())
            self.query_one("#yaml-live", Static).update(y)
        if checked.ok:
            self.query_one("#fit", Static).update("fit: estimating …")
            self._fit(checked.cfg, self.model.gpu_memory(), self._loaded_preset)
        else:
            self.query_one("#fit", Static).update("fit: (fix the problems first)")

    def _show_problems(self) -> None:
        """What ``cockpit check`` says of the form, as far as it is known: validation's problems, the device
        gate's (``cockpit.device.device_problems``, as check asks it, on the GPUs torch sees here: the
        doctor's count, until it answers the kernel's; with the doctor's reasons once it answers for the
        config's needs), then F5's answer for this very form. A tick only where check passed; before F5, no tick."""
        from cockpit.device import device_problems

        checked = self.checked
        if checked is None:
            return
        problems = list(checked.problems)
        if checked.cfg is not None:
            cfg = checked.cfg
            gpus = machine_of(self.app).gpus if self._torch_gpus is None else self._torch_gpus
            reasons = self._no_gpu_reasons(cfg, gpus)
            gate = device_problems(cfg.use_cpu, cfg.quantization_bit, cfg.nproc_per_node, gpus, reasons=reasons)
            problems += [str(p) for p in gate]
        answer = self._check_answer[1] if self._check_answer and self._check_answer[0] == self.model.raw() else None
        if not problems and answer is not None and not answer.get("ok", True):
            problems = [str(p) for p in answer.get("problems") or []]
        t = Text()
        if problems:
            t.append(f"✗ {len(problems)} problem(s) (as cockpit check says):\n", style=themed("bold $text-error"))
            for p in problems:
                t.append(f"  {p}\n", style=themed("$text-error"))
        elif answer is not None:
            t.append(
                "✓ cockpit check passed (config, model, data: the Dataset tab)\n", style=themed("bold $text-success")
            )
        else:
            t.append("· config valid so far; F5 checks model + data\n", style="bold")  # no tick: check has not run
        for note in checked.notes:
            t.append(f"! {note}\n", style=themed("$text-warning"))
        self.query_one("#problems", Static).update(t)

    def _no_gpu_reasons(self, cfg: RunConfig, gpus: int) -> list[str] | None:
        """The doctor's reasons no GPU is usable, as ``cockpit check`` adds them to the gate's refusal of a config
        that needs GPUs where torch sees none: from the doctor's answer for the config's needs (a worker asks
        it once per set of needs; None until it answers)."""
        from cockpit.device import needs_gpu
        from cockpit.doctor.relevance import config_tags

        if gpus > 0 or not needs_gpu(cfg.use_cpu, cfg.quantization_bit):
            return None
        keys = cfg.keys_only()
        needs = ",".join(sorted(config_tags(keys)))
        if needs not in self._gpu_reasons:
            self._gpu_reasons[needs] = None
            self._ask_gpu_reasons(needs, keys)
        return self._gpu_reasons[needs]

    @work(thread=True, exit_on_error=False)
    def _ask_gpu_reasons(self, needs: str, keys: Mapping[str, Any]) -> None:
        from cockpit.doctor.relevance import no_gpu_reasons

        checks, _err = doctor_checks(self.app, needs.split(",") if needs else ())
        self.post_message(self.GpuReasons((needs, no_gpu_reasons(checks or [], keys))))

    @on(GpuReasons)
    def _got_gpu_reasons(self, message: GpuReasons) -> None:
        needs, reasons = message.result
        self._gpu_reasons[needs] = reasons
        if self.is_attached:
            self._show_problems()

    @work(thread=True, exclusive=True, group="fit", exit_on_error=False)
    def _fit(self, cfg: RunConfig, gpu_gb: float | None, config_path: str | None) -> None:
        from textual.worker import get_current_worker

        line = forms.fit_line(cfg, machine_of(self.app), gpu_gb, config_path)
        if not get_current_worker().is_cancelled:
            self.post_message(self.FitEstimated(line))

    @on(FitEstimated)
    def _show_fit(self, message: FitEstimated) -> None:
        line: str = message.result
        style = (
            "$text-error"
            if "does not fit" in line
            else "$text-warning"
            if "tight" in line
            else "$text-success"
            if "-> fits" in line
            else "dim"
        )
        self.query_one("#fit", Static).update(Content.styled(line, style))

    # -- files ------------------------------------------------------------------------------------
    def _config_file(self, folder: Path, stem: str, extra: dict | None = None) -> Path:
        """The form as a config file, its env's secrets redacted: ``self.secrets`` keeps them for the
        command that runs it (``cli_calls.write_config``)."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = folder / f"{stem}.yaml"
        self.secrets = cli_calls.write_config(path, {**self.model.typed(), **(extra or {})})
        return path

    def _run_name(self) -> str:
        """The form's run_name, else the loaded config file's name (a preset or a YAML of yours, as the
        Output tab says), else "ui"."""
        name = (self.model.values.get("run_name") or "").strip()
        if not name:
            preset = self.query_one("#preset", Select).value
            source = preset if isinstance(preset, str) else self._loaded_preset  # an opened YAML: not in the picker
            name = Path(source).stem if source else "ui"
        return name

    def _shell_command(self, written: Path | None) -> list[str]:
        """``cockpit train`` as it runs from the folder the cockpit started in: the loaded file (a real
        path) with ``--set`` for what the form changed in it (``run_name`` as the launch sets it), or,
        with no file loaded, ``written`` (the form as a file)."""
        source = Path(self._loaded_preset) if self._loaded_preset else None
        sets: list[str] = []
        if source is not None and source.is_file():
            from cockpit.errors import InputError

            try:
                base = FormModel()
                base.fill(presets.load_preset(source))
                was = base.typed()
            except InputError:
                was = None
            if was is not None:
                now = {**self.model.typed(), "run_name": self._run_name()}
                for key in sorted(set(now) | set(was)):
                    if key == "run_name" and key not in was and now[key] == source.stem:
                        continue  # cockpit train names the run by the file already
                    if now.get(key) != was.get(key):
                        sets += ["--set", f"{key}={_set_value(key, now.get(key))}"]
                written = source
        shown = written if written is not None else Path(f"{self._run_name()}.yaml")
        try:
            shown = shown.resolve().relative_to(Path.cwd().resolve())
        except ValueError:
            shown = shown.resolve()
        return cli_calls.cockpit_argv("train", str(shown), *sets, "--detach", "--runs-dir", str(self.app.runs_dir))

    # -- actions ----------------------------------------------------------------------------------
    def action_check_data(self) -> None:
        if not (self.checked and self.checked.ok):
            self.notify("fix the config problems first", severity="error")
            return
        self.query_one(TabbedContent).active = "tab-dataset"
        self.query_one("#data-report", Static).update(
            Text("running cockpit check --json … (loads the tokenizer in a subprocess)", style="italic")
        )
        path = self._config_file(Path(tempfile.mkdtemp(prefix="cockpit-ui-")), "check")
        self._check(path, self.model.raw())

    @work(thread=True, exclusive=True, group="check")
    def _check(self, path: Path, raw: dict) -> None:
        res = cli_calls.check_config(path)
        data = res.data if res.data is not None else {"ok": False, "problems": [res.error_text]}
        self.post_message(self.DataChecked(data, raw))

    @on(DataChecked)
    def _show_data_report(self, message: DataChecked) -> None:
        if message.raw != self.model.raw():  # the form changed (another file loaded) since F5 asked
            self.query_one("#data-report", Static).update(
                Text("the form changed while cockpit check ran: F5 checks it as it is now", style="italic")
            )
            return
        self._check_answer = (message.raw, message.result)
        self.query_one("#data-report", Static).update(forms.data_report(message.result))
        self._show_problems()

    def _preview_body(self, ranks: Text, written: Path | None = None) -> Text:
        argv = self._shell_command(written)
        body = Text()
        body.append("# the same run from a shell:\n", style="dim")
        body.append(cli_calls.shell_line(argv) + "\n\n", style="bold")
        body.append("# each rank's exact command and environment (cockpit preview --json):\n", style="dim")
        body.append_text(ranks)
        body.append(f"\n# {self._run_name()}.yaml\n", style="dim")
        body.append(self.model.yaml())
        if self.checked and self.checked.problems:
            body.append(
                "\n# problems:\n" + "\n".join(f"#   {p}" for p in self.checked.problems), style=themed("$text-error")
            )
        return body

    def action_preview(self) -> None:
        from cockpit.ui.screens.modals import TextView

        ok = bool(self.checked and self.checked.ok)
        ranks = Text(
            "computing … (cockpit preview in a subprocess)\n" if ok else "(fix the config problems first)\n",
            style="italic",
        )
        path = self._config_file(Path(tempfile.mkdtemp(prefix="cockpit-ui-")), self._run_name())
        self._previewed = path
        view = TextView("Preview: command, every rank's launch, YAML", self._preview_body(ranks, path))
        self.app.push_screen(view)
        if ok:
            self._preview_ranks(path, view)

    @work(thread=True, exclusive=True, group="preview")
    def _preview_ranks(self, path: Path, view) -> None:
        res = cli_calls.run_cli("preview", str(path), "--json", timeout=120)
        data = res.data if isinstance(res.data, dict) else {"problems": [res.error_text]}
        self.post_message(self.Previewed(data, view))

    @on(Previewed)
    def _show_preview(self, message: Previewed) -> None:
        from cockpit.ui import formatting

        message.view.set_body(self._preview_body(formatting.launch_ranks(message.result), self._previewed))

    def action_open_config(self) -> None:
        """Ctrl+O: a YAML config of yours into the form (keys the form has no field for are kept)."""
        from cockpit.ui.screens.modals import OpenConfig

        def opened(path: Path | None) -> None:
            if path is not None:
                self.load_preset(path)

        self.app.push_screen(OpenConfig(Path.cwd()), opened)

    def action_save_preset(self) -> None:
        from cockpit.ui.screens.modals import Prompt

        def done(name: str | None) -> None:
            if not name:
                return
            path = presets.save_preset(name, self.model.typed())
            self.query_one("#preset", Select).set_options(self._preset_options())
            self.notify(f"saved {path}")

        self.app.push_screen(Prompt(f"Save as preset (in {presets.user_presets_dir()}): name", self._run_name()), done)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        action = {
            "b-check": self.action_check_data,
            "b-preview": self.action_preview,
            "b-save": self.action_save_preset,
            "b-launch": self.action_launch,
            "b-queue": self.action_queue_run,
            "b-tune": self.action_tune,
            "b-slurm": self.action_launch_slurm,
        }.get(event.button.id or "")
        if action:
            action()

    def action_next_tab(self, step: int = 1) -> None:
        tabs = self.query_one(TabbedContent)
        ids = [f"tab-{g.lower()}" for g in GROUPS]
        tabs.active = ids[(ids.index(tabs.active) + step) % len(ids)] if tabs.active in ids else ids[0]

    def action_prev_tab(self) -> None:
        self.action_next_tab(-1)


def _set_value(key: str, value: Any) -> str:
    """A form value as ``--set key=VALUE`` reads it back (YAML scalars; lists as comma lists; env redacted)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if key == "env" and isinstance(value, Mapping):
        import json

        from cockpit.redact import redact_env

        return json.dumps(redact_env(value))
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)
