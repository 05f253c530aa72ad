"""OpenAI tool calling through the model's chat template.

A request's ``tools`` (or the legacy ``functions``), ``tool_choice`` (or
``function_call``) and ``parallel_tool_calls`` become a :class:`ToolCalling`;
the chat template decides the format the model writes its calls in
(:func:`tool_format`):

- ``"hermes"`` (Hermes, Qwen 2.5/3 and their kin: the template renders
  ``tools`` and calls as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``),
  ``"mistral"`` (``[TOOL_CALLS][{...}]``), ``"llama3"`` (a bare
  ``{"name": ..., "parameters": ...}``): the template renders the tools and
  the earlier calls itself, as llama-server's ``--jinja`` lets it;
- ``"generic"``, for a template that knows nothing of tools (the default
  SmolLM2 pair): as llama-server's generic handler, the tools are described
  in a system message and the whole answer is one JSON object, either
  ``{"tool_call": {"name", "arguments"}}`` (``{"tool_calls": [...]}`` with
  parallel calls) or ``{"response": "..."}``.

The grammar (:meth:`ToolCalling.grammar`, JSON schemas converted as
llama.cpp converts them) holds a call to a declared name and to arguments
its schema allows; it is an ordinary grammar to the engine, applied to
every verified row, so speculation stays exact under it. Generic: always
(``auto`` allows the response object too). Native formats: with
``required`` or a named function from the first token; with ``auto`` from
the call's start (:meth:`ToolCalling.trigger`: the text is free until the
format's ``<tool_call>``, ``[TOOL_CALLS]`` or ``{"name"`` appears, see
:class:`~specgguf.llama.grammar.LazyStart`), as llama-server's lazy grammar.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..config import schema_grammar
from .request_fields import TOOL_FIELDS, FieldError, Unsupported

FORMATS = ("hermes", "mistral", "llama3", "generic")
TRIGGERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama3": '{"name"'}  # where a native call starts
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
GENERIC_SYSTEM = ("You can call any of the following tools to satisfy the user's requests: {tools}\n\n"
                  "Respond in JSON format, either with `tool_call` (a request to call tools) or with "
                  "`response` reply to the user's request")


def tool_format(template: Optional[str]) -> str:
    """The format a chat template writes tool calls in (one of :data:`FORMATS`),
    read from its text as llama.cpp's template checks do."""
    t = template or ""
    if "tools" not in t:
        return "generic"
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or "ipython" in t:
        return "llama3"
    return "generic"


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict   # a JSON schema of the arguments object


def _tool(value: Any, where: str) -> Tool:
    if not isinstance(value, Mapping) or not isinstance(value.get("name"), str) or not NAME.match(value["name"]):
        raise ValueError(f"{where} needs a name of letters, digits, '_', '-' or '.' (at most 64)")
    params = value.get("parameters")
    params = {"type": "object", "properties": {}} if params is None else params
    if not isinstance(params, Mapping):
        raise ValueError(f"{where}.parameters must be a JSON schema object")
    try:
        schema_grammar(dict(params))
    except ValueError as e:
        raise ValueError(f"{where}.parameters: {e}") from None
    desc = value.get("description") or ""
    if not isinstance(desc, str):
        raise ValueError(f"{where}.description must be a string")
    return Tool(value["name"], desc, dict(params))


def _tools(args: Mapping[str, Any]) -> Tuple[List[Tool], bool]:
    """The declared functions and whether they came as the legacy ``functions``."""
    tools, functions = args.get("tools"), args.get("functions")
    if tools and functions:
        raise FieldError("functions", "functions: give tools or the legacy functions, not both")
    legacy = bool(functions)
    field, given = ("functions", functions) if legacy else ("tools", tools)
    if given is None:
        return [], False
    if not isinstance(given, list):
        raise FieldError(field, f"{field} must be a list")
    out = []
    for i, t in enumerate(given):
        try:
            if legacy:
                out.append(_tool(t, f"functions[{i}]"))
            elif not isinstance(t, Mapping) or t.get("type") != "function":
                raise ValueError(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}')
            else:
                out.append(_tool(t.get("function"), f"tools[{i}].function"))
        except ValueError as e:
            raise FieldError(field, str(e)) from None
    names = [t.name for t in out]
    if len(set(names)) < len(names):
        raise FieldError(field, f"{field}: two functions are named {sorted(n for n in names if names.count(n) > 1)[0]!r}")
    return out, legacy


def _choice(args: Mapping[str, Any], tools: Sequence[Tool], legacy: bool) -> str:
    """"none", "auto", "required", or the name of the function to call."""
    field = "function_call" if legacy or args.get("function_call") is not None else "tool_choice"
    value = args.get(field)
    if value is None:
        return "auto" if tools else "none"
    if isinstance(value, Mapping):  # {"type": "function", "function": {"name": ...}} or legacy {"name": ...}
        name = value.get("name") if field == "function_call" else (value.get("function") or {}).get("name")
        if not isinstance(name, str):
            raise FieldError(field, f'{field} names a function as {{"type": "function", "function": {{"name": ...}}}}'
                             if field == "tool_choice" else 'function_call names a function as {"name": ...}')
        if name not in {t.name for t in tools}:
            raise FieldError(field, f"{field}: no function named {name!r} among the tools")
        return name
    if value not in ("none", "auto", "required"):
        raise FieldError(field, f'{field} must be "none", "auto", "required" or a function, got {value!r}')
    if value == "required" and not tools:
        raise FieldError(field, f'{field}="required" needs tools')
    return value


