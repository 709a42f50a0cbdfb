"""`rlfactory dashboard RUN_DIR [RUN_DIR ...]`: watch runs live in the browser (see rlfactory/report/dashboard.py)."""
from __future__ import annotations

from pathlib import Path

import typer

from rlfactory.cli.common import console, fail
from rlfactory.errors import RLFactoryError


def register(app: typer.Typer) -> None:
    @app.command()
    def dashboard(
        run_dirs: list[Path] = typer.Argument(..., help="Run folders (finished or still training); several overlay."),
        host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
        port: int = typer.Option(8766, min=0, max=65535, help="TCP port (0 = any free port; 8265 is Ray's dashboard)."),
    ) -> None:
        """Serve a live page of the runs' curves, tool behaviour, rollout shape, stage times and newest transcripts."""
        from rlfactory.report.dashboard import make_server

        try:
            server = make_server(list(run_dirs), host=host, port=port)
        except RLFactoryError as e:
            fail(str(e))
        bound_host, bound_port = server.server_address[:2]
        console.print(f"dashboard for {len(run_dirs)} run{'s' if len(run_dirs) > 1 else ''} at "
                      f"http://{bound_host}:{bound_port}/ (Ctrl-C stops it)", highlight=False)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
