"""Talk to `python -m specgguf serve` with the official `openai` package.

Start the server in another terminal (loopback only, port 8080):

    .venv/bin/python -m specgguf serve

then:

    .venv/bin/python examples/openai_client.py

Any OpenAI-compatible tool works the same way: point its base URL at
http://127.0.0.1:8080/v1 (Open WebUI: Settings > Connections; Continue,
LangChain: base_url / api_base). With `serve --api-key KEY`, pass that key.
"""

import os

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("SPECGGUF_URL", "http://127.0.0.1:8080/v1"),
                api_key=os.environ.get("SPECGGUF_API_KEY", "none"))

model = client.models.list().data[0].id
reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Why is the sky blue?"}],
                                       max_tokens=80, temperature=0)
print(reply.choices[0].message.content)
spec = reply.model_extra["speculation"]  # specgguf's extra key
print(f"[{reply.usage.completion_tokens} tokens; drafted {spec['drafted']}, accepted {spec['accepted']}]\n")

stream = client.chat.completions.create(model=model, stream=True, max_tokens=80, temperature=0.8, seed=1,
                                        messages=[{"role": "user", "content": "Write a haiku about CPUs."}])
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
print()
