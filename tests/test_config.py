"""GenerationConfig: one validation, clear errors naming the argument."""

import math

import pytest

from specgguf import GenerationConfig

BAD = [
    (dict(max_tokens=-1), ValueError, "max_tokens must be >= 0"),
    (dict(max_tokens=2.5), TypeError, "max_tokens must be an int"),
    (dict(max_tokens=True), TypeError, "max_tokens must be an int"),
    (dict(temperature=-0.1), ValueError, "temperature must be a finite number >= 0"),
    (dict(temperature=math.nan), ValueError, "temperature"),
    (dict(temperature=math.inf), ValueError, "temperature"),
    (dict(temperature="hot"), TypeError, "temperature must be a number"),
    (dict(top_k=-1), ValueError, "top_k must be >= 0"),
    (dict(top_p=1.5), ValueError, r"top_p must be a finite number in \[0.0, 1.0\]"),
    (dict(min_p=-0.5), ValueError, "min_p"),
    (dict(k=-1), ValueError, r"k must be in \[0, 32\]"),
    (dict(k=33), ValueError, r"k must be in \[0, 32\]"),
    (dict(k="many"), ValueError, r"k must be an int in \[0, 32\] or 'auto'"),
    (dict(p_min=2.0), ValueError, "p_min"),
    (dict(p_min="sometimes"), ValueError, "p_min must be None, 'auto'"),
    (dict(k=4, p_min="auto"), ValueError, "use it with k='auto'"),
    (dict(seed=-1), ValueError, r"seed must be in \[0, 18446744073709551615\]"),
    (dict(seed=2**64), ValueError, "seed must be in"),
    (dict(seed="1"), TypeError, "seed must be an int"),
    (dict(stop=5), TypeError, "stop must be a string or a list of strings"),
    (dict(stop=["a", 3]), TypeError, "stop must be a string or a list"),
    (dict(drafter_invariant="yes"), TypeError, "drafter_invariant must be True, False or None"),
    (dict(grammar_trigger="<tool_call>"), ValueError, "grammar_trigger starts a grammar: set grammar too"),
    (dict(grammar='root ::= "a"', grammar_trigger=""), ValueError, "grammar_trigger must be a non-empty string"),
    (dict(grammar='root ::= "a"', grammar_trigger=5), ValueError, "grammar_trigger must be a non-empty string"),
]


@pytest.mark.parametrize("kwargs,exc,msg", BAD)
def test_bad_settings_raise_naming_the_argument(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        GenerationConfig(**kwargs)


def test_normalises_and_is_frozen():
    c = GenerationConfig(stop="\n", temperature=1, seed=3)
    assert c.stop == ("\n",) and isinstance(c.temperature, float)
    assert GenerationConfig(stop=["", "x"]).stop == ("x",)
    with pytest.raises(Exception):
        c.temperature = 0.5
    assert hash(c) == hash(GenerationConfig(stop=("\n",), temperature=1.0, seed=3))


def test_from_kwargs_replaces_and_refuses_unknown_names():
    base = GenerationConfig(temperature=0.7, max_tokens=10)
    assert GenerationConfig.from_kwargs(base, max_tokens=5) == GenerationConfig(temperature=0.7, max_tokens=5)
    with pytest.raises(TypeError, match="unknown generation setting.*temprature"):
        GenerationConfig.from_kwargs(base, temprature=0.5)
    with pytest.raises(TypeError, match="config must be a GenerationConfig"):
        GenerationConfig.from_kwargs({"temperature": 1})


def test_one_greedy_flag_and_the_verification_rule():
    assert GenerationConfig().greedy and GenerationConfig().verification == "greedy"
    assert GenerationConfig(temperature=0.8).verification == "exact"
    assert GenerationConfig(temperature=0.8, seed=1).verification == "invariant"  # the default for seeds
    assert GenerationConfig(temperature=0.8, seed=1, drafter_invariant=False).verification == "exact"
    assert GenerationConfig(temperature=0.8, drafter_invariant=True).verification == "invariant"
    assert GenerationConfig(seed=1, drafter_invariant=True).verification == "greedy"


def test_regimes_keep_greedy_and_each_sampling_setting_apart():
    regimes = {GenerationConfig().regime, GenerationConfig(temperature=0.8).regime,
               GenerationConfig(temperature=1.2).regime, GenerationConfig(temperature=0.8, top_k=5).regime,
               GenerationConfig(temperature=0.8, seed=2).regime}
    assert len(regimes) == 5
    assert GenerationConfig(seed=4).regime == GenerationConfig().regime == "greedy"
