"""CLI command modules. Each module defines `register(app: typer.Typer)` and imports heavy libraries lazily."""
