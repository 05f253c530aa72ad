"""specgguf serve against llama.cpp's own llama-server, side by side.

The yardstick for speed: the peer a user would run instead of specgguf,
built from the same llama.cpp (the pinned llama-cpp-python sdist, same CPU
flags; scripts/build_llama_server.sh), the same model files, threads and
context per slot, on loopback. Configurations:

  llama-server            no draft
  llama-server -md        the same draft model, --spec-draft-n-max N
  specgguf serve          its defaults (k="auto"), a fresh state folder per process
  specgguf serve -k 0     plain decoding through specgguf
  sg-k0-again             a second -k 0 process: the control, whose paired
                          ratio to sg-k0 is the spread between identical
                          processes in that sitting

Both servers get as many slots as the most clients measured (-np N,
--parallel N), each slot --ctx tokens.

Each configuration runs in several fresh processes, taken in turns (A B C D
A B C D ...), because identical fresh processes differ by up to 20% here: a
figure from one process is not a measurement. With --interleave, a fresh
process of every configuration runs at once and their loads are taken in
turns request by request, so every configuration meets the same stretch of
a machine whose speed drifts within seconds, and each turn gives a paired
ratio (reported as the median over turns, with its quartiles). In each process, after one
warm-up request, C concurrent clients (for each C asked for) send chat
completions of --tokens tokens that set only max_tokens, temperature and a
per-request seed, as a plain OpenAI client does; the servers apply their own
defaults to everything else (llama-server: top-k 40, top-p 0.95, min-p 0.05;
specgguf: no truncation, what the OpenAI API means). Reported per
configuration: aggregate completion tokens/s (median over processes, and the
range), median request latency, and the ratio to llama-server's best
configuration at that load, from the same sitting.

Regime: whatever pair is given (the default SmolLM2 pair: an F32 135M target
whose draft costs about half a target step, so drafting's ceiling is
1.2-1.4x here; a board's 1-8B target is the regime the project is for).
Open chat, each prompt once per process: with more requests than prompts
a process sees a prompt again, and specgguf's lookup, which remembers
earlier answers, replays a greedy one (it says so).

    .venv/bin/python bench/vs_llama_server.py [--procs 3] [--clients 1,2,4,8]
        [--temps 0,0.8] [--tokens 128] [--configs ls,ls-draft,sg,sg-k0]
        [--interleave --per-client 8]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from common import PROMPTS, free_port  # bench/common.py

ROOT = Path(__file__).resolve().parent.parent


def llama_server_binary() -> str:
    out = subprocess.run(["bash", str(ROOT / "scripts" / "build_llama_server.sh")], check=True,
                         stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


def command(config: str, port: int, target: Path, draft: Path, args, n_slots: int) -> list:
    """The command line of one configuration, listening on 127.0.0.1:port."""
    t = str(args.threads)
    config = "sg-k0" if config == "sg-k0-again" else config  # the control: identical to sg-k0
    if config.startswith("ls"):
        cmd = [args.llama_server, "-m", str(target), "-t", t, "-tb", t, "-c", str(args.ctx * n_slots),
               "-np", str(n_slots), "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
        if config in ("ls-draft", "ls-draft-ngram"):
            cmd += ["-md", str(draft), "-td", t, "--spec-draft-n-max", str(args.draft_n_max)]
        if config == "ls-ngram":  # llama.cpp's model-free n-gram draft (its own n-min, n-max)
            cmd += ["--spec-type", "ngram-mod"]
        if config == "ls-draft-ngram":  # the draft model and the n-gram draft together
            cmd += ["--spec-type", "draft-simple,ngram-mod"]
        if config == "ls-ngram-cache":
            cmd += ["--spec-type", "ngram-cache"]
        if config in ("ls-ngram", "ls-ngram-cache"):
            cmd += ["--spec-draft-n-max", str(getattr(args, "ngram_n_max", args.draft_n_max))]
        if getattr(args, "jinja", False):  # the GGUF's template, tools and all (bench/agent.py)
            cmd += ["--jinja"]
        if getattr(args, "chat_template_file", None):
            cmd += ["--chat-template-file", args.chat_template_file]
        return cmd
    cmd = [sys.executable, "-m", "specgguf", "serve", "--target", str(target),
           "--draft", "ngram" if config == "sg-lookup" else str(draft),  # sg-lookup: the lookup alone
           "--threads", t, "--ctx", str(args.ctx), "--port", str(port), "--parallel", str(n_slots)]
    if getattr(args, "chat_template_file", None):
        cmd += ["--chat-template-file", args.chat_template_file]
    if config == "sg-model":  # the draft model alone
        cmd += ["--no-lookup"]
    return cmd + (["-k", "0"] if config == "sg-k0" else [])


def start(cmd: list, url: str, env: dict, client: httpx.Client) -> subprocess.Popen:
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"{Path(cmd[0]).name} exited with {proc.returncode}:\n{tail}")
        try:
            if client.get(url + "/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{cmd[:3]} did not become healthy in 300 s")


def request(client: httpx.Client, url: str, prompt: str, tokens: int, temp: float, seed: int):
    """(completion tokens, seconds) of one chat completion."""
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "temperature": temp, "seed": seed}
    t0 = time.perf_counter()
    r = client.post(url + "/v1/chat/completions", json=body)
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"], time.perf_counter() - t0


def load(client: httpx.Client, url: str, n_clients: int, per_client: int, tokens: int, temp: float, seed: int,
         first: int = 0):
    """(aggregate tok/s, median latency s): n_clients clients, each sending
    per_client requests one after another, all clients at once; ``first``:
    the index of the first request (which prompt and seed it takes)."""
    def one_client(c: int):
        return [request(client, url, PROMPTS[(c + i * n_clients) % len(PROMPTS)], tokens, temp,
                        seed + 1000 * c + i) for i in range(first, first + per_client)]
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(n_clients) as pool:
        done = [r for rs in pool.map(one_client, range(n_clients)) for r in rs]
    wall = time.perf_counter() - t0
    return sum(n for n, _ in done) / wall, statistics.median(s for _, s in done)


@contextlib.contextmanager
def fresh_server(config: str, args, target: Path, draft: Path, client: httpx.Client, n_slots: int):
    """A fresh server process of ``config`` on loopback with an empty state
    folder (a new user's); yields its URL; on exit, stops it and removes the folder."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    state = tempfile.mkdtemp(prefix="specgguf-bench-state-")
    try:
        proc = start(command(config, port, target, draft, args, n_slots), url,
                     dict(os.environ, SPECGGUF_STATE=state), client)
        try:
            yield url
        finally:
            stop(proc)
    finally:
        shutil.rmtree(state, ignore_errors=True)


@contextlib.contextmanager
def servers_at_once(args, target: Path, draft: Path, client: httpx.Client, n_slots: int, temp: float):
    """A fresh server process of every configuration in ``args.configs`` at
    once, each warmed up by one request; yields {config: url}."""
    with contextlib.ExitStack() as servers:
        urls = {config: servers.enter_context(fresh_server(config, args, target, draft, client, n_slots))
                for config in args.configs}
        for url in urls.values():
            request(client, url, "Hello!", 16, temp, 7)  # warm-up: first-touch of the weights
        yield urls


def bench_client() -> httpx.Client:
    """An HTTP client with room for every concurrent client of a load."""
    return httpx.Client(timeout=600, limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))


