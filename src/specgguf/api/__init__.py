"""What a Python user calls: :func:`generate` and :class:`SpeculativeLlama`
(``speculative``), their Llama-shaped methods (``completions``, with
``request_fields``), a generation's run and output (``run``, ``output``),
and :class:`DraftModel`, a GGUF draft inside llama-cpp-python's ``Llama``
(``draft_model``)."""

from .output import GenerationResult
from .speculative import SpeculativeLlama, generate, merge

__all__ = ["GenerationResult", "SpeculativeLlama", "generate", "merge"]
