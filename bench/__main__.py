"""`python -m bench` is the same as the `tokenbench` command."""

from bench.cli import app

app()
