"""Tool calling (specgguf.api.tools): the request fields and their errors,
each format's calls read back, and through the real default pair in
process: the tool grammar holds every call to a declared name and valid
arguments, and speculation under it is exact (greedy equal to k=0; seeded
sampling with drafter_invariant equal across K). The server's side is in
test_server.py."""

import json
import re
from pathlib import Path

import pytest

from specgguf.api.request_fields import FieldError
from specgguf.api.tools import ToolCalling, parse_calls, template_messages, tool_format, tools_of

HERMES = (Path(__file__).parents[1] / "examples" / "templates" / "hermes-tools.jinja").read_text()

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
LIGHT = {"type": "function", "function": {
    "name": "set_light", "description": "Switch a light on or off",
    "parameters": {"type": "object", "properties": {"room": {"type": "string"}, "on": {"type": "boolean"},
                                                    "level": {"type": "integer", "minimum": 0, "maximum": 100}},
                   "required": ["room", "on"]}}}
TOOLS = [WEATHER, LIGHT]
ASKS = ["What is the weather in Paris?", "Turn off the light in the kitchen.", "Is it raining in Oslo today?",
        "Dim the bedroom lamp to 30 percent.", "Tell me a joke about cats.", "How warm is it in Lisbon, in fahrenheit?"]


def user(text):
    return [{"role": "user", "content": text}]


# -- request fields -----------------------------------------------------------------
def test_the_templates_formats():
    assert tool_format(None) == "generic"
    assert tool_format("{% for m in messages %}{{ m.content }}{% endfor %}") == "generic"
    assert tool_format(HERMES) == "hermes"
    assert tool_format("{% if tools %}[AVAILABLE_TOOLS]{{ tools }}{% endif %}[TOOL_CALLS]") == "mistral"
    assert tool_format("{% if tools %}Environment: ipython{% endif %}<|python_tag|>") == "llama3"


@pytest.mark.parametrize("args,field", [
    ({"tools": "get_weather"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "foo"}}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "launch"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": TOOLS, "functions": [WEATHER["function"]]}, "functions"),
    ({"functions": [WEATHER["function"]], "function_call": {"name": "set_light"}}, "function_call"),
])
def test_a_bad_tools_request_names_its_field(args, field):
    with pytest.raises(FieldError) as e:
        tools_of(args, chat=True)
    assert e.value.field == field and str(e.value)


def test_what_a_request_asks_for():
    assert tools_of({}, chat=True) is None
    assert tools_of({"tools": TOOLS, "tool_choice": "none"}, chat=True) is None
    t = tools_of({"tools": TOOLS}, chat=True)
    assert t.choice == "auto" and not t.parallel and [x.name for x in t.callable] == ["get_weather", "set_light"]
    t = tools_of({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "set_light"}},
                  "parallel_tool_calls": True}, chat=True)
    assert t.choice == "set_light" and t.parallel and [x.name for x in t.callable] == ["set_light"]
    t = tools_of({"functions": [LIGHT["function"]], "function_call": "auto"}, chat=True)
    assert t.legacy and t.choice == "auto"
    with pytest.raises(FieldError) as e:  # completions take no tools
        tools_of({"tools": TOOLS}, chat=False)
    assert e.value.field == "tools"
    assert tools_of({"tool_choice": "none"}, chat=False) is None


def test_each_format_reads_its_calls_back():
    call = ("get_weather", {"city": "Paris", "unit": "celsius"}, None)
    assert parse_calls('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}',
                       "generic") == (None, [call])
    assert parse_calls('{"response": "Hello"}', "generic") == ("Hello", [])
    assert parse_calls('{"response": "cut by max_tok', "generic") == ("cut by max_tok", [])
    assert parse_calls("not json", "generic") is None
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
    assert parse_calls(text, "hermes") == ("Let me look.", [call])
    assert parse_calls("<tool_call>\n{broken\n</tool_call>", "hermes") is None
    assert parse_calls('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
                       "mistral") == (None, [call])
    assert parse_calls('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
                       "llama3") == (None, [call])
    assert parse_calls('Checking. {"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
                       "llama3") == ("Checking.", [call])  # auto: text, then the call from its trigger
    t = ToolCalling.read({"tools": TOOLS})
    content, calls = t.parse('{"tool_call": {"name": "launch", "arguments": {}}}', "generic")
    assert calls == [] and "launch" in content  # an undeclared function stays text
    _, calls = t.parse('{"tool_call": {"name": "set_light", "arguments": {"room": "hall", "on": true}}}', "generic")
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["function"]["arguments"]) == {"room": "hall", "on": True}


