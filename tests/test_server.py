"""The OpenAI-compatible server as users meet it: a real `specgguf serve`
process on a loopback port, driven by the real `openai` client and by raw
HTTP for every bad request."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

pytest.importorskip("llama_cpp")
openai = pytest.importorskip("openai")

from tests.conftest import PROMPTS  # noqa: E402

KEY = "test-key-123"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A `python -m specgguf serve` subprocess and what it logged."""

    def __init__(self, *args, key=KEY):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "specgguf", "serve", "--port", str(self.port), "--threads", "2",
               "--ctx", "512", *args] + (["--api-key", key] if key else [])
        self.log = open(os.path.join(os.environ["SPECGGUF_STATE"], f"server-{self.port}.log"), "w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/health", headers=self.headers, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.3)
            assert self.proc.poll() is None, self.text()
        raise AssertionError("the server did not start: " + self.text())

    def text(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def post(self, path, body, **kw):
        return httpx.post(self.url + path, content=body if isinstance(body, (bytes, str)) else json.dumps(body),
                          headers=dict(self.headers, **kw.pop("headers", {})), timeout=kw.pop("timeout", 120), **kw)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module")
def served(session_state):
    s = Served()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def chat(prompt):
    return [{"role": "user", "content": prompt}]


def test_models_and_health(served, client):
    assert [m.id for m in client.models.list()] == ["smollm2-135m-f32"]
    assert httpx.get(served.url + "/health", headers=served.headers).json()["status"] == "ok"


def test_chat_and_completion_through_the_openai_client(client):
    r = client.chat.completions.create(model="x", messages=chat(PROMPTS[1]), max_tokens=24, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("length", "stop") and r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    spec = r.model_extra["speculation"]
    assert {"drafted", "accepted", "acceptance_rate", "rounds", "k_chosen"} <= set(spec)
    assert "plain decoding" in spec["why"]  # k="auto" says why it drafted as it did (the engine's slots)
    c = client.completions.create(model="x", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert c.object == "text_completion" and c.choices[0].text and c.usage.completion_tokens <= 8


def test_streaming_equals_the_whole_response(client):
    whole = client.chat.completions.create(model="x", messages=chat(PROMPTS[0]), max_tokens=30, temperature=0)
    stream = client.chat.completions.create(model="x", messages=chat(PROMPTS[0]), max_tokens=30, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    pieces = [c.choices[0].text for c in client.completions.create(model="x", prompt="Once upon a time",
                                                                   max_tokens=12, temperature=0, stream=True)]
    assert "".join(pieces) == client.completions.create(model="x", prompt="Once upon a time", max_tokens=12,
                                                        temperature=0).choices[0].text


def test_sources_say_which_tokens_came_from_the_draft(client):
    """Each completion token's provenance: the "draft" and "lookup" entries
    are the accepted draft tokens (the lookup's from the same request asked
    before), and a stream's chunks carry their own tokens' sources, which
    together are its final counts. (Not the earlier response's: the lookup's
    memory holds every earlier answer, so a repeat may draft otherwise: in
    process, the second and third of three identical greedy K=4 chats drafted
    4 and 3 model tokens.) llama-server's timings ride along."""
    ask = dict(model="x", messages=chat(PROMPTS[0]), max_tokens=40, temperature=0, extra_body={"k": 4})
    client.chat.completions.create(**ask)  # a new prompt's first round is plain; a cached one's drafts
    whole = client.chat.completions.create(**ask)
    spec, sources = whole.model_extra["speculation"], whole.model_extra["speculation"]["sources"]
    assert whole.choices[0].finish_reason == "length" and len(sources) == whole.usage.completion_tokens == 40
    assert set(sources) <= {"draft", "lookup", "target"} and "target" in sources
    assert len(sources) - sources.count("target") == spec["accepted"] > 0
    assert spec["tokens_by_source"] == {s: sources.count(s) for s in ("target", "draft", "lookup")}
    assert sources.count("target") == spec["rounds"]  # one target token per round
    timings = whole.model_extra["timings"]
    assert timings["draft_n"] == spec["drafted"] and timings["draft_n_accepted"] == spec["accepted"]
    assert timings["predicted_n"] == 40 and timings["predicted_per_second"] > 0
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = [s for c in chunks for s in (c.model_extra.get("speculation") or {}).get("sources", [])]
    final = chunks[-1].model_extra["speculation"]
    assert len(streamed) == 40 and streamed.count("target") == final["rounds"]
    assert final["tokens_by_source"] == {s: streamed.count(s) for s in ("target", "draft", "lookup")}
    for c in chunks:  # a chunk's sources are its own text's tokens: none without text
        if c.choices and not c.choices[0].delta.content:
            assert not (c.model_extra.get("speculation") or {}).get("sources")
    assert chunks[-1].model_extra["timings"]["draft_n_accepted"] == final["accepted"]
    text = client.completions.create(model="x", prompt="Count: 1, 2, 3,", max_tokens=24, temperature=0,
                                     extra_body={"k": 4}).model_extra
    assert len(text["speculation"]["sources"]) == 24 and 24 - text["speculation"]["sources"].count("target") == \
        text["speculation"]["accepted"]


def test_stop_strings_and_seeds(client):
    full = client.completions.create(model="x", prompt="Count: 1, 2, 3,", max_tokens=30, temperature=0)
    assert "6" in full.choices[0].text
    cut = client.completions.create(model="x", prompt="Count: 1, 2, 3,", max_tokens=30, temperature=0, stop=["6"])
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == full.choices[0].text.split("6")[0]
    a = client.chat.completions.create(model="x", messages=chat(PROMPTS[2]), max_tokens=24, temperature=0.9, seed=5)
    b = client.chat.completions.create(model="x", messages=chat(PROMPTS[2]), max_tokens=24, temperature=0.9, seed=5)
    c = client.chat.completions.create(model="x", messages=chat(PROMPTS[2]), max_tokens=24, temperature=0.9, seed=6)
    assert a.choices[0].message.content == b.choices[0].message.content != c.choices[0].message.content
    assert a.model_extra["speculation"]["verification"] == "invariant"


def test_greedy_text_equals_generate_in_process(client):
    import specgguf
    for prompt in PROMPTS[:2]:
        served = client.chat.completions.create(model="x", messages=chat(prompt), max_tokens=40, temperature=0)
        local = specgguf.generate(chat(prompt), target="smollm2-135m-f32", draft="smollm2-135m-q4_1",
                                  max_tokens=40, n_ctx=512, n_threads=2)
        assert served.choices[0].message.content == local.text


def test_every_route_needs_the_key(served):
    for key in (None, "wrong"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                             ("GET", "/nope"), ("POST", "/health")):
            r = httpx.request(method, served.url + path, headers=headers, content=b"{}")
            assert r.status_code == 401, (key, path)
            assert r.json()["error"]["code"] == "invalid_api_key"
        # Liveness probes cannot send keys: /health answers, and says nothing else.
        r = httpx.get(served.url + "/health", headers=headers)
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        # A browser asks for the page's icon without the key: no icon, and no error either.
        r = httpx.get(served.url + "/favicon.ico", headers=headers)
        assert r.status_code == 204 and not r.content
        assert httpx.post(served.url + "/favicon.ico", headers=headers).status_code == 401
    full = httpx.get(served.url + "/health", headers=served.headers).json()
    assert full["status"] == "ok" and "model" in full and "busy" in full


GOOD = {"messages": chat("Hi"), "max_tokens": 4}
BAD_REQUESTS = [
    (b"{not json", None),
    (b"[1, 2]", None),
    ({"max_tokens": 4}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({**GOOD, "temperature": -0.5}, "temperature"),
    ({**GOOD, "temperature": "hot"}, "temperature"),
    ({**GOOD, "max_tokens": -1}, "max_tokens"),
    ({**GOOD, "max_tokens": "ten"}, "max_tokens"),
    ({**GOOD, "top_p": 3}, "top_p"),
    ({**GOOD, "seed": -4}, "seed"),
    ({**GOOD, "stop": 7}, "stop"),
    ({**GOOD, "stream": "yes"}, "stream"),
    ({**GOOD, "n": 0}, "n"),
    ({**GOOD, "n": 99}, "n"),
    ({**GOOD, "logprobs": "yes"}, "logprobs"),
    ({**GOOD, "top_logprobs": 3}, "top_logprobs"),
    ({**GOOD, "logprobs": True, "top_logprobs": 30}, "top_logprobs"),
    ({**GOOD, "presence_penalty": 5}, "presence_penalty"),
    ({**GOOD, "logit_bias": {"x": 5}}, "logit_bias"),
    ({**GOOD, "logit_bias": {"1": 500}}, "logit_bias"),
    ({**GOOD, "tools": {"type": "function", "function": {"name": "f"}}}, "tools"),
    ({**GOOD, "tools": [{"type": "function", "function": {"name": "no spaces please"}}]}, "tools"),
    ({**GOOD, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "foo"}}}]}, "tools"),
    ({**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}], "response_format": {"type": "json_object"}},
     "tools"),
    ({**GOOD, "messages": [{"role": "assistant", "content": None, "tool_calls": "f()"}]}, "messages"),
    ({**GOOD, "tool_choice": "required"}, "tool_choice"),
    ({**GOOD, "response_format": {"type": "xml"}}, "response_format"),
    ({**GOOD, "response_format": {"type": "json_schema"}}, "response_format"),
    ({**GOOD, "grammar": "root ::= nowhere"}, "grammar"),
    ({**GOOD, "grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "response_format"),
    ({**GOOD, "frobnicate": 1}, "frobnicate"),
    ({"messages": chat("word " * 600)}, "messages"),  # longer than the 512-token context
]


@pytest.mark.parametrize("body,param", BAD_REQUESTS)
def test_bad_requests_get_a_400_naming_the_field(served, body, param):
    r = served.post("/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    assert len(err["message"]) < 400  # a long field (a tools list) is named, not repeated


def test_structured_output_through_the_openai_client(client):
    """``parse()`` with a pydantic model (a strict json_schema) and JSON mode:
    the text parses and validates; greedy, it is what the pair gives in
    process with the same schema."""
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str
        country: str
        population: int

    msgs = chat("Give the name, country and population of the capital of France.")
    r = client.beta.chat.completions.parse(model="x", messages=msgs, response_format=City, max_tokens=60,
                                           temperature=0)
    city = r.choices[0].message.parsed
    assert isinstance(city, City) and city.name
    import specgguf
    from specgguf.config import response_format_grammar
    schema = City.model_json_schema()
    local = specgguf.SpeculativeLlama("smollm2-135m-f32", "smollm2-135m-q4_1", n_ctx=512, n_threads=2)
    want = local.generate(msgs, chat=True, max_tokens=60, temperature=0, grammar=response_format_grammar(
        {"type": "json_schema", "json_schema": {"name": "City", "schema": schema}}))
    assert r.choices[0].message.content == want.text
    ok = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
    j = client.chat.completions.create(model="x", messages=chat("Reply with a JSON object with a key 'ok'."),
                                       max_tokens=40, temperature=0,
                                       response_format={"type": "json_object", "schema": ok})
    assert j.choices[0].finish_reason == "stop", j  # the schema closes the object within the budget
    assert isinstance(json.loads(j.choices[0].message.content)["ok"], bool)


def test_logprobs_n_bias_and_penalties(client):
    lp = client.chat.completions.create(model="x", messages=chat("Say hello."), max_tokens=8, temperature=0,
                                        logprobs=True, top_logprobs=3)
    content = lp.choices[0].logprobs.content
    assert "".join(c.token for c in content) == lp.choices[0].message.content
    assert all(len(c.top_logprobs) == 3 and c.logprob <= 0 for c in content)
    stream = client.chat.completions.create(model="x", messages=chat("Say hello."), max_tokens=8, temperature=0,
                                            logprobs=True, top_logprobs=3, stream=True)
    streamed = [c.token for ch in stream if ch.choices and ch.choices[0].logprobs
                for c in ch.choices[0].logprobs.content]
    assert streamed == [c.token for c in content]
    two = client.chat.completions.create(model="x", messages=chat("Name a colour."), max_tokens=8, temperature=1.0,
                                         seed=3, n=2)
    assert [c.index for c in two.choices] == [0, 1]
    for seed, choice in zip((3, 4), two.choices):  # choice j samples with seed + j
        one = client.chat.completions.create(model="x", messages=chat("Name a colour."), max_tokens=8,
                                             temperature=1.0, seed=seed)
        assert one.choices[0].message.content == choice.message.content
    plain = client.completions.create(model="x", prompt="Count to ten:", max_tokens=12, temperature=0)
    from specgguf.llama import models
    import llama_cpp
    vocab = llama_cpp.Llama(str(models.fetch("smollm2-135m-f32")), vocab_only=True, verbose=False)
    first = vocab.tokenize(plain.choices[0].text.encode(), add_bos=False)[0]
    biased = client.completions.create(model="x", prompt="Count to ten:", max_tokens=12, temperature=0,
                                       logit_bias={str(first): -100})
    assert vocab.tokenize(biased.choices[0].text.encode(), add_bos=False)[0] != first
    penalised = client.completions.create(model="x", prompt="Count to ten:", max_tokens=12, temperature=0,
                                          frequency_penalty=1.5, presence_penalty=1.0)
    assert penalised.choices[0].text != plain.choices[0].text


def test_list_prompts_each_get_what_they_get_alone(client):
    prompts = ["The capital of France is", "One, two, three,"]
    many = client.completions.create(model="x", prompt=prompts, max_tokens=8, temperature=0)
    assert [c.index for c in many.choices] == [0, 1]
    for c, p in zip(many.choices, prompts):
        assert c.text == client.completions.create(model="x", prompt=p, max_tokens=8, temperature=0).choices[0].text
    stream = client.completions.create(model="x", prompt=prompts, max_tokens=8, temperature=0, stream=True)
    texts = ["", ""]
    for ch in stream:
        for c in ch.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in many.choices]


def test_the_api_details_clients_read(served, client):
    bare = openai.OpenAI(base_url=served.url, api_key=KEY, max_retries=0, timeout=120)  # no /v1, as llama-server
    r = bare.chat.completions.create(model="x", messages=chat("Hi"), max_tokens=4, temperature=0, tool_choice="none")
    assert r.system_fingerprint and r.choices[0].message.content
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    assert client.models.retrieve("smollm2-135m-f32").id == "smollm2-135m-f32"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    raw = served.post("/v1/chat/completions", {**GOOD, "stream": True})
    first = json.loads(raw.text.split("\n\n")[0][len("data: "):])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
    # No CORS unless asked: a preflight from a web page gets no allow-origin.
    pre = httpx.options(served.url + "/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in pre.headers


def test_bad_completion_requests_and_the_server_lives_on(served, client):
    for body, param in (({"max_tokens": 3}, "prompt"), ({"prompt": {"a": 1}}, "prompt"),
                        ({"prompt": "hi", "echo": "x"}, "echo"), ({"prompt": "hi", "suffix": "!"}, "suffix"),
                        ({"prompt": [1, 10**9]}, "prompt")):
        r = served.post("/v1/completions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert served.post("/v1/chat/completions", GOOD).status_code == 200
    assert httpx.delete(served.url + "/v1/models", headers=served.headers).status_code == 405
    assert client.completions.create(model="x", prompt="Hello", max_tokens=3).choices[0].text is not None


def test_a_client_that_disconnects_mid_stream(served, client):
    body = {"messages": chat("Write a very long story about the sea."), "max_tokens": 400, "stream": True,
            "temperature": 0}
    with httpx.Client(timeout=60) as h:
        with h.stream("POST", served.url + "/v1/chat/completions", headers=served.headers, json=body) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert got[0].startswith("data: ")
    # It stopped within a round, long before its 400 tokens, and the next request is right.
    deadline = time.time() + 30
    while time.time() < deadline and " 499 " not in served.text():
        time.sleep(0.2)
    line = next(x for x in served.text().splitlines() if " 499 " in x)
    assert int(line.split("after ")[1].split()[0]) < 100, line  # chunks sent before it stopped
    expect = client.chat.completions.create(model="x", messages=chat(PROMPTS[1]), max_tokens=20, temperature=0)
    again = client.chat.completions.create(model="x", messages=chat(PROMPTS[1]), max_tokens=20, temperature=0)
    assert again.choices[0].message.content == expect.choices[0].message.content


def test_sixteen_concurrent_streams_all_complete(served):
    results, errors = {}, []

    def one(i):
        try:
            c = openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
            chunks = list(c.chat.completions.create(model="x", messages=chat(f"Say a word about number {i}."),
                                                    max_tokens=12, temperature=0, stream=True))
            results[i] = chunks
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert sorted(results) == list(range(16)) and time.time() - t0 < 300
    for chunks in results.values():
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_concurrent_requests_each_get_what_they_get_alone(served, client):
    # Greedy here; seeded requests through the slots: tests/test_exactness.py.
    settings = dict(temperature=0)
    assert "with 4 slots" in served.text()  # --parallel auto, said at start
    prompts = PROMPTS + ["List three colours.", "Name a large animal."]

    def ask(p):
        r = client.chat.completions.create(model="x", messages=chat(p), max_tokens=40, **settings)
        return r.choices[0].message.content

    alone = [ask(p) for p in prompts]
    got = [None] * len(prompts)
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, ask(prompts[i]))) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert got == alone


def freed(s, within=15.0):
    """Whether every slot of ``s`` is free again within ``within`` seconds
    (a disconnected stream frees its slot within a round; under a loaded
    machine a round and noticing the disconnect took over a second)."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        if httpx.get(s.url + "/health", timeout=10).json()["busy"] == 0:
            return True
        time.sleep(0.1)
    return False


def test_a_full_queue_answers_503_with_retry_after(session_state):
    s = Served("--queue", "0", "--parallel", "1", key=None)
    try:
        body = {"messages": chat("Write a long story."), "max_tokens": 200, "stream": True}
        with httpx.Client(timeout=60) as h:
            with h.stream("POST", s.url + "/v1/chat/completions", json=body) as r:
                lines = r.iter_lines()  # kept: a dropped iterator closes the response
                next(lines)  # the first is running
                busy = httpx.post(s.url + "/v1/chat/completions", json=GOOD, timeout=60)
        assert busy.status_code == 503 and busy.headers["Retry-After"]
        assert busy.json()["error"]["code"] == "overloaded"
        assert freed(s), s.text()
        assert httpx.post(s.url + "/v1/chat/completions", json=GOOD, timeout=60).status_code == 200
    finally:
        s.stop()


def test_slots_run_at_once_and_the_queue_counts_beyond_them(session_state):
    s = Served("--queue", "0", "--parallel", "2", key=None)
    try:
        body = {"messages": chat("Write a very long story about the sea."), "max_tokens": 400, "stream": True,
                "temperature": 1.0, "seed": 3}
        with httpx.Client(timeout=60) as h, httpx.Client(timeout=60) as h2:
            with h.stream("POST", s.url + "/v1/chat/completions", json=body) as a, \
                    h2.stream("POST", s.url + "/v1/chat/completions", json=body) as b:
                # Both slots are generating. The line iterators are kept: one dropped
                # closes its response, and the server rightly frees that slot.
                lines = a.iter_lines(), b.iter_lines()
                assert all(next(it).startswith("data: ") for it in lines)
                health = httpx.get(s.url + "/health", timeout=10).json()
                busy = httpx.post(s.url + "/v1/chat/completions", json=GOOD, timeout=60)
        assert health["busy"] == 2, (health, s.text())
        assert busy.status_code == 503, s.text()
        assert freed(s), s.text()
        assert httpx.post(s.url + "/v1/chat/completions", json=GOOD, timeout=60).status_code == 200
    finally:
        s.stop()
    r = subprocess.run([sys.executable, "-m", "specgguf", "serve", "--parallel", "0"], capture_output=True, text=True)
    assert r.returncode == 2 and "--parallel" in r.stderr
    r = subprocess.run([sys.executable, "-m", "specgguf", "serve", "--cache-ram", "-1"], capture_output=True, text=True)
    assert r.returncode == 2 and "--cache-ram" in r.stderr


def test_binds_to_loopback_by_default():
    from specgguf.cli.options import Parser  # noqa: F401 - the server's parser is built from it
    r = subprocess.run([sys.executable, "-m", "specgguf", "serve", "--help"], capture_output=True, text=True)
    assert "--host" in r.stdout and "127.0.0.1" in r.stdout


def test_the_example_client_runs_as_written(served):
    import pathlib
    example = pathlib.Path(__file__).parents[1] / "examples" / "openai_client.py"
    r = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, SPECGGUF_URL=served.url + "/v1", SPECGGUF_API_KEY=KEY))
    assert r.returncode == 0, r.stderr
    assert "drafted" in r.stdout and len(r.stdout.splitlines()) >= 3


def test_cors_when_asked_and_several_hosts(session_state):
    """--cors-origins lets that origin's preflight through without the key
    (the browser sends none), while the request itself still needs it;
    --host takes several addresses."""
    s = Served("--cors-origins", "http://app.example", "--host", "127.0.0.1,::1")
    try:
        pre = httpx.options(s.url + "/v1/chat/completions", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://app.example"
        other = httpx.options(s.url + "/v1/chat/completions", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
        assert other.headers.get("access-control-allow-origin") != "http://evil.example"
        r = httpx.post(s.url + "/v1/chat/completions", json=GOOD, headers={"Origin": "http://app.example"})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "http://app.example"
        v6 = httpx.get(f"http://[::1]:{s.port}/health")
        assert v6.status_code == 200
        assert f"http://127.0.0.1:{s.port}/v1, http://[::1]:{s.port}/v1" in s.text()
    finally:
        s.stop()


@pytest.mark.parametrize("host, why", [("127.0.0.1", "in use"), ("no-such-host.invalid", "does not resolve"),
                                       ("10.255.255.1", "")])
def test_a_busy_port_or_bad_host_is_one_line_before_serving(host, why):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        t0 = time.time()
        r = subprocess.run([sys.executable, "-m", "specgguf", "serve", "--host", host, "--port", str(port)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and time.time() - t0 < 30  # before any model loads
    lines = [x for x in r.stderr.splitlines() if not x.startswith("specgguf: warning")]
    assert len(lines) == 1 and lines[0].startswith("specgguf: error: cannot listen on") and why in lines[0], r.stderr
    assert "serving" not in r.stderr


def _cpu_ticks(pid):
    """{thread id: CPU ticks so far} of every live thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = int(fields[11]) + int(fields[12])  # utime + stime
        except OSError:  # the thread ended meanwhile
            pass
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")
def test_one_slot_decodes_every_request_on_one_thread(session_state):
    """Each request's forwards run on the same long-lived thread (with its
    OpenMP worker): a thread per request would start an OpenMP team each,
    and libgomp then sleeps at barriers, costing up to half the speed."""
    s = Served("--parallel", "1", "-k", "2", key=None)
    try:
        def burners(*bodies):  # threads that did real work during these requests (live at the end)
            before = _cpu_ticks(s.proc.pid)
            with httpx.Client(timeout=120) as h:
                pending = [threading.Thread(target=h.post, args=(s.url + path,), kwargs={"json": b})
                           for path, b in bodies]
                for t in pending:
                    t.start()
                for t in pending:
                    t.join()
            after = _cpu_ticks(s.proc.pid)
            return {tid for tid, n in after.items() if tid != s.proc.pid and n - before.get(tid, 0) >= 10}

        chat_body = {"messages": chat(PROMPTS[1]), "max_tokens": 64, "temperature": 0}
        first = burners(("/v1/chat/completions", chat_body))
        assert first, s.text()
        assert burners(("/v1/chat/completions", dict(chat_body, stream=True))) == first
        assert burners(("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40, "n": 2})) == first
        assert burners(("/v1/chat/completions", chat_body), ("/v1/completions",  # one waits its turn
                        {"prompt": "The sea", "max_tokens": 40, "temperature": 0.8, "seed": 1})) == first
    finally:
        s.stop()


# -- tool calling ------------------------------------------------------------------
def _tools():
    from tests.test_tools import TOOLS
    return TOOLS


def test_tool_calls_through_the_openai_client_and_its_stream_helper(client):
    ask = chat("Turn off the light in the kitchen.")
    r = client.chat.completions.create(model="x", messages=ask, tools=_tools(), tool_choice="required",
                                       temperature=0, max_tokens=80)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.type == "function" and call.id
    assert call.function.name == "set_light" and json.loads(call.function.arguments)["room"] == "kitchen"
    plain = client.chat.completions.create(model="x", messages=ask, tools=_tools(), tool_choice="required",
                                           temperature=0, max_tokens=80, extra_body={"k": 0})
    assert plain.choices[0].message.tool_calls[0].function == call.function
    with client.chat.completions.stream(model="x", messages=ask, tools=_tools(), tool_choice="required",
                                        temperature=0, max_tokens=80) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert done and done[0].name == "set_light" and json.loads(done[0].arguments) == json.loads(call.function.arguments)
    assert final.choices[0].message.tool_calls[0].function.name == "set_light"


def test_a_call_its_result_and_the_answer(client):
    messages = chat("What is the weather in Paris? Answer in one sentence.")
    first = client.chat.completions.create(model="x", messages=messages, tools=_tools(), tool_choice="required",
                                           temperature=0, max_tokens=80)
    call = first.choices[0].message.tool_calls[0]
    messages = messages + [first.choices[0].message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id,
                            "content": json.dumps({"city": "Paris", "temp_c": 14, "sky": "light rain"})}]
    answer = client.chat.completions.create(model="x", messages=messages, tools=_tools(), temperature=0,
                                            max_tokens=60)
    msg = answer.choices[0].message
    assert (msg.content and msg.content.strip()) or msg.tool_calls, answer


def test_a_hermes_template_from_a_file(session_state):
    from tests.test_tools import HERMES
    path = os.path.join(os.environ["SPECGGUF_STATE"], "hermes.jinja")
    with open(path, "w") as f:
        f.write(HERMES)
    s = Served("--chat-template-file", path)
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        r = c.chat.completions.create(model="x", messages=chat("Turn off the light in the kitchen."), tools=_tools(),
                                      tool_choice="required", temperature=0, max_tokens=80)
        call = r.choices[0].message.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "set_light"
        # auto: the grammar starts where a call would (lazy); the answer is plain decoding's
        history = chat("Turn off the light in the kitchen.") + [r.choices[0].message.model_dump(exclude_none=True), {
            "role": "tool", "tool_call_id": call.id, "content": '{"ok": true}'}] + chat("And in the hall?")
        auto = [s.post("/v1/chat/completions", {"messages": history, "tools": _tools(), "temperature": 0,
                                                "max_tokens": 60, **extra}).json()["choices"][0]
                for extra in ({}, {"k": 0})]
        for a in auto:
            for c_ in a["message"].get("tool_calls") or []:
                c_.pop("id")
        assert auto[0] == auto[1]
        bad = s.post("/v1/chat/completions", {"messages": chat("hi"), "tools": [{"type": "function"}]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools"
        assert c.chat.completions.create(model="x", messages=chat("hi"), max_tokens=4).choices[0].message.content
    finally:
        s.stop()
    missing = subprocess.run([sys.executable, "-m", "specgguf", "serve", "--chat-template-file", path + ".none"],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "--chat-template-file" in missing.stderr and "Traceback" not in missing.stderr
