"""Structured output: the same JSON schema and prompts through specgguf serve
and llama-server, against plain decoding in the same sitting.

Each request is an OpenAI chat completion with ``response_format`` of type
``json_schema`` (what the openai SDK's ``parse()`` sends); both servers
convert the schema to a GBNF grammar the same way (llama.cpp's converter)
and constrain every token with llama.cpp's grammar engine. Configurations,
each in several fresh processes taken in turns, a fresh state folder for
each specgguf process:

  llama-server            no draft (plain decoding)
  llama-server -md        the same draft model, --spec-draft-n-max N
  specgguf serve          its defaults (k="auto")
  specgguf serve -k 0     plain decoding through specgguf

One client, greedy and T=0.8 (seeded). Reported: completion tokens/s
(median over processes, range), the share of answers that parse and carry
every required key, the ratio to specgguf -k 0 (plain decoding, same code
path) and to llama-server's best configuration, from the same sitting.

    .venv/bin/python bench/json_schema.py [--procs 3] [--temps 0,0.8] [--tokens 160]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx
from vs_llama_server import add_common_args, common_setup, fresh_server, in_turns

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "email": {"type": "string", "maxLength": 40},
        "address": {"type": "object", "properties": {"street": {"type": "string", "maxLength": 40},
                                                     "city": {"type": "string", "maxLength": 30},
                                                     "country": {"type": "string", "maxLength": 30}},
                    "required": ["street", "city", "country"]},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
    },
    "required": ["name", "age", "email", "address", "skills"],
}
PROMPTS = [
    "Create a profile for a software engineer called Maria Lopez who lives in Madrid.",
    "Make up a customer record for an elderly gardener from Kyoto.",
    "Extract the person: John Smith, 42, john@smith.org, 12 High Street, Leeds, UK; knows welding and Python.",
    "Invent a chef from Lyon and give their details.",
    "Produce a record for a teenage chess player in Oslo.",
    "Describe a retired pilot living in Toronto as a profile.",
]


def request(client: httpx.Client, url: str, prompt: str, tokens: int, temp: float, seed: int):
    """(completion tokens, seconds, valid) of one structured chat completion."""
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "temperature": temp, "seed": seed,
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}}
    t0 = time.perf_counter()
    r = client.post(url + "/v1/chat/completions", json=body)
    r.raise_for_status()
    seconds = time.perf_counter() - t0
    out = r.json()
    try:
        value = json.loads(out["choices"][0]["message"]["content"])
        valid = isinstance(value, dict) and set(SCHEMA["required"]) <= set(value)
    except ValueError:
        valid = False
    return out["usage"]["completion_tokens"], seconds, valid


def one_process(config: str, temp: float, args, target: Path, draft: Path, rep: int) -> tuple:
    """(tok/s, valid share) over every prompt, from one fresh server process."""
    with httpx.Client(timeout=600) as client, fresh_server(config, args, target, draft, client, 1) as url:
        request(client, url, "Make up a person.", 24, temp, 7)  # warm-up
        done = [request(client, url, p, args.tokens, temp, 100 * rep + i) for i, p in enumerate(PROMPTS)]
    return sum(n for n, _, _ in done) / sum(s for _, s, _ in done), sum(v for _, _, v in done) / len(done)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_common_args(ap, 160)
    args = ap.parse_args()
    target, draft = common_setup(ap, args)
    print(f"target {target.name}, draft {draft.name}, {args.threads} threads, json_schema chat completions of up "
          f"to {args.tokens} tokens, {len(PROMPTS)} prompts, 1 client, {args.procs} fresh processes per "
          "configuration, taken in turns; loopback", flush=True)
    results = in_turns(args, lambda cfg, temp, rep: one_process(cfg, temp, args, target, draft, rep),
                       lambda got: f"{got[0]:.1f} tok/s, valid {got[1]:.0%}")
    names = {"ls": "llama-server, no draft", "ls-draft": f"llama-server -md, n-max {args.draft_n_max}",
             "sg": "specgguf serve (defaults, fresh state)", "sg-k0": "specgguf serve -k 0 (plain)"}
    for temp in args.temps:
        print(f"\n### json_schema, temperature {temp:g}: tok/s over {args.procs} fresh processes each\n")
        print("| configuration | tok/s median | range | valid | vs specgguf -k 0 | vs llama-server best |")
        print("|---|---|---|---|---|---|")
        med = {c: statistics.median(r[0] for r in results[c, temp]) for c in args.configs}
        plain = med.get("sg-k0")
        ls_best = max((v for k, v in med.items() if k.startswith("ls")), default=None)
        for c in args.configs:
            tps = [r[0] for r in results[c, temp]]
            valid = statistics.mean(r[1] for r in results[c, temp])
            print(f"| {names[c]} | {med[c]:.1f} | {min(tps):.1f}-{max(tps):.1f} | {valid:.0%} | "
                  f"{med[c] / plain:.2f}x | {med[c] / ls_best:.2f}x |" if plain and ls_best else
                  f"| {names[c]} | {med[c]:.1f} | {min(tps):.1f}-{max(tps):.1f} | {valid:.0%} | - | - |")


if __name__ == "__main__":
    main()
