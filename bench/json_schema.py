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

With --interleave (the trustworthy way on a machine whose speed drifts
within seconds), a fresh process of every configuration runs at once and
each prompt goes to all of them in turn; tok/s is then per request (median
over a process's requests, then over processes) and the ratios are paired:
the median over requests of the two configurations' tok/s on the same
prompt and seed, with quartiles.

    .venv/bin/python bench/json_schema.py [--procs 3] [--temps 0,0.8] [--tokens 160] [--interleave]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx
from vs_llama_server import (add_common_args, bench_client, common_setup, config_names, fresh_server,
                             in_turns, report_paired, run_sittings, servers_at_once)

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
    with bench_client() as client, fresh_server(config, args, target, draft, client, 1) as url:
        request(client, url, "Make up a person.", 24, temp, 7)  # warm-up
        done = [request(client, url, p, args.tokens, temp, 100 * rep + i) for i, p in enumerate(PROMPTS)]
    return sum(n for n, _, _ in done) / sum(s for _, s, _ in done), sum(v for _, _, v in done) / len(done)


def one_sitting(temp: float, args, target: Path, draft: Path, rep: int) -> dict:
    """{config: {"1 client": [(tok/s, seconds, valid) per prompt]}}: a fresh
    process of every configuration at once, each prompt sent to all of them
    in turn (A B C D A B C D ...), so their ratios are paired per prompt."""
    with bench_client() as client, servers_at_once(args, target, draft, client, 1, temp) as urls:
        for url in urls.values():
            request(client, url, "Make up a person.", 24, temp, 7)  # warm-up of the grammar path
        out = {config: {"1 client": []} for config in urls}
        for i, prompt in enumerate(PROMPTS):
            for config, url in urls.items():
                n, seconds, valid = request(client, url, prompt, args.tokens, temp, 100 * rep + i)
                out[config]["1 client"].append((n / seconds, seconds, valid))
    return out


def main_interleaved(args, target: Path, draft: Path) -> None:
    sittings = run_sittings(args, lambda temp, rep: one_sitting(temp, args, target, draft, rep), ["1 client"])
    report_paired(sittings, args, ["1 client"], "load")
    names = config_names(args)
    for temp in args.temps:
        print(f"\nvalid JSON with every required key, T={temp:g}: " + ", ".join(
            f"{names[cfg]} {statistics.mean(t[2] for run in sittings[temp] for t in run[cfg]['1 client']):.0%}"
            for cfg in args.configs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_common_args(ap, 160)
    ap.add_argument("--interleave", action="store_true",
                    help="every configuration's fresh process at once, each prompt sent to all in turn, ratios "
                         "paired per prompt (for a machine whose speed drifts within seconds)")
    args = ap.parse_args()
    target, draft = common_setup(ap, args)
    print(f"target {target.name}, draft {draft.name}, {args.threads} threads, json_schema chat completions of up "
          f"to {args.tokens} tokens, {len(PROMPTS)} prompts, 1 client, {args.procs} fresh processes per "
          f"configuration, {'interleaved' if args.interleave else 'taken in turns'}; loopback", flush=True)
    if args.interleave:
        main_interleaved(args, target, draft)
        return
    results = in_turns(args, lambda cfg, temp, rep: one_process(cfg, temp, args, target, draft, rep),
                       lambda got: f"{got[0]:.1f} tok/s, valid {got[1]:.0%}")
    names = config_names(args)
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