def test_earlier_calls_and_results_as_the_template_sees_them():
    history = user("Weather in Paris?") + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": '{"temp": 14}'}]
    t = ToolCalling.read({"tools": TOOLS})
    generic = template_messages(history, "generic", t)
    assert generic[0]["role"] == "system" and "get_weather" in generic[0]["content"]
    assert json.loads(generic[2]["content"]) == {"tool_call": {"name": "get_weather",
                                                               "arguments": {"city": "Paris", "unit": "celsius"}}}
    assert generic[3]["role"] == "user" and json.loads(generic[3]["content"])["tool_response"]["content"] == '{"temp": 14}'
    native = template_messages(history, "hermes", t)
    assert native[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "unit": "celsius"}


def test_every_grammar_compiles_in_llama_cpp(target):
    """Each format's grammar compiles; a native format under ``auto`` starts
    it at the call's first characters (a trigger the grammar's root begins with)."""
    from specgguf.llama.grammar import Grammar, LazyStart, pieces
    vocab, n = target._model.vocab, target.n_vocab()
    every = pieces(vocab, range(n))
    for args in ({"tools": TOOLS}, {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": True},
                 {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "set_light"}}}):
        t = ToolCalling.read(args)
        for fmt in ("generic", "hermes", "mistral", "llama3"):
            trigger = t.trigger(fmt)
            assert (trigger is not None) == (fmt != "generic" and t.choice == "auto")
            g = Grammar(vocab, n, t.grammar(fmt), lazy=LazyStart(every, trigger) if trigger else None)
            if trigger:  # the trigger itself is the grammar's start
                assert g.started and len(g.forbidden) == len(trigger.encode())
            g.close()


# -- through the default pair ------------------------------------------------------
@pytest.fixture(scope="module")
def pair(target, draft):
    from specgguf import SpeculativeLlama
    return SpeculativeLlama(target, draft)


@pytest.fixture(scope="module")
def hermes_pair(target, draft):
    from specgguf import SpeculativeLlama
    return SpeculativeLlama(target, draft, chat_template=HERMES)


def _calls(response):
    return response["choices"][0]["message"].get("tool_calls") or []


def _without_ids(message):
    return {**message, "tool_calls": [c["function"] for c in message.get("tool_calls") or []]}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "set_light"}}])
def test_a_required_call_is_valid_and_exact_under_speculation(pair, choice):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    finished = 0
    for ask in ASKS:
        base = pair.create_chat_completion(user(ask), tools=TOOLS, tool_choice=choice, temperature=0,
                                           max_tokens=80, k=0)
        calls, choice0 = _calls(base), base["choices"][0]
        if choice0["finish_reason"] == "length":  # a 135M model may loop inside a string: still held
            assert choice0["message"]["content"].startswith('{"tool_call": {"name": "'), choice0
        else:
            finished += 1
            assert choice0["finish_reason"] == "tool_calls" and len(calls) == 1, base
            name, args = calls[0]["function"]["name"], json.loads(calls[0]["function"]["arguments"])
            assert name in schemas and (choice == "required" or name == "set_light")
            assert set(schemas[name]["required"]) <= set(args) <= set(schemas[name]["properties"])
        for k in (1, 4, "auto"):
            spec = pair.create_chat_completion(user(ask), tools=TOOLS, tool_choice=choice, temperature=0,
                                               max_tokens=80, k=k)
            assert [c["function"] for c in _calls(spec)] == [c["function"] for c in calls], (ask, k)
            assert spec["choices"][0]["message"]["content"] == choice0["message"]["content"], (ask, k)
    assert finished >= 4


