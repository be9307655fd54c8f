"""``cockpit web [--port P] [--host H] [--public]``: the same Textual cockpit, in a browser.

textual-serve (PyPI ``textual-serve``) serves a page (xterm.js) whose websocket starts one
``cockpit`` TUI process per browser tab, with Textual's web driver. Runs stay owned by their
supervisors, as with the terminal cockpit: closing the tab or stopping the server ends nothing.

Bound to 127.0.0.1 by default: reach it through an SSH port forward
(``ssh -L 8000:127.0.0.1:8000 host``, then http://127.0.0.1:8000). The page has no login, and
whoever opens it can start, stop and delete runs as this user, so a non-loopback address is
refused unless ``--public`` is given (and then a warning is printed).
"""

from __future__ import annotations

import argparse
import ipaddress
import shlex
import socket
import sys

from cockpit.commands.common import EXIT_FAILED, EXIT_INPUT, EXIT_OK, add_runs_dir, runs_dir

DEFAULT_PORT = 8000


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_runs_dir(p)
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: loopback only, for an SSH port forward)",
    )
    p.add_argument(
        "--public",
        action="store_true",
        help="allow a non-loopback --host (anyone who reaches the port controls your runs: no login)",
    )
    p.add_argument(
        "--public-url",
        default=None,
        metavar="URL",
        help="the address browsers use to reach the server, when it differs from http://HOST:PORT (a proxy)",
    )


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1); a name other than localhost is not
    assumed to be loopback (it may resolve to any interface)."""
    if host.strip().lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def app_command(args: argparse.Namespace) -> str:
    """The shell command textual-serve runs for each browser tab: this Python's cockpit TUI, the
    installed one whatever the working folder holds (``-P``: a ``cockpit/`` folder there, e.g. the
    clone's parent, is not imported), in the server's working folder (relative paths typed in the
    page mean what they mean in the terminal); ``exec``: the tab's process is the cockpit itself, so
    its exit code or signal is what the page reports."""
    return "exec " + shlex.join([sys.executable, "-P", "-m", "cockpit.cli", "--runs-dir", str(runs_dir(args))])


def public_url(host: str, port: int) -> str:
    """What the page's websocket dials: a wildcard bind (0.0.0.0, ::) is reached by this host's name."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def port_free(host: str, port: int) -> str | None:
    """None when ``host:port`` can be bound now, else why not (said before the server's banner)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


def bind_allowed(prog: str, host: str, port: int, public: bool, exposed: str, reach: str) -> bool:
    """A loopback ``host``: yes. Another one: refused (said on stderr: ``exposed`` says what anyone
    reaching it gets) unless ``public``, and then a warning (``reach``: what they can do)."""
    if is_loopback(host):
        return True
    if not public:
        print(
            f"{prog}: refusing to listen on {host}: it is not a loopback address, and {exposed}.\n"
            f"  Use the default (127.0.0.1) with an SSH port forward: ssh -L {port}:127.0.0.1:{port} THIS_HOST\n"
            "  or, on a network you trust, add --public.",
            file=sys.stderr,
        )
        return False
    print(
        f"{prog}: WARNING: listening on {host} (--public): anyone who can reach port {port} {reach} (no login, no TLS).",
        file=sys.stderr,
    )
    return True


def run(args: argparse.Namespace) -> int:
    host = args.host
    if not 0 < args.port < 65536:
        print(f"cockpit web: --port {args.port}: not a TCP port (1-65535)", file=sys.stderr)
        return EXIT_INPUT
    exposed = "the page has no login (whoever reaches it can start, stop and delete your runs)"
    if not bind_allowed("cockpit web", host, args.port, args.public, exposed, "controls your runs as this user"):
        return EXIT_INPUT
    try:
        import textual_serve.server
        from textual_serve.server import Server
    except ImportError:
        print("cockpit web: textual-serve is not installed (pip install textual-serve)", file=sys.stderr)
        return EXIT_FAILED
    why = port_free(host, args.port)
    if why:
        print(f"cockpit web: {why}", file=sys.stderr)
        return EXIT_FAILED
    from cockpit.commands.web_tab import TabService

    textual_serve.server.AppService = TabService  # type: ignore[misc]  # each tab's process, with a notice when it dies
    server = Server(
        app_command(args),
        host=host.strip("[]"),
        port=args.port,
        title="cockpit",
        public_url=args.public_url or public_url(host, args.port),
    )
    server.serve()
    return EXIT_OK
