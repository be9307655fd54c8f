"""``cockpit metrics [--port P] [--host H] [--public] [RUN]``: a run's metrics and GPU telemetry for
Prometheus, at http://HOST:PORT/metrics (the text exposition format, prometheus_client's).

Off unless started. It reads the run dir only (``events.jsonl``, ``status.json``: never torch),
so it can run beside the cockpit, on the node that writes the run dir or any host that mounts it.
Without RUN every run of the runs dir is exported, each sample labelled with its run id (a run
started later shows up at the next scrape). What is exported: :mod:`cockpit.run.metrics_export`.

Bound to 127.0.0.1 by default (scrape it from this host, or through an SSH port forward); a
non-loopback address is refused unless ``--public`` (and then a warning is printed), as with
``cockpit web``: the page has no login, and it shows what your runs train on.
"""

from __future__ import annotations

import argparse
import sys
import threading

from cockpit.commands.common import EXIT_FAILED, EXIT_INPUT, EXIT_OK, add_runs_dir, find_run, runs_dir
from cockpit.commands.web import bind_allowed, port_free
from cockpit.errors import InputError

DEFAULT_PORT = 9464


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="?", help="run id (or a unique prefix/suffix), run dir, or 'last'; default: every run")
    add_runs_dir(p)
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: loopback only)")
    p.add_argument(
        "--public", action="store_true", help="allow a non-loopback --host (anyone who reaches the port reads it)"
    )


def run(args: argparse.Namespace) -> int:
    host = args.host
    if not 0 <= args.port < 65536:
        print(f"cockpit metrics: --port {args.port}: not a TCP port (0-65535)", file=sys.stderr)
        return EXIT_INPUT
    exposed = "the endpoint has no login (whoever reaches it reads your runs' metrics)"
    if not bind_allowed(
        "cockpit metrics", host, args.port or DEFAULT_PORT, args.public, exposed, "reads your runs' metrics"
    ):
        return EXIT_INPUT
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        print(
            "cockpit metrics: prometheus-client is not installed (pip install 'cockpit-tune[prometheus]')",
            file=sys.stderr,
        )
        return EXIT_FAILED
    from cockpit.run.metrics_export import RunsCollector
    from cockpit.store.rundir import list_runs

    try:
        chosen = [find_run(args)] if args.run else None
    except InputError as err:
        print(f"cockpit metrics: {err}", file=sys.stderr)
        return EXIT_INPUT
    folder = runs_dir(args)
    why = port_free(host, args.port) if args.port else None
    if why:
        print(f"cockpit metrics: {why}", file=sys.stderr)
        return EXIT_FAILED
    registry = CollectorRegistry(auto_describe=True)
    registry.register(RunsCollector(lambda: chosen if chosen is not None else list_runs(folder)))
    server, _thread = start_http_server(args.port, addr=host.strip("[]"), registry=registry)
    port = server.server_address[1]
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    what = chosen[0].run_id if chosen else f"every run in {folder}"
    print(f"cockpit metrics: http://{shown}:{port}/metrics ({what}); Ctrl+C stops", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return EXIT_OK