def one_process(config: str, temp: float, args, target: Path, draft: Path, rep: int) -> dict:
    """{n_clients: (tok/s, latency)} from one fresh server process."""
    with bench_client() as client, fresh_server(config, args, target, draft, client, max(args.clients)) as url:
        request(client, url, "Hello!", 16, temp, 7)  # warm-up: first-touch of the weights
        return {c: load(client, url, c, args.per_client, args.tokens, temp, 100 * rep) for c in args.clients}


def one_sitting(temp: float, args, target: Path, draft: Path, rep: int) -> dict:
    """{config: {n_clients: [(tok/s, latency) per turn]}}: a fresh process of
    every configuration at once, their loads taken in turns request by
    request (A B C D A B C D ...). Identical fresh processes here differ by
    up to 20% and the machine's speed drifts within seconds: taken in turns,
    every configuration meets the same stretch of machine, and each turn's
    ratio between them is paired."""
    with bench_client() as client, servers_at_once(args, target, draft, client, max(args.clients), temp) as urls:
        out = {config: {c: [] for c in args.clients} for config in urls}
        for turn in range(args.per_client):
            for c in args.clients:
                for config, url in urls.items():
                    out[config][c].append(load(client, url, c, 1, args.tokens, temp, 100 * rep, turn))
        return out


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def config_names(args) -> dict:
    """Each configuration's name in the tables."""
    return {"ls": "llama-server, no draft", "ls-draft": f"llama-server -md, n-max {args.draft_n_max}",
            "sg": "specgguf serve (defaults, fresh state)", "sg-k0": "specgguf serve -k 0",
            "sg-k0-again": "specgguf serve -k 0, a second process (the control)"}


