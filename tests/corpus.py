"""Prompts built from text every Python install carries, none written for
the tests: the exactness checks (tests/test_exactness.py on a subset,
bench/exactness.py on all of it) run them.

Three kinds, each a list of ``(kind, prompt)`` where a prompt is a string
(a raw completion) or a list of chat messages:

* ``code``: a standard-library function's signature and docstring, to be
  continued (code completion);
* ``prose``: the first sentences of a standard-library module's or class's
  documentation, to be continued;
* ``chat``: a question about a standard-library function, with its source
  in the message (a user pasting code), as a chat.

Which items are taken is fixed by a seed; the order of the modules is
sorted, so the same Python gives the same corpus.
"""

from __future__ import annotations

import inspect
import random
import textwrap
from typing import List, Tuple, Union

Prompt = Union[str, List[dict]]

MODULES = ["argparse", "base64", "bisect", "calendar", "csv", "difflib", "email.utils", "fractions", "ftplib",
           "functools", "gettext", "glob", "heapq", "html", "inspect", "ipaddress", "json.decoder",
           "json.encoder", "locale", "logging", "mimetypes", "ntpath", "pathlib", "pickle", "pprint",
           "posixpath", "quopri", "random", "shlex", "shutil", "smtplib", "statistics", "string", "tarfile",
           "tempfile", "textwrap", "threading", "tokenize", "traceback", "urllib.parse", "uuid", "zipfile"]

QUESTIONS = ["What does this function do? Explain it briefly.\n\n",
             "Add type hints to this function and show the result.\n\n",
             "Is there a bug in this function? Answer in two sentences.\n\n",
             "Write a docstring for this function.\n\n"]


def _functions() -> list:
    """Every documented, plain-Python function and method of MODULES, sorted by name."""
    import importlib
    out = []
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:  # a trimmed Python: fewer items, the same rule
            continue
        items = [(n, f) for n, f in vars(mod).items() if inspect.isfunction(f) and f.__module__ == mod.__name__]
        for cname, cls in vars(mod).items():
            if inspect.isclass(cls) and cls.__module__ == mod.__name__:
                items += [(f"{cname}.{n}", f) for n, f in vars(cls).items() if inspect.isfunction(f)]
        for qual, f in sorted(items, key=lambda x: x[0]):
            try:
                src = inspect.getsource(f)
            except (OSError, TypeError):
                continue
            if f.__doc__ and 200 <= len(src) <= 2500:
                out.append((f"{name}.{qual}", textwrap.dedent(src), f))
    return out


def _head(src: str) -> str:
    """A function's text up to the end of its docstring."""
    close = src.find('"""', src.find('"""') + 3)
    if close < 0:
        close = src.find("'''", src.find("'''") + 3)
    return src[:close + 3] + "\n" if close > 0 else src.split("\n", 1)[0] + "\n"


def _sentences(doc: str, n: int = 2) -> str:
    text = " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split())
    parts = text.split(". ")
    return ". ".join(parts[:n]).rstrip(".") + ". " if len(parts) > 1 else text + " "


def corpus(per_kind: int = 100, seed: int = 0) -> List[Tuple[str, Prompt]]:
    """``per_kind`` prompts of each kind (fewer where the install has fewer)."""
    import importlib
    rng = random.Random(seed)
    funcs = _functions()
    code = [("code", _head(src)) for _, src, _ in rng.sample(funcs, min(per_kind, len(funcs)))]
    docs = []
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        objs = [mod] + [c for _, c in sorted(vars(mod).items()) if inspect.isclass(c) and c.__module__ == mod.__name__]
        docs += [_sentences(o.__doc__) for o in objs if o.__doc__ and len(o.__doc__) > 80]
    prose = [("prose", d) for d in rng.sample(docs, min(per_kind, len(docs)))]
    short = [src for _, src, _ in funcs if len(src) < 1200]  # a chat prompt and its answer fit a 2048 context
    chats = [("chat", [{"role": "user", "content": rng.choice(QUESTIONS) + src}])
             for src in rng.sample(short, min(per_kind, len(short)))]
    return code + prose + chats


def subset(n_per_kind: int, seed: int = 0) -> List[Tuple[str, Prompt]]:
    """The first ``n_per_kind`` of each kind of :func:`corpus` (the same items as the full run)."""
    items = corpus(seed=seed)
    return [x for kind in ("code", "prose", "chat") for x in [y for y in items if y[0] == kind][:n_per_kind]]


if __name__ == "__main__":
    items = corpus()
    for kind in ("code", "prose", "chat"):
        print(kind, sum(k == kind for k, _ in items))
    print(items[0][1][:300])
    print(items[len(items) // 2][1][:300])
