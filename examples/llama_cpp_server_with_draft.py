"""llama-cpp-python's own server (`python -m llama_cpp.server`) with a real
GGUF draft model.

Its settings offer one draft, prompt lookup (`--draft_model
prompt-lookup-decoding`). This wrapper runs that same server, with the same
arguments, but swaps the prompt-lookup draft for specgguf.DraftModel on the
file named by $SPECGGUF_DRAFT:

    pip install 'llama-cpp-python[server]'
    SPECGGUF_DRAFT=tiny.gguf .venv/bin/python examples/llama_cpp_server_with_draft.py \\
        --model big.gguf --draft_model prompt-lookup-decoding

The server then verifies by sample-and-compare and keeps logits_all (an
n_ctx x n_vocab buffer); `python -m specgguf serve` verifies exactly (more
accepted at temperature > 0) without that buffer.
"""

import os
import sys

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
