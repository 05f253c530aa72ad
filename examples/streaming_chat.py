"""A streaming chat loop: the models load once and are reused every turn.

    .venv/bin/python examples/streaming_chat.py            (type, Enter; Ctrl-D quits)
    echo "What is a GGUF file?" | .venv/bin/python examples/streaming_chat.py
"""

import sys

from specgguf import SpeculativeLlama
from specgguf.llama import models

target, draft = models.default_pair()
llm = SpeculativeLlama(target, draft)
history = []
for line in sys.stdin:
    if not line.strip():
        continue
    history.append({"role": "user", "content": line.strip()})
    reply = []
    for piece in llm.generate(history, chat=True, stream=True, max_tokens=200, temperature=0.7, seed=0):
        print(piece, end="", flush=True)
        reply.append(piece)
    print()
    history.append({"role": "assistant", "content": "".join(reply)})
