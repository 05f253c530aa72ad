"""The command line under real use: errors, stats, pipes, Ctrl-C, odd input."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("llama_cpp")

from tests.conftest import PROMPTS  # noqa: E402

CLI = [sys.executable, "-m", "specgguf"]


def env():
    """The environment at call time: the fixtures' private state folder included."""
    return dict(os.environ, PYTHONUNBUFFERED="1")


def cli(*args, **kw):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, env=dict(env(), **kw.pop("env", {})),
                          timeout=kw.pop("timeout", 300), **kw)


def test_argument_errors_are_one_line():
    for args, msg in ((["--temp", "-1", "-p", "hi"], "must be a finite number >= 0.0"),
                      (["--ctx", "100", "-p", "hi"], "must be >= 256"),
                      (["-k", "two", "-p", "hi"], "is not a valid int"),
                      (["--frobnicate"], "unrecognized arguments"),
                      (["models", "fetch"], "the following arguments are required")):
        r = cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr, (args, r.stderr)


def test_runtime_errors_are_one_line():
    r = cli("--target", "/nonexistent.gguf", "-p", "hi")
    assert r.returncode == 1
    assert r.stderr.strip().startswith("specgguf: error:") and "Traceback" not in r.stderr
    r = cli("-k", "2", "--p-min", "auto", "-p", "hi")
    assert r.returncode == 1 and "with k='auto'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_version():
    import specgguf
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"specgguf {specgguf.__version__}"


def test_runs_the_default_pair_with_json_and_stats():
    r = cli("-p", "Hello", "-n", "8", "--json", "--chat", "--threads", "2")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["tokens"]) <= 8 and out["stats"]["rounds"] >= 1
    assert len(out["sources"]) == len(out["tokens"]) and set(out["sources"]) <= {"draft", "target"}
    r = cli("--chat", "-p", PROMPTS[1], "-n", "24", "--stats", "--threads", "2")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if " tok/s" in x)
    n, seconds, rate = line.split()[1], line.split()[4], line.split("(")[1].split()[0]
    # The count beside tokens/s is what was generated (no end token), and they agree.
    assert int(n) <= 24 and abs(int(n) / float(seconds) - float(rate)) < 0.15 * float(rate) + 0.2
    assert "after the first token" in line
    assert "specgguf: k=auto: " in r.stderr and "plain decoding" in r.stderr  # why it drafted as it did
    assert "bit-identical to plain decoding (llama.cpp's batch invariance is on)" in r.stderr


def test_check_pair_measures_whether_output_is_bit_identical():
    """check-pair compares the target's batched rows with one token at a
    time, bit for bit: identical with specgguf's build, and the measured
    difference once the switch is off."""
    r = cli("check-pair", "-n", "24", "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert "output identical to the target alone: yes" in r.stdout
    assert "exactness: bit-identical here" in r.stdout, r.stdout
    r = cli("check-pair", "-n", "24", "--threads", "2", env={"SPECGGUF_BATCH_INVARIANT": "0"})
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("exactness:"))
    assert "up to rounding here" in line and "max logit difference" in line and "turned off" in line, line


