"""The Textual app (``cockpit`` with no command). Never imports torch, transformers or peft.

Layout: pure-Python state kept apart from widgets —

- :mod:`cockpit.ui.series`   bounded, bucketed metric series (a million steps stay small)
- :mod:`cockpit.ui.state`    a run's state folded from its event log (incremental)
- :mod:`cockpit.ui.logtail`  incremental tail of ``logs/rank*.log``
- :mod:`cockpit.ui.forms`    the Setup form <-> config mapping, validation, fit line, preview
- :mod:`cockpit.ui.presets`  preset files (repo ``presets/`` and ``~/.config/cockpit/presets``)
- :mod:`cockpit.ui.cli_calls`     the CLI in subprocesses (check, train --detach, export, doctor)
- :mod:`cockpit.ui.screens`  the screens; :mod:`cockpit.ui.app` the app and ``run_app``
"""
