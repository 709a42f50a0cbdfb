"""`rlfactory serve`: serve a model as an OpenAI-compatible chat-completions API (see rlfactory/serve/server.py)."""
from __future__ import annotations

import typer

from rlfactory.cli.common import console, fail
from rlfactory.errors import RLFactoryError


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        model: str = typer.Argument(None, help="HF model directory, or `tiny-random`.", show_default=False),
        host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
        port: int = typer.Option(8000, help="TCP port."),
        tiny_random: bool = typer.Option(False, "--tiny-random",
                                         help="Serve a random tiny Qwen3 with the offline Qwen3 tokenizer "
                                              "(no download; for tests and demos)."),
        tokenizer: str = typer.Option(None, help="Tokenizer dir, or `qwen3-offline` (default: the model's own)."),
        served_model_name: str = typer.Option(None, help="Model id clients send (default: the dir's name)."),
        max_batch_size: int = typer.Option(64, min=1, help="Requests decoded together."),
        max_tokens: int = typer.Option(512, min=1, help="Default max_tokens when a request gives none."),
        device: str = typer.Option(None, help="cpu, cuda, cuda:1 (default: cuda when available)."),
        dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
        seed: int = typer.Option(0, help="Initialisation seed of the tiny random model."),
        max_body_mb: float = typer.Option(8.0, min=0.001,
                                          help="Largest request body in MiB; larger ones get HTTP 413 unread."),
    ) -> None:
        """Serve MODEL at http://HOST:PORT/v1 (chat completions with tools, /v1/models, /health)."""
        if tiny_random:
            model = "tiny-random"
        if not model:
            fail("give a MODEL directory, or --tiny-random for a tiny random Qwen3")
        try:
            import uvicorn  # here, not at the top: keeps `rlfactory --help` fast

            from rlfactory.serve.server import build_app, load_server

            server = load_server(model, tokenizer=tokenizer, seed=seed, device=device, dtype=dtype,
                                 max_batch_size=max_batch_size, served_name=served_model_name,
                                 default_max_tokens=max_tokens)
        except RLFactoryError as e:
            fail(str(e))
        console.print(f"serving [bold]{server.model_name}[/bold] at http://{host}:{port}/v1 "
                      f"(POST /v1/chat/completions, GET /v1/models, GET /health)", highlight=False)
        uvicorn.run(build_app(server, max_body_mb=max_body_mb), host=host, port=port, log_level="warning")
