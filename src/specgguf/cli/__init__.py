"""The command line: generation (``main``), the subcommands (``commands``:
models, calibrate, check-pair, bench, serve, rpc-server), ``serve``'s own
(``serve``: slots, sockets, then the server), their shared flags (``options``)
and what ``bench`` measures and prints (``bench``)."""

from .main import main

__all__ = ["main"]
