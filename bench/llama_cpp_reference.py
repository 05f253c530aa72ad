"""llama.cpp's own llama-speculative-simple beside specgguf, on the same pair and prompts.

Benchmark only (never run by CI, nothing built is committed): the tool is
built from the llama.cpp tree vendored in the llama-cpp-python sdist pinned
by scripts/setup.sh, into ~/.cache/specgguf/llama-cpp-tools (a few minutes,
once), with the CPU flags of the installed llama-cpp-python build. Then
for each prompt: llama-speculative-simple at K = 4, greedy and temperature 0.8
(it verifies by sample-and-compare), and specgguf target-only, K = 4 and
k=auto with the same settings, in one run. Usage:

    .venv/bin/python bench/llama_cpp_reference.py [--tokens 96]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import llama_cpp

from specgguf.llama import models
from specgguf.api import SpeculativeLlama

PROMPTS = [
    "Write a detailed essay about the history of the printing press.",
    "Explain, step by step, how a bicycle stays upright while moving.",
    "Write a short story about a robot who learns to paint.",
]
X86_FEATURES = ["AVX", "AVX2", "FMA", "F16C", "BMI2", "AVX_VNNI", "AVX512", "AVX512_VBMI", "AVX512_VNNI",
                "AVX512_BF16"]


def build_flags() -> list:
    """The CPU flags of the installed llama-cpp-python build (as scripts/setup.sh
    chose them), read back from llama.cpp's own system info."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ["-DGGML_NATIVE=ON"]
    have = set(re.findall(r"(\w+) = 1", llama_cpp.llama_print_system_info().decode()))
    return ["-DGGML_NATIVE=OFF"] + [f"-DGGML_{f}=ON" for f in X86_FEATURES if f in have]


FLAGS = build_flags()


def fetch_sdist(version: str, into: Path) -> Path:
    """The llama-cpp-python sdist from PyPI's simple index, checked against the
    sha256 the index gives. (Not `pip download`: it prepares the package's
    metadata, which needs its build backend, or with build isolation a CMake
    built from source.)"""
    name = f"llama_cpp_python-{version}.tar.gz"
    with urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/") as r:
        index = r.read().decode()
    m = re.search(r'href="([^"#]*/' + re.escape(name) + r')#sha256=([0-9a-f]{64})"', index)
    if not m:
        raise RuntimeError(f"{name} is not on PyPI's simple index")
    path = into / name
    with urllib.request.urlopen(m.group(1)) as r, open(path, "wb") as out:
        shutil.copyfileobj(r, out)
    with open(path, "rb") as f:
        if hashlib.file_digest(f, "sha256").hexdigest() != m.group(2):
            raise RuntimeError(f"{name} does not match the index's sha256")
    return path


def build_tool() -> Path:
    version = llama_cpp.__version__
    key = hashlib.sha256(" ".join(FLAGS).encode()).hexdigest()[:8]
    root = Path.home() / ".cache" / "specgguf" / "llama-cpp-tools" / f"{version}-{key}"
    exe = root / "build" / "bin" / "llama-speculative-simple"
    if exe.exists():
        return exe
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        sdist = fetch_sdist(version, Path(d))
        with tarfile.open(sdist) as tar:
            tar.extractall(d, filter="data")
        src = next(Path(d).glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
        subprocess.run(["cmake", "-S", str(src), "-B", str(root / "build"), "-DCMAKE_BUILD_TYPE=Release",
                        "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_SERVER=OFF", *FLAGS], check=True)
        subprocess.run(["cmake", "--build", str(root / "build"), "-j", str(os.cpu_count() or 1),
                        "--target", "llama-speculative-simple"], check=True)
    return exe


def run_llama_cpp(exe, target, draft, prompt, n, temp, threads):
    args = [str(exe), "-m", str(target), "-md", str(draft), "-p", prompt, "-n", str(n),
            "--spec-type", "draft-simple", "--spec-draft-n-max", "4", "--spec-draft-n-min", "0", "-t", str(threads), "-td", str(threads),
            "-c", "2048", "--temp", str(temp), "--seed", "1"]
    if temp == 0:
        args += ["--top-k", "1"]
    out = subprocess.run(args, capture_output=True, text=True)
    log = out.stdout + out.stderr
    enc = re.search(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    dec = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    a = re.search(r"accept\s+=\s+([\d.]+)%", log)
    if not (enc and dec):
        raise RuntimeError(f"llama-speculative-simple failed:\n{log[-2000:]}")
    # Prompt processing included, as in specgguf's tokens_per_second.
    tps = int(dec.group(1)) / (float(enc.group(2)) + float(dec.group(2)))
    return tps, float(a.group(1)) / 100 if a else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    exe = build_tool()
    tname, dname = models.default_pair()
    tpath, dpath = models.fetch(tname), models.fetch(dname)
    spec = SpeculativeLlama(str(tpath), str(dpath), n_threads=args.threads)
    print(f"target {tname}, draft {dname}, {args.threads} threads, {args.tokens} tokens; "
          "tok/s = generated tokens / (prompt + generation time), for both")
    print(f"{'prompt':<8} {'temp':>4} {'llama.cpp K=4':>14} {'acc':>5} {'ours k=0':>9} {'ours K=4':>9} "
          f"{'acc':>5} {'ours auto':>9}")
    for i, p in enumerate(PROMPTS):
        msgs = [{"role": "user", "content": p}]
        text = spec.pair.target_llm.detokenize(spec.tokenize(msgs, chat=True), special=True).decode()
        for temp in (0.0, 0.8):
            lc, lc_acc = run_llama_cpp(exe, tpath, dpath, text, args.tokens, temp, args.threads)
            run = lambda k: (spec.reset(), spec.generate(msgs, max_tokens=args.tokens, temperature=temp, k=k,
                                                          drafter_invariant=False))[1]  # noqa: E731
            r0, r4, ra = run(0), run(4), run("auto")
            print(f"#{i + 1:<7} {temp:>4} {lc:>14.1f} {lc_acc:>5.2f} {r0.stats['tokens_per_second']:>9.1f} "
                  f"{r4.stats['tokens_per_second']:>9.1f} {r4.stats['acceptance_rate']:>5.2f} "
                  f"{ra.stats['tokens_per_second']:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
