"""llama-cpp-python's own server (`python -m llama_cpp.server`) with a real
GGUF draft model.

Its settings offer one draft, prompt lookup (`--draft_model
prompt-lookup-decoding`). This wrapper runs that same server, with the same
arguments, but swaps the prompt-lookup draft for specgguf.DraftModel on the
file named by $SPECGGUF_DRAFT:

    .venv/bin/pip install fastapi sse-starlette 'starlette-context<0.4' pydantic-settings
    SPECGGUF_DRAFT=smollm2-135m-q4_1 .venv/bin/python examples/llama_cpp_server_with_draft.py \\
        --model "$(.venv/bin/python -m specgguf models fetch smollm2-135m-f32)" \\
        --draft_model prompt-lookup-decoding

(The first line installs what llama-cpp-python's `[server]` extra would,
without touching the llama-cpp-python that set-up built for this CPU.)

The server then verifies by sample-and-compare and keeps logits_all (an
n_ctx x n_vocab buffer); `python -m specgguf serve` verifies exactly (more
accepted at temperature > 0) without that buffer.
"""

import os
import sys

try:  # llama-cpp-python's server needs its [server] extra's packages
    import fastapi  # noqa: F401
    import pydantic_settings  # noqa: F401
    import sse_starlette  # noqa: F401
    import starlette_context  # noqa: F401
except ImportError as e:
    sys.exit(f"this example runs llama-cpp-python's own server, which needs {e.name}: .venv/bin/pip install "
             "fastapi sse-starlette 'starlette-context<0.4' pydantic-settings")

import llama_cpp.llama_speculative as speculative

import specgguf

draft_file = os.environ.get("SPECGGUF_DRAFT")
if not draft_file:
    sys.exit("set SPECGGUF_DRAFT to the draft model's GGUF file (a path or a models.lock name)")


def _draft_model(*args, **kwargs):  # replaces LlamaPromptLookupDecoding(num_pred_tokens=...)
    return specgguf.DraftModel(draft_file)


speculative.LlamaPromptLookupDecoding = _draft_model

from llama_cpp.server.__main__ import main  # noqa: E402  (after the swap)

main()
