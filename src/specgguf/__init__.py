"""specgguf: exact speculative decoding for two GGUF models on small CPUs.

High level (needs llama-cpp-python): :func:`generate`, :class:`SpeculativeLlama`
(also Llama-shaped: ``create_completion`` / ``create_chat_completion``) and
:class:`DraftModel` (a GGUF draft inside ``llama_cpp.Llama``).

Low level: the verification ops (:func:`verify_greedy`, :func:`accept`,
:func:`accept_onehot`, :func:`accept_invariant`), :class:`SpeculativeDecoder`
(the draft/verify loop over your own callbacks), :class:`CrossDrafter` (a
draft of another tokenizer) and :class:`GenerationConfig`.

Names are imported on first use: ``import specgguf`` is instant (the CLI
starts fast, and a Ctrl-C during start-up lands in code that handles it), and
the ops work without llama-cpp-python (the aarch64 emulation job).
"""

import importlib

__version__ = "0.2.0"

_WHERE = {
    "GenerationConfig": "config",
    "DecoderStats": "engine.stats", "SpeculativeDecoder": "engine.decoder",
    "Draft": "ops.drafter", "Drafter": "ops.drafter",
    "CrossDrafter": "ops.cross", "Vocab": "ops.cross", "VocabMap": "ops.cross",
    "generate": "api.speculative", "SpeculativeLlama": "api.speculative", "GenerationResult": "api.output",
    "DraftModel": "api.draft_model",
    **{name: "ops.verify" for name in ("accept", "accept_invariant", "accept_onehot", "accept_onehot_uniforms",
                                   "accept_uniforms", "get_kernel", "kernels", "race_pick", "race_uniforms",
                                   "set_kernel", "verify_greedy")},
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value  # found once: later lookups are plain attribute reads
        return value
    raise AttributeError(f"module 'specgguf' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
