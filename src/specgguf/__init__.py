"""specgguf: exact speculative decoding for two GGUF models on small CPUs.

Low level: :func:`verify_greedy`, :func:`accept` (the verification ops) and
:class:`SpeculativeDecoder` (the draft/verify loop over your own callbacks).
"""

from .decoder import DecoderStats, SpeculativeDecoder
from .verify import (accept, accept_onehot, accept_onehot_uniforms, accept_uniforms, get_kernel, kernels,
                     set_kernel, verify_greedy)

__all__ = [
    "GenerationResult",
    "SpeculativeLlama",
    "generate",
    "DecoderStats",
    "SpeculativeDecoder",
    "accept",
    "accept_onehot",
    "accept_onehot_uniforms",
    "accept_uniforms",
    "get_kernel",
    "kernels",
    "set_kernel",
    "verify_greedy",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    # The llama.cpp layer is imported on first use, so the ops and the decoder
    # work without llama-cpp-python (e.g. the aarch64 emulation job).
    if name in ("generate", "SpeculativeLlama", "GenerationResult"):
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'specgguf' has no attribute {name!r}")
