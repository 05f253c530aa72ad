"""llama.cpp's RPC backend: the target's layers on rpc-server workers."""
from __future__ import annotations


class Workers:
    @classmethod
    def parse(cls, spec):
        if spec is None:
            return None
        raise NotImplementedError("rpc: work in progress")