def paired(runs: list, cfg: str, base: str, key) -> str:
    """The median over turns of cfg's tok/s over base's in the same turn,
    with its quartiles; ``runs``: one {config: {key: [(tok/s, ...) per turn]}}
    per sitting."""
    r = [a[0] / b[0] for run in runs for a, b in zip(run[cfg][key], run[base][key])]
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0]] * 3
    return f"{statistics.median(r):.2f}x ({q[0]:.2f}-{q[2]:.2f})"


def report_paired(sittings: dict, args, keys: list, key_name: str = "clients") -> None:
    """The interleaved runs' table: per configuration and key (client
    count), tok/s (median over processes of each one's median turn, and the
    range), the median latency, and paired ratios (median over turns of the
    two's tok/s in the same turn, with quartiles) to llama-server's best
    configuration and, when it ran, to specgguf -k 0 (plain decoding through
    the same code)."""
    names = config_names(args)
    plain = "sg-k0" if "sg-k0" in args.configs else None
    for temp in args.temps:
        runs = sittings[temp]
        print(f"\n### temperature {temp:g}: {args.procs} fresh processes each, {len(runs[0][args.configs[0]][keys[0]])} "
              "turns per process, taken in turns\n")
        print(f"| {key_name} | configuration | tok/s median | range over processes | latency median | "
              "vs llama-server best, paired (quartiles) | vs specgguf -k 0, paired |")
        print("|---|---|---|---|---|---|---|")
        for c in keys:
            per_proc = {cfg: [statistics.median(t[0] for t in run[cfg][c]) for run in runs] for cfg in args.configs}
            med = {cfg: statistics.median(v) for cfg, v in per_proc.items()}
            best = max((cfg for cfg in args.configs if cfg.startswith("ls")), key=med.get, default=None)
            for cfg in args.configs:
                lat = statistics.median(t[1] for run in runs for t in run[cfg][c])
                print(f"| {c} | {names[cfg]} | {med[cfg]:.1f} | {min(per_proc[cfg]):.1f}-{max(per_proc[cfg]):.1f} | "
                      f"{lat:.2f} s | {paired(runs, cfg, best, c) if best else '-'} | "
                      f"{paired(runs, cfg, plain, c) if plain else '-'} |")


def report(results: dict, args) -> None:
    names = config_names(args)
    for temp in args.temps:
        print(f"\n### temperature {temp:g}: aggregate tok/s over {args.procs} fresh processes each\n")
        print("| clients | configuration | tok/s median | range | latency median | vs llama-server best |")
        print("|---|---|---|---|---|---|")
        for c in args.clients:
            med = {cfg: statistics.median(r[c][0] for r in results[cfg, temp]) for cfg in args.configs
                   if (cfg, temp) in results}
            ls_best = max((v for k, v in med.items() if k.startswith("ls")), default=None)
            for cfg in args.configs:
                runs = results.get((cfg, temp))
                if not runs:
                    continue
                tps = [r[c][0] for r in runs]
                lat = statistics.median(r[c][1] for r in runs)
                ratio = f"{med[cfg] / ls_best:.2f}x" if ls_best else "-"
                print(f"| {c} | {names[cfg]} | {med[cfg]:.1f} | {min(tps):.1f}-{max(tps):.1f} | "
                      f"{lat:.2f} s | {ratio} |")


def add_common_args(ap: argparse.ArgumentParser, tokens: int) -> None:
    """The options every server-against-server benchmark takes."""
    ap.add_argument("--target", help="target GGUF (default: the default pair's)")
    ap.add_argument("--draft", help="draft GGUF (default: the default pair's)")
    ap.add_argument("--procs", type=int, default=3, help="fresh processes per configuration and temperature (3)")
    ap.add_argument("--temps", default="0,0.8", help="temperatures, comma-separated (0,0.8)")
    ap.add_argument("--tokens", type=int, default=tokens, help=f"max_tokens per request ({tokens})")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads (every core)")
    ap.add_argument("--ctx", type=int, default=2048, help="context per slot (2048)")
    ap.add_argument("--draft-n-max", type=int, default=4, help="llama-server's --spec-draft-n-max (4)")
    ap.add_argument("--configs", default="ls,ls-draft,sg,sg-k0", help="which configurations (all four)")
    ap.add_argument("--llama-server", help="a llama-server binary (default: build it from the pinned sdist)")


