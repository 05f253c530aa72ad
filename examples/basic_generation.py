"""Basic generation with the default pair (fetched on first use).

    .venv/bin/python examples/basic_generation.py
"""

import specgguf
from specgguf.llama import models

target, draft = models.default_pair()
# Instruct models expect their chat template; a plain string prompt works too (chat=False).
result = specgguf.generate([{"role": "user", "content": "Explain in two sentences why the sky is blue."}],
                           target=target, draft=draft, chat=True, max_tokens=80)
print(result.text)
print(f"\n[{result.finish_reason}] {len(result.tokens)} tokens, "
      f"acceptance {result.stats['acceptance_rate']:.2f}, "
      f"mean accepted {result.stats['mean_accepted']:.2f}, "
      f"{result.stats['tokens_per_second']:.1f} tok/s")
