"""The low-level API: your own draft and target as two callbacks.

Here both "models" are tiny numpy Markov chains over 5 tokens, so the example
runs anywhere in a second. The target's law is reproduced exactly, whatever the
draft: compare the empirical next-token frequencies with the target's row.
"""

import numpy as np

import specgguf

rng = np.random.default_rng(0)
TARGET = rng.dirichlet(np.ones(5), size=5).astype(np.float32)  # P(next | last)
DRAFT = rng.dirichlet(np.ones(5), size=5).astype(np.float32)   # a different guess
draw = np.random.default_rng(1)


def draft_step(prefix, k):
    """Sample k tokens from the draft chain: (tokens [k], probs [k, V])."""
    tokens, probs, last = [], [], prefix[-1]
    for _ in range(k):
        row = DRAFT[last]
        last = int(draw.choice(5, p=row / row.sum()))
        tokens.append(last)
        probs.append(row)
    return tokens, np.array(probs)


def target_step(prefix, proposed):
    """Target rows for prefix[-1] and each proposed token: [k+1, V]."""
    return TARGET[(prefix + proposed)[len(prefix) - 1:]]


dec = specgguf.SpeculativeDecoder(draft_step, target_step, k=3, greedy=False, generator=2)
seq = dec.generate([0], max_new=20000)
s = dec.stats
print(f"rounds {s.rounds}, acceptance {s.acceptance_rate:.3f}, mean accepted {s.mean_accepted:.2f}")
seq = [0] + seq
pairs = np.zeros((5, 5))
for a, b in zip(seq, seq[1:]):
    pairs[a, b] += 1
print("empirical P(next | 0):", np.round(pairs[0] / pairs[0].sum(), 3))
print("target    P(next | 0):", np.round(TARGET[0] / TARGET[0].sum(), 3))
print("draft     P(next | 0):", np.round(DRAFT[0] / DRAFT[0].sum(), 3))
