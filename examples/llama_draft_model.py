"""A GGUF draft model inside llama-cpp-python's own Llama.

    .venv/bin/python examples/llama_draft_model.py

Code written for llama_cpp.Llama keeps working; only the constructor gains
`draft_model=specgguf.DraftModel(...)`. At temperature 0 the text is the
same as without the draft.
"""

import llama_cpp

import specgguf
from specgguf.llama import models

target, draft = models.default_pair()
d = specgguf.DraftModel(draft)  # a path, a models.lock name or a loaded Llama
llm = llama_cpp.Llama(str(models.fetch(target)), n_ctx=2048, draft_model=d, verbose=False)
d.check(llm)  # the two share a tokenizer
out = llm.create_chat_completion([{"role": "user", "content": "Explain how a bicycle stays upright."}],
                                 max_tokens=96, temperature=0)
print(out["choices"][0]["message"]["content"])
print(d.stats)
