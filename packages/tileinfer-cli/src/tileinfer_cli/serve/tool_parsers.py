"""Tool calls in a model's answer, in the format its chat template teaches it.

llama3   Llama 3.1+ and 3.2: a JSON object ``{"name": ..., "parameters": {...}}`` as the whole
         answer, or after ``<|python_tag|>``; several separated by ";".
qwen3    Qwen3 (and Hermes-style templates): each call in ``<tool_call>{"name": ...,
         "arguments": {...}}</tool_call>``, with text between.
mistral  ``[TOOL_CALLS]`` and a JSON list of ``{"name", "arguments"}``.

``parse(text, final)`` splits an answer into its content (the text outside the calls) and its
calls (name, arguments as JSON text). A call whose JSON does not parse, or that lacks a name or
an object of arguments, stays in the content as the model wrote it; the white space between
the calls and the text around them is dropped, and texts that a call separated are joined by a
newline. Before the answer is complete (final=False) the
parse holds back what more text could change: everything from a call's marker (or from a tail
that may be the start of one) on, and the content's trailing white space (a call after it would
drop it). So each parse's content is a prefix of the next one's and its calls are the first of
the next one's: a stream sends the differences.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

PARSERS = ("llama3", "qwen3", "mistral")
_decoder = json.JSONDecoder()


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object, as text


def _call(value, argument_keys) -> ParsedCall | None:
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    key = next((k for k in argument_keys if k in value), None)
    if not isinstance(name, str) or not name or key is None:
        return None
    arguments = value[key]
    if isinstance(arguments, str):  # some models write the object as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


def _held(text: str, marker: str) -> int:
    """How many of text's last characters may be the start of marker."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def _assemble(items: list, final: bool) -> tuple[str, list[ParsedCall]]:
    """Content and calls from the answer's pieces in order (texts and calls)."""
    merged: list = []
    for item in items:
        if isinstance(item, str) and merged and isinstance(merged[-1], str):
            merged[-1] += item
        else:
            merged.append(item)
    content = []
    for i, item in enumerate(merged):
        if isinstance(item, ParsedCall):
            continue
        if i > 0:
            item = item.lstrip()
        last = i == len(merged) - 1
        if (last and not final) or (not last and isinstance(merged[i + 1], ParsedCall)):
            item = item.rstrip()
        if item:
            content.append(item)
    return "\n".join(content), [c for c in merged if isinstance(c, ParsedCall)]


class ToolParser:
    name = ""
    marker = ""

    def parse(self, text: str, final: bool = True) -> tuple[str, list[ParsedCall]]:
        return _assemble(self._items(text, final), final)

    def _items(self, text: str, final: bool) -> list:
        raise NotImplementedError


class _JSONValues(ToolParser):
    """Formats of a marker followed by JSON values (each a call or a list of calls)."""

    argument_keys: tuple[str, ...] = ()
    separators = " \t\r\n"

    def _calls(self, value) -> list[ParsedCall] | None:
        raise NotImplementedError

    def _values(self, text: str, start: int, pos: int, final: bool) -> list:
        """The calls in text from pos on; start: where the text kept as content begins if the
        next value is not a call (the marker's place, or the end of the call before)."""
        items = []
        while True:
            while pos < len(text) and text[pos] in self.separators:
                pos += 1
            if items:  # after a call: its separator goes with it
                start = pos
            if pos == len(text):
                if final:
                    items.append(text[start:])
                return items
            try:
                value, end = _decoder.raw_decode(text, pos)
            except (ValueError, RecursionError):  # malformed, or not complete yet
                if final:
                    items.append(text[start:])
                return items
            calls = self._calls(value)
            if not calls:
                items.append(text[start:])
                return items
            items.extend(calls)
            start = pos = end

    def _before_marker(self, text: str, final: bool) -> list:
        return [text if final else text[:len(text) - _held(text, self.marker)]]


class Llama3Parser(_JSONValues):
    name = "llama3"
    marker = "<|python_tag|>"
    argument_keys = ("parameters", "arguments")
    separators = " \t\r\n;"

    def _calls(self, value):
        call = _call(value, self.argument_keys)
        return [call] if call else None

    def _items(self, text, final):
        i = text.find(self.marker)
        if i >= 0:
            return [text[:i], *self._values(text, i, i + len(self.marker), final)]
        if text.lstrip().startswith("{"):  # the whole answer is a call, or not one
            return self._values(text, 0, 0, final)
        if not final and not text.strip():
            return []  # it may yet start with "{"
        return self._before_marker(text, final)


class MistralParser(_JSONValues):
    name = "mistral"
    marker = "[TOOL_CALLS]"
    argument_keys = ("arguments", "parameters")

    def _calls(self, value):
        values = value if isinstance(value, list) else [value]
        calls = [_call(v, self.argument_keys) for v in values]
        return calls if calls and all(calls) else None

    def _items(self, text, final):
        i = text.find(self.marker)
        if i < 0:
            return self._before_marker(text, final)
        return [text[:i], *self._values(text, i, i + len(self.marker), final)]


class Qwen3Parser(ToolParser):
    name = "qwen3"
    marker = "<tool_call>"
    end = "</tool_call>"

    def _block(self, body: str) -> ParsedCall | None:
        try:
            return _call(json.loads(body), ("arguments", "parameters"))
        except (ValueError, RecursionError):
            return None

    def _items(self, text, final):
        items, pos = [], 0
        while True:
            i = text.find(self.marker, pos)
            if i < 0:
                rest = text[pos:]
                items.append(rest if final else rest[:len(rest) - _held(rest, self.marker)])
                return items
            items.append(text[pos:i])
            j = text.find(self.end, i)
            if j < 0:  # not closed: a call only if the answer ended right after its JSON
                if final:
                    items.append(self._block(text[i + len(self.marker):]) or text[i:])
                return items
            pos = j + len(self.end)
            items.append(self._block(text[i + len(self.marker):j]) or text[i:pos])


_BY_NAME = {p.name: p for p in (Llama3Parser, Qwen3Parser, MistralParser)}
# What a chat template writes when it teaches its model a format.
_TEMPLATE_SIGNS = (("<tool_call>", "qwen3"), ("[TOOL_CALLS]", "mistral"),
                   ("<|python_tag|>", "llama3"),
                   ('"parameters": dictionary of argument name', "llama3"))


def detect(template: str | None, tokenizer=None) -> str | None:
    """The format a model's chat template (else its tokenizer's added tokens) shows, or None."""
    for sign, name in _TEMPLATE_SIGNS:
        if template and sign in template:
            return name
    if tokenizer is not None:
        for token, name in _TEMPLATE_SIGNS[:3]:
            if tokenizer.token_to_id(token) is not None:
                return name
    return None


def tool_parser(name: str | None) -> ToolParser | None:
    """The parser of a format name (PARSERS), None for None or "none"."""
    if name is None or name == "none":
        return None
    return _BY_NAME[name]()