def test_auto_may_answer_in_words_and_the_text_is_plain_decodings(pair):
    for ask in ASKS[3:]:
        outs = [pair.create_chat_completion(user(ask), tools=TOOLS, temperature=0, max_tokens=48, k=k)
                for k in (0, "auto")]
        msgs = [_without_ids(o["choices"][0]["message"]) for o in outs]
        assert msgs[0] == msgs[1], ask
        assert msgs[0]["content"] is None or not msgs[0]["content"].startswith('{"response"')


def test_seeded_tool_calls_are_the_same_law_across_drafts(pair):
    """T=0.8 with drafter_invariant: the same seed gives the same call at every K."""
    for seed in range(4):
        calls = {json.dumps(_calls(pair.create_chat_completion(
            user(ASKS[seed]), tools=TOOLS, tool_choice="required", temperature=0.8, seed=seed, max_tokens=80,
            k=k, drafter_invariant=True))[0]["function"]) for k in (0, 3, "auto")}
        assert len(calls) == 1, (seed, calls)


def test_parallel_calls_and_the_legacy_functions(pair):
    """The 135M model lists calls without end (the schema sets no maxItems, as
    llama.cpp's has none): the list is held to the grammar and exact."""
    runs = [pair.create_chat_completion(user("What is the weather in Paris and in Rome?"), tools=TOOLS,
                                        tool_choice="required", parallel_tool_calls=True, temperature=0,
                                        max_tokens=60, k=k)["choices"][0] for k in (0, "auto")]
    assert runs[0]["message"] == runs[1]["message"]
    assert runs[0]["message"]["content"].replace(" ", "").startswith('{"tool_calls":[{"name":"get_weather"')
    r = pair.create_chat_completion(user("Weather in Rome?"), functions=[WEATHER["function"]],
                                    function_call={"name": "get_weather"}, temperature=0, max_tokens=60)
    msg = r["choices"][0]
    assert msg["finish_reason"] == "function_call" and msg["message"]["function_call"]["name"] == "get_weather"
    assert json.loads(msg["message"]["function_call"]["arguments"])["city"]


def test_a_stream_brings_the_call_in_one_delta(pair):
    chunks = list(pair.create_chat_completion(user(ASKS[0]), tools=TOOLS, tool_choice="required", temperature=0,
                                              max_tokens=80, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert len(calls) == 1 and calls[0][0]["index"] == 0 and calls[0][0]["function"]["name"] == "get_weather"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    whole = pair.create_chat_completion(user(ASKS[0]), tools=TOOLS, tool_choice="required", temperature=0,
                                        max_tokens=80)
    assert whole["choices"][0]["message"]["tool_calls"][0]["function"] == calls[0][0]["function"]


def test_a_whole_loop_call_result_answer(pair):
    messages = user("What is the weather in Paris? Answer in one sentence.")
    first = pair.create_chat_completion(messages, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=80)
    msg = first["choices"][0]["message"]
    messages = messages + [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"],
                                 "content": json.dumps({"city": "Paris", "temp_c": 14, "sky": "light rain"})}]
    answer = pair.create_chat_completion(messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=60)
    text = answer["choices"][0]["message"]["content"]
    assert answer["choices"][0]["finish_reason"] in ("stop", "length") and text.strip()
    plain = pair.create_chat_completion(messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=60, k=0)
    assert plain["choices"][0]["message"]["content"] == text


def test_a_hermes_template_from_a_file(hermes_pair):
    assert hermes_pair.tool_format == "hermes"
    ids = hermes_pair.tokenize(user("Weather?"), chat=True, tools=TOOLS)
    text = hermes_pair.pair.target_llm.detokenize(ids).decode()
    assert "<tools>" in text and '"get_weather"' in text
    for ask in ASKS[:3]:
        runs = [hermes_pair.create_chat_completion(user(ask), tools=TOOLS, tool_choice="required", temperature=0,
                                                   max_tokens=80, k=k) for k in (0, "auto")]
        calls = [_calls(r) for r in runs]
        assert len(calls[0]) == 1 and calls[0][0]["function"] == calls[1][0]["function"], ask
        assert runs[0]["choices"][0]["finish_reason"] == "tool_calls"


def _weather_call(city, cid):
    return {"role": "assistant", "content": "", "tool_calls": [{"id": cid, "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": city, "unit": "celsius"})}}]}


