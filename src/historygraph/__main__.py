"""``python -m historygraph`` runs the command line (same as the ``historygraph`` script)."""

from historygraph.cli import app

app()
