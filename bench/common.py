"""What the benchmark scripts share: the chat prompts and a free loopback port."""

from __future__ import annotations

import os
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from specgguf.cli.workloads import CHAT  # noqa: E402

PROMPTS = CHAT  # the chat prompts every benchmark shares (specgguf.cli.workloads)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