def _weather_turns(city, cid, temp):
    return user(f"What is the weather in {city}?") + [
        _weather_call(city, cid), {"role": "tool", "tool_call_id": cid, "name": "get_weather",
                                   "content": json.dumps({"temp": temp})},
        {"role": "assistant", "content": f"It is {temp} degrees in {city}."}]


def test_auto_in_a_native_format_starts_the_grammar_at_the_call(hermes_pair):
    """The Hermes format under ``auto``: the text is free until the model
    writes ``<tool_call>``; from there the tools' grammar holds (the lazy
    grammar). After two earlier calls the 135M model writes a call of its
    own, its arguments as a JSON string, which the grammar forbids: held,
    the call's arguments are an object the schema allows. Greedy output
    under the lazy grammar equals k=0's at K=3 and auto."""
    history = _weather_turns("Paris", "c1", 14) + _weather_turns("Berlin", "c2", 9)
    calling = ToolCalling.read({"tools": TOOLS})
    held = dict(grammar=calling.grammar("hermes"), grammar_trigger=calling.trigger("hermes"))
    assert held["grammar_trigger"] == "<tool_call>"
    schema = WEATHER["function"]["parameters"]
    for city in ("Rome", "Madrid"):
        ids = hermes_pair.tokenize(history + user(f"And in {city}?"), chat=True)
        free = hermes_pair.generate(ids, max_tokens=60, temperature=0, k=0).text
        assert free.startswith("<tool_call>") and '"arguments": "{' in free, free  # a string, not an object
        runs = [hermes_pair.generate(ids, max_tokens=60, temperature=0, k=k, **held) for k in (0, 3, "auto")]
        assert runs[1].tokens == runs[0].tokens and runs[2].tokens == runs[0].tokens, city
        content, calls = calling.parse(runs[0].text, "hermes")
        assert content is None and len(calls) == 1 and runs[0].finish_reason == "stop", runs[0].text
        assert re.search(r'"arguments"\s*:\s*\{', runs[0].text), runs[0].text  # held: an object
        args = json.loads(calls[0]["function"]["arguments"])
        assert calls[0]["function"]["name"] == "get_weather" and set(schema["required"]) <= set(args)


def test_auto_in_a_native_format_is_plain_decodings_text(hermes_pair):
    """Through create_chat_completion, the Hermes template and ``auto``
    (the lazy grammar on): the answer, in words or a call, is k=0's."""
    history = _weather_turns("Paris", "c1", 14)
    for ask in ("And in Rome?", "Turn on the light in the hall."):
        runs = [hermes_pair.create_chat_completion(history + user(ask), tools=TOOLS, temperature=0, max_tokens=60,
                                                   k=k)["choices"][0] for k in (0, "auto")]
        assert _without_ids(runs[1]["message"]) == _without_ids(runs[0]["message"]), ask
        assert runs[1]["finish_reason"] == runs[0]["finish_reason"]


def test_a_tool_grammar_beside_another_grammar_is_refused(pair):
    with pytest.raises(ValueError, match="tools"):
        pair.create_chat_completion(user("hi"), tools=TOOLS, response_format={"type": "json_object"}, max_tokens=4)
    with pytest.raises(ValueError, match="chat completions"):
        pair.create_completion("hi", tools=TOOLS, max_tokens=4)
    r = pair.create_chat_completion(user("hi"), tools=TOOLS, tool_choice="none", max_tokens=4, temperature=0)
    assert "tool_calls" not in r["choices"][0]["message"]  # and the pair still works
