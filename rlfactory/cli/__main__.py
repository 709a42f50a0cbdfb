"""`python -m rlfactory.cli`: the same as the `rlfactory` command."""
from rlfactory.cli.app import app

app()