def test_ngram_draft_and_stop_strings():
    copy = "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps."
    r = cli("--draft", "ngram", "--chat", "-p", copy, "-n", "24", "--stats", "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert "K chosen per round" in r.stderr
    r = cli("-p", "Count: 1, 2, 3,", "-n", "30", "--stop", "6", "--threads", "2")
    assert r.returncode == 0 and "6" not in r.stdout


def test_grammar_schema_penalties_and_bias_flags(tmp_path):
    schema = '{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}'
    r = cli("--chat", "-p", "Is water wet? Answer as JSON.", "-n", "20", "--json-schema", schema, "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert isinstance(json.loads(r.stdout)["ok"], bool)
    g = tmp_path / "yes.gbnf"
    g.write_text('root ::= ("yes" | "no") "."\n')
    r = cli("--chat", "-p", "Is the sky blue?", "-n", "8", "--grammar-file", str(g), "--threads", "2")
    assert r.returncode == 0 and r.stdout.strip() in ("yes.", "no."), (r.stdout, r.stderr)
    r = cli("-p", "1, 2, 3,", "-n", "12", "--repeat-penalty", "1.3", "--frequency-penalty", "0.5",
            "--logit-bias", "11-inf", "--threads", "2", "--json")
    assert r.returncode == 0 and 11 not in json.loads(r.stdout)["tokens"], r.stderr
    for args, msg in ((["--json-schema", "{not json"], "--json-schema: not JSON"),
                      (["--grammar-file", str(tmp_path / "missing.gbnf")], "missing.gbnf"),
                      (["--logit-bias", "12x"], "--logit-bias '12x'"),
                      (["--grammar-file", str(g), "--json-schema", "{}"], "not allowed with argument")):
        r = cli("-p", "hi", "-n", "2", *args)
        assert r.returncode in (1, 2) and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_non_utf8_prompt_file_is_decoded_with_a_warning(tmp_path):
    f = tmp_path / "prompt.txt"
    f.write_bytes(b"Caf\xe9 menu:\n")
    r = cli("--prompt-file", str(f), "-n", "4", "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert f"{f} is not valid UTF-8 (first bad byte at offset 3)" in r.stderr
    r = subprocess.run(CLI + ["-n", "4", "--threads", "2"], input=b"\xff\xfe hello", capture_output=True,
                       env=env(), timeout=300)
    assert r.returncode == 0 and b"stdin is not valid UTF-8 (first bad byte at offset 0)" in r.stderr


def test_streaming_into_a_closed_pipe_ends_quietly():
    p = subprocess.Popen(" ".join(CLI) + " --chat -p 'Write a long story.' -n 200 --threads 2 | head -c 20",
                         shell=True, executable="/bin/bash", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env())
    out, err = p.communicate(timeout=300)
    assert len(out) == 20
    assert b"Broken pipe" not in err and b"Traceback" not in err, err
    r = subprocess.run(" ".join(CLI) + " --chat -p 'Write a long story.' -n 200 --threads 2 | head -c 20; "
                       "echo \" ${PIPESTATUS[0]}\"", shell=True, executable="/bin/bash", capture_output=True,
                       env=env(), timeout=300)
    assert r.stdout.split()[-1] == b"141"  # as a Unix tool killed by SIGPIPE


@pytest.mark.parametrize("delay", [0.25, 1.5, 4.0])
def test_ctrl_c_exits_130_at_any_moment(delay):
    """While Python starts, while models load (where a KeyboardInterrupt raised
    in a ctypes callback used to be swallowed), and while generating (1900
    tokens: with the lookup a story of 400 could end before the signal)."""
    p = subprocess.Popen(CLI + ["-p", "Once upon a time", "-n", "1900", "--threads", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, (p.returncode, err[-500:])
    assert b"Traceback" not in err


def test_bench_measures_each_k_and_recommends_the_fastest(tmp_path, private_state):
    """`specgguf bench`: a table row per configuration, the recommended K
    the fastest fixed row's, a plot, and the user's state left alone."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Write a poem about the sea.\n\nList three colours.\n")
    png = tmp_path / "k.png"
    r = cli("bench", "--threads", "2", "--tokens", "12", "--turns", "1", "--ks", "0-2,auto",
            "--prompts", str(prompts), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.split()[:1] in
            (["0"], ["1"], ["2"], ["auto"])}
    assert set(rows) == {"0", "1", "2", "auto"} and rows["0"][2] == "1.00x"
    speeds = {k: float(v[1]) for k, v in rows.items() if k != "auto"}
    best = max(speeds, key=lambda k: (speeds[k], -int(k)))
    line = [x for x in r.stdout.splitlines() if x.startswith("recommended:")][0]
    assert (f"-k {best} " in line) if best != "0" else ("no drafting" in line)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bench: 8/8 generations" in r.stderr  # progress (4 configurations x 2 prompts), to the end
    assert "the draft model alone" in r.stderr  # K is the model's: no lookup in front replays earlier turns
    assert not any(private_state.iterdir())  # its learning went to a temporary folder
    for args, msg in ((["--ks", "0,x"], "--ks"), (["--tokens", "1"], "--tokens")):
        bad = cli("bench", *args)
        assert bad.returncode == 2 and msg in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    missing = cli("bench", "--prompts", str(tmp_path / "none.txt"))
    assert missing.returncode == 1 and "none.txt" in missing.stderr
    no_plot = subprocess.run([sys.executable, "-c", "import sys; sys.modules['matplotlib'] = None; "
                              "from specgguf.cli import main; sys.exit(main(['bench', '--plot', 'x.png']))"],
                             capture_output=True, text=True, env=env(), timeout=120)
    assert no_plot.returncode == 1 and "pip install 'specgguf[plot]'" in no_plot.stderr  # before any run


def test_bench_on_a_workload_says_which_drafts_pay(tmp_path, private_state):
    """`specgguf bench --workload FILE`: plain decoding, the draft model,
    the lookup and both on the user's prompts, a row each with the share of
    tokens each source gave, and a line naming the fastest; a file that does
    not read is one line naming it."""
    work = tmp_path / "mine.txt"
    work.write_text("Repeat exactly: the quick brown fox jumps over the lazy dog.\n---\n"
                    "```python\ndef add(a, b):\n    return a + b\n```\nAdd type hints. Reply with the function.\n")
    r = cli("bench", "--threads", "2", "--tokens", "16", "--turns", "1", "--workload", str(work))
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()
            if line.split()[:1] in (["plain"], ["model"], ["lookup"], ["both"])}
    assert set(rows) == {"plain", "model", "lookup", "both"} and rows["plain"][2] == "1.00x"
    assert rows["plain"][-2:] == ["0%", "0%"] and rows["model"][-1] == "0%" and rows["lookup"][-2] == "0%"
    assert float(rows["lookup"][-1].rstrip("%")) > 0  # the first prompt asks for a copy
    assert any(line.startswith(("fastest here:", "no draft pays here")) for line in r.stdout.splitlines())
    assert "bench: 8/8 generations" in r.stderr and not any(private_state.iterdir())
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"prompt": 5}\n')
    for arg, msg in ((str(bad), "bad.jsonl:2"), ("code_edit", "neither a built-in workload")):
        r = cli("bench", "--workload", arg)
        assert r.returncode == 1 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli("bench", "--workload", "chat", "--ks", "0,1")
    assert r.returncode == 2 and "--workload" in r.stderr


def test_workload_files_and_the_built_in_workloads(tmp_path):
    """What a workload file may hold, and the built-in ones: from text on
    this machine, the same items for the same seed."""
    from specgguf.cli.workloads import WORKLOADS, items, read_workload
    p = tmp_path / "w.jsonl"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n\n"
                 + json.dumps({"prompt": "def f(", "response_format": {"type": "json_object"}}) + "\n")
    assert read_workload(str(p)) == [([{"role": "user", "content": "hi"}], {}),
                                     ("def f(", {"response_format": {"type": "json_object"}})]
    t = tmp_path / "w.txt"
    t.write_text("first\nprompt\n---\n\n---  \nsecond\n")
    assert [m[0]["content"] for m, _ in read_workload(str(t))] == ["first\nprompt", "second"]
    t.write_text("---\n")
    with pytest.raises(ValueError, match="no prompt"):
        read_workload(str(t))
    for w in WORKLOADS:
        got = items(w, 2, seed=3)
        assert len(got) == 2 and got == items(w, 2, seed=3) and all(m[0]["content"].strip() for m, _ in got)


def test_a_first_hour_without_surprises(tmp_path):
    """What a new user trips on: each is one clear line, llama.cpp's own
    warnings stay quiet unless --verbose, and an offline hub model fails at
    once naming the model and its size."""
    for args, msg in ((["--prompt-file", str(tmp_path / "none.txt")], "--prompt-file"),
                      (["--target", str(tmp_path), "-p", "hi"], "is a folder"),
                      (["--tensor-split", "1", "-p", "hi"], "give rpc too"),
                      (["--rpc", "127.0.0.1:9,127.0.0.1:10", "--tensor-split", "1,1,1", "-p", "hi"],
                       "3 shares for 2 rpc workers")):
        r = cli(*args)
        assert r.returncode == 1 and msg in r.stderr, (args, r.stderr)
        assert r.stderr.startswith("specgguf: error:") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    usage = cli("-k", "40", "-p", "hi")
    assert usage.returncode == 2 and usage.stderr.startswith("specgguf: error:")  # one prefix for every error
    assert "0-32" in cli("--help").stdout.replace("\n", " ")
    listing = cli("models")
    assert listing.returncode == 0 and all(c in listing.stdout for c in ("list", "fetch", "verify"))
    assert "``" not in cli("models", "--help").stdout
    assert "smollm2-135m-f32" in cli("models", "fetch", "--help").stdout
    t0 = time.time()
    offline = cli("models", "fetch", "smollm2-1.7b-q4_k_m",
                  env={"HF_ENDPOINT": "http://127.0.0.1:9", "SPECGGUF_CACHE": str(tmp_path / "cache")})
    assert offline.returncode == 1 and time.time() - t0 < 15
    assert "smollm2-1.7b-q4_k_m" in offline.stderr and "MiB" in offline.stderr and "cannot be reached" in offline.stderr
    assert len(offline.stderr.strip().splitlines()) == 1, offline.stderr
    quiet = cli("--ctx", "100000", "--chat", "-p", "hi", "-n", "2", "--threads", "2")
    assert quiet.returncode == 0 and "n_ctx_seq" not in quiet.stderr, quiet.stderr
    loud = cli("--ctx", "100000", "--chat", "-p", "hi", "-n", "2", "--threads", "2", "--verbose")
    assert "n_ctx_seq" in loud.stderr
    assert "identifying" not in cli("models", "verify").stderr


def test_the_lookup_flags():
    """--lookup / --no-lookup (and --ngram, --lookup's former name) set the
    lookup in front of the draft; unset, it is the default's (on with one
    request at a time); --lookup-memory is checked as a token count."""
    from specgguf.cli.main import build_parser
    parse = build_parser().parse_args
    assert parse([]).lookup is None and parse([]).lookup_memory == 16384
    assert parse(["--no-lookup"]).lookup is False
    assert parse(["--lookup"]).lookup is True and parse(["--ngram"]).lookup is True
    assert parse(["--lookup-memory", "0"]).lookup_memory == 0
    with pytest.raises(SystemExit):
        parse(["--lookup-memory", "-1"])
