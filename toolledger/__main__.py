"""``python -m toolledger``: the ``toolledger`` command."""

from toolledger.cli import app

app(prog_name="toolledger")
