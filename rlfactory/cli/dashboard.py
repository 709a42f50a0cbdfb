"""`rlfactory dashboard RUN_DIR [RUN_DIR ...]`: watch runs live in the browser (see rlfactory/report/dashboard.py)."""
from __future__ import annotations

import signal
from pathlib import Path

import typer
from rich.markup import escape

from rlfactory.cli.common import console, err_console, fail
from rlfactory.errors import RLFactoryError


def register(app: typer.Typer) -> None:
    @app.command()
    def dashboard(
        run_dirs: list[Path] = typer.Argument(..., help="Run folders (finished or still training); several overlay."),
        host: str = typer.Option("127.0.0.1", help="Interface to listen on (the page has no authentication: "
                                                   "anything but 127.0.0.1 lets other machines read it)."),
        port: int = typer.Option(8766, min=0, max=65535, help="TCP port (0 = any free port; 8265 is Ray's dashboard)."),
        allow_host: list[str] = typer.Option(
            [], "--allow-host", help="Another name the page may be reached by (NAME or NAME:PORT, repeatable; "
                                     "'*' turns the Host check off), e.g. behind a reverse proxy. Requests naming any "
                                     "other host are refused (a guard against DNS rebinding)."),
    ) -> None:
        """Serve a live page of the runs' curves, tool behaviour, rollout shape, stage times and newest transcripts."""
        from rlfactory.report.dashboard import make_server
        from rlfactory.report.dashboard_hosts import is_loopback

        try:
            server = make_server(list(run_dirs), host=host, port=port, allowed_hosts=allow_host)
        except RLFactoryError as e:
            fail(str(e))
        bound_host, bound_port = server.server_address[:2]
        if not is_loopback(host):
            err_console.print(
                f"[yellow]warning:[/yellow] the dashboard has no authentication, and listening on {escape(host)} "
                f"lets anyone who can reach this machine's port {bound_port} read these runs' metrics and "
                f"transcripts. To watch from another machine, keep the default --host 127.0.0.1 and forward the port "
                f"instead (ssh -L {bound_port}:127.0.0.1:{bound_port} THIS_MACHINE).", highlight=False, soft_wrap=True)
        shown = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
        console.print(f"dashboard for {len(run_dirs)} run{'s' if len(run_dirs) > 1 else ''} at "
                      f"{escape(f'http://{shown}:{bound_port}/')} (Ctrl-C stops it)", highlight=False)
        signal.signal(signal.SIGTERM, _interrupt)  # `kill`, a process manager's stop: ends it as Ctrl-C does
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM's handler. A dashboard started in the background by a script or CI ignores SIGINT (the shell sets
    that for jobs without job control), so SIGTERM is the stop that always reaches it."""
    raise KeyboardInterrupt
