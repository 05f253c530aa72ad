"""What the benchmark scripts share: the chat prompts and a free loopback port."""

from __future__ import annotations

import socket

PROMPTS = [
    "Write a detailed essay about the history of the printing press.",
    "Explain, step by step, how a bicycle stays upright while moving.",
    "Write a short story about a robot who learns to paint.",
    "Describe how a compiler turns source code into a running program.",
    "Write a letter to a friend about a trip to the mountains.",
    "Explain why the seasons change over the course of a year.",
    "Give a beginner's guide to growing tomatoes on a balcony.",
    "Tell the story of a lighthouse keeper during a storm.",
]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