def common_setup(ap: argparse.ArgumentParser, args) -> tuple:
    """Checked options, and the (target, draft) files; builds llama-server when needed."""
    args.temps = [float(t) for t in args.temps.split(",")]
    args.configs = [c for c in args.configs.split(",") if c]
    if unknown := set(args.configs) - {"ls", "ls-draft", "sg", "sg-k0", "sg-k0-again"}:
        ap.error(f"unknown configurations: {sorted(unknown)}")
    from specgguf.llama import models
    tname, dname = models.default_pair()
    target = Path(args.target) if args.target else models.fetch(tname)
    draft = Path(args.draft) if args.draft else models.fetch(dname)
    if any(c.startswith("ls") for c in args.configs):
        args.llama_server = args.llama_server or llama_server_binary()
    return target, draft


def run_sittings(args, sitting, keys: list) -> dict:
    """``{temperature: [sitting(temp, rep) per process]}``: ``args.procs``
    interleaved sittings per temperature, each printed as it comes (every
    configuration's median tok/s per key)."""
    sittings: dict = {temp: [] for temp in args.temps}
    for rep in range(args.procs):
        for temp in args.temps:
            got = sitting(temp, rep)
            sittings[temp].append(got)
            print(f"  processes {rep + 1}, T={temp:g}: " + ", ".join(
                f"{cfg} {statistics.median(t[0] for t in got[cfg][c]):.1f}" for cfg in got for c in keys), flush=True)
    return sittings


def in_turns(args, run, show) -> dict:
    """``{(configuration, temperature): [run(cfg, temp, rep) per process]}``,
    the configurations taken in turns (A B C D A B C D ...), each result
    printed with ``show`` as it comes."""
    results: dict = {}
    for rep in range(args.procs):
        for temp in args.temps:
            for cfg in args.configs:
                got = run(cfg, temp, rep)
                results.setdefault((cfg, temp), []).append(got)
                print(f"  process {rep + 1}, T={temp:g}, {cfg}: {show(got)}", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_common_args(ap, 128)
    ap.add_argument("--clients", default="1,2,4,8", help="concurrent client counts, comma-separated (1,2,4,8)")
    ap.add_argument("--per-client", type=int, default=2,
                    help="requests per client per measurement (2); with --interleave, turns per process")
    ap.add_argument("--interleave", action="store_true",
                    help="every configuration's fresh process at once, loads taken in turns request by request, "
                         "ratios paired per turn (for a machine whose speed drifts within seconds)")
    args = ap.parse_args()
    args.clients = sorted({int(c) for c in args.clients.split(",")})
    target, draft = common_setup(ap, args)
    print(f"target {target.name}, draft {draft.name}, {args.threads} threads, {args.tokens}-token chat "
          f"completions, clients {args.clients} x {args.per_client} requests, {args.procs} fresh processes per "
          f"configuration, {'interleaved' if args.interleave else 'taken in turns'}; loopback", flush=True)
    asked = sum(c * args.per_client for c in args.clients)
    if asked > len(PROMPTS):
        print(f"note: {asked} requests a process over {len(PROMPTS)} prompts: prompts repeat within a process, and "
              "specgguf's lookup remembers earlier answers, so a repeated greedy prompt can be replayed (a "
              "chat-regime figure needs clients x per-client <= the prompts)", flush=True)
    if args.interleave:
        sittings = run_sittings(args, lambda temp, rep: one_sitting(temp, args, target, draft, rep), args.clients)
        report_paired(sittings, args, args.clients)
        return
    results = in_turns(args, lambda cfg, temp, rep: one_process(cfg, temp, args, target, draft, rep),
                       lambda got: ", ".join(f"{c} clients {got[c][0]:.1f} tok/s" for c in args.clients))
    report(results, args)


if __name__ == "__main__":
    main()