class ToolCalling:
    """The tools a chat request declares and how it asks for them.

    ``tools``: the functions; ``choice``: ``"auto"``, ``"required"`` or one
    function's name (a request with no tools or ``"none"`` gives no
    ToolCalling: :meth:`read` returns None); ``parallel``: several calls in
    one answer (``parallel_tool_calls=True``; off by default, as
    llama-server has it: small models call one tool at a time more
    reliably); ``legacy``: asked with ``functions`` (answered with
    ``function_call``)."""

    def __init__(self, tools: List[Tool], choice: str, parallel: bool = False, legacy: bool = False) -> None:
        self.tools, self.choice, self.parallel, self.legacy = tools, choice, parallel and not legacy, legacy

    @classmethod
    def read(cls, args: Mapping[str, Any]) -> Optional["ToolCalling"]:
        """The request's tool fields, checked (:class:`FieldError` naming the
        field), or None when it calls no tool."""
        tools, legacy = _tools(args)
        choice = _choice(args, tools, legacy)
        parallel = args.get("parallel_tool_calls")
        if parallel not in (None, True, False):
            raise FieldError("parallel_tool_calls", "parallel_tool_calls must be true or false")
        if not tools or choice == "none":
            return None
        return cls(tools, choice, bool(parallel), legacy)

    @property
    def callable(self) -> List[Tool]:
        return [t for t in self.tools if self.choice in ("auto", "required", t.name)]

    def template_tools(self) -> List[dict]:
        """The tools as OpenAI declares them, for a template that renders them."""
        return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.parameters}} for t in self.tools]

    # -- the grammar ---------------------------------------------------------------
    def _call_schema(self, args_key: str) -> dict:
        each = [{"type": "object", "properties": {"name": {"const": t.name}, args_key: t.parameters},
                 "required": ["name", args_key]} for t in self.callable]
        return each[0] if len(each) == 1 else {"anyOf": each}

    def grammar(self, fmt: str) -> str:
        """GBNF for the answer in ``fmt``; in a native format it matches the
        calls from their start (under ``auto`` applied from
        :meth:`trigger` on)."""
        if fmt == "generic":
            call = self._call_schema("arguments")
            calls = ({"type": "object", "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
                      "required": ["tool_calls"]} if self.parallel else
                     {"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"]})
            if self.choice == "auto":
                calls = {"anyOf": [calls, {"type": "object", "properties": {"response": {"type": "string"}},
                                           "required": ["response"]}]}
            return schema_grammar(calls)
        body = schema_grammar(self._call_schema("parameters" if fmt == "llama3" else "arguments"))
        body = re.sub(r"^root ::=", "call-object ::=", body, flags=re.M)
        if fmt == "hermes":
            one = '"<tool_call>\\n" call-object "\\n</tool_call>"'
            root = one + (f' ("\\n" {one})*' if self.parallel else "")
        elif fmt == "mistral":
            root = '"[TOOL_CALLS][" call-object' + (' ("," space call-object)*' if self.parallel else "") + ' "]"'
        else:
            root = "call-object"
        return "root ::= " + root + "\n" + body

    def trigger(self, fmt: str) -> Optional[str]:
        """Where the grammar starts: None (the first token) but for a native
        format under ``auto``, where the text is free until a call starts."""
        return TRIGGERS[fmt] if fmt != "generic" and self.choice == "auto" else None

    def system(self) -> str:
        """The generic format's system text: the tools and the answer's shape."""
        return GENERIC_SYSTEM.format(tools=json.dumps(self.template_tools(), ensure_ascii=False))

    # -- the answer ----------------------------------------------------------------
    def parse(self, text: str, fmt: str) -> Tuple[Optional[str], List[dict]]:
        """``(content, tool_calls)`` of an answer: the calls as OpenAI returns
        them (``{"id", "type": "function", "function": {"name", "arguments"}}``,
        arguments a JSON string), the rest of the text as the content (None
        when there is none). Calls to undeclared functions and text that does
        not parse stay in the content."""
        found = parse_calls(text, fmt)
        if found is None:
            return text, []
        content, raw = found
        names = {t.name for t in self.tools}
        calls = [c for c in raw if c[0] in names]
        if len(calls) < len(raw):
            return text, []
        return content, [{"id": cid or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                          "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
                         for name, args, cid in calls]


def _call(obj: Any, args_keys: Sequence[str] = ("arguments", "parameters")) -> Optional[tuple]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    cid = obj.get("id")
    return (obj["name"], args, cid if isinstance(cid, str) else None) if isinstance(args, dict) else None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_calls(text: str, fmt: str) -> Optional[Tuple[Optional[str], List[tuple]]]:
    """``(content, [(name, arguments dict, id or None)])`` found in ``text``
    written in ``fmt``, or None when it holds no call (or one that does not
    parse: the text is then content)."""
    if fmt == "generic":
        obj = _json(text)
        if obj is None and text.startswith('{"response"'):  # cut by max_tokens inside the response
            obj = _json(text + '"}') or _json(text[:-1] + '"}')
        if not isinstance(obj, dict):
            return None
        if isinstance(obj.get("response"), str) and len(obj) == 1:
            return obj["response"], []
        raw = obj.get("tool_calls") if "tool_calls" in obj else [obj.get("tool_call")]
        calls = [_call(c) for c in raw] if isinstance(raw, list) and raw else [None]
        return None if None in calls else (None, calls)
    if fmt == "hermes":
        blocks = list(re.finditer(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.S))
        calls = [_call(_json(b.group(1))) for b in blocks]
        if not blocks or None in calls:
            return None
        rest = re.sub(r"<tool_call>.*?(?:</tool_call>|$)", "", text, flags=re.S).strip()
        return rest or None, calls
    if fmt == "mistral":
        head, sep, tail = text.partition("[TOOL_CALLS]")
        raw = _json(tail.strip()) if sep else None
        calls = [_call(c) for c in raw] if isinstance(raw, list) and raw else [None]
        return None if None in calls else (head.strip() or None, calls)
    text = text.strip().removeprefix("<|python_tag|>")
    head, sep, tail = text.partition(TRIGGERS["llama3"])  # any text, then the call (auto)
    one = _call(_json((sep + tail).strip() if sep else text))
    return None if one is None else (head.strip() or None, [one])


def template_messages(messages: List[dict], fmt: str, calling: Optional[ToolCalling]) -> List[dict]:
    """Checked chat messages as the template should see them. Native formats:
    earlier calls' arguments as objects (the templates write them with
    ``tojson``). Generic: earlier calls as the JSON the model answers with,
    tool results as user messages (``{"tool_response": ...}``, as llama.cpp's
    template polyfill writes them), and the tools' system text in front."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if fmt != "generic":
            if calls:
                m = {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments":
                     _json(c["function"]["arguments"]) or {}}} for c in calls]}
            out.append(m)
        elif calls:
            objs = [{"name": c["function"]["name"], "arguments": _json(c["function"]["arguments"]) or {}}
                    for c in calls]
            body = {"tool_calls": objs} if len(objs) > 1 else {"tool_call": objs[0]}
            out.append({"role": "assistant", "content": json.dumps(body, ensure_ascii=False)})
        elif m["role"] == "tool":
            resp = {"tool": m.get("name") or m.get("tool_call_id") or "", "content": m["content"]}
            out.append({"role": "user", "content": json.dumps({"tool_response": resp}, ensure_ascii=False)})
        else:
            out.append(m)
    if fmt == "generic" and calling is not None:
        if out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + calling.system()}
        else:
            out.insert(0, {"role": "system", "content": calling.system()})
    return out


def tools_of(args: Mapping[str, Any], chat: bool) -> Optional[ToolCalling]:
    """A request's :class:`ToolCalling` (chat), or None. A completion (not
    chat) that declares tools or asks for a call gets :class:`Unsupported`."""
    if chat:
        return ToolCalling.read(args)
    for name in TOOL_FIELDS:
        if args.get(name) not in (None, [], "none", "auto", False):
            raise Unsupported(name, f"{name}: tools are called in chat completions (/v1/chat/completions) only")
    return None


class ChatPrompt(NamedTuple):
    """A chat request ready to run: its prompt ``ids``, the ``grammar`` its
    answer is held to (GBNF or None), from where (``trigger``: None for the
    first token) and the tool ``fmt`` it is read back in."""
    ids: List[int]
    grammar: Optional[str]
    trigger: Optional[str]
    fmt: str


def prepare_chat(llm, messages: List[dict], calling: Optional[ToolCalling],
                 grammar: Optional[str] = None) -> ChatPrompt:
    """Checked chat messages on ``llm`` (a
    :class:`~specgguf.SpeculativeLlama`) as a :class:`ChatPrompt`: the
    messages as its template writes them, the tools rendered (native
    formats) or described (generic), and the grammar a call is held to.
    ``grammar``: one the request set otherwise (``response_format``, ...),
    refused beside tools unless ``tool_choice`` is ``"none"``."""
    fmt = llm.tool_format
    native = calling.template_tools() if calling is not None and fmt != "generic" else None
    ids = llm.tokenize(template_messages(messages, fmt, calling), chat=True, tools=native)
    if calling is None:
        return ChatPrompt(ids, grammar, None, fmt)
    if grammar is not None:
        raise FieldError("tools", "tools: a tool call is held to its own grammar; drop response_format, "
                                  "json_schema or grammar, or set tool_choice to \"none\"")
    return ChatPrompt(ids, calling.grammar(fmt), calling.trigger(fmt), fmt)
