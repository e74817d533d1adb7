"""``python -m historygraph`` runs the command line (same as the ``historygraph`` script)."""

from .cli import app

app()
