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

An answer that max_tokens cut (``cut``) ends where it ends: a call it was writing (a marker
and JSON that does not parse, or a tail that may be the start of a marker) is dropped, not
kept as content, as is the white space before it; the calls before it stay. Mistral's list
keeps the calls it completed. Llama 3's call without ``<|python_tag|>`` is a JSON object as the
whole answer, which a JSON answer may also be: a cut one counts as a call only when it starts
as the format writes one (``{"name":``, or a start of that) or follows a call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

PARSERS = ("llama3", "qwen3", "mistral")
_decoder = json.JSONDecoder()
# How Llama 3 starts a call object (white space aside): a cut answer that starts so, or that
# is cut before it could, was a call.
_CALL_HEAD = '{"name":'


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


class _Unfinished:
    """Where a call that max_tokens cut stood: it is dropped, but the content around it is
    stripped as around a call."""


UNFINISHED = _Unfinished()


def _held(text: str, marker: str) -> int:
    """How many of text's last characters may be the start of marker."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def _cut_tail(text: str, marker: str, cut: bool) -> list:
    """A final answer's text after its last call: at a cut, less a tail that may be the start
    of the marker (UNFINISHED in its place)."""
    held = _held(text, marker) if cut else 0
    return [text[:len(text) - held], UNFINISHED] if held else [text]


def _assemble(items: list, final: bool) -> tuple[str, list[ParsedCall]]:
    """Content and calls from the answer's pieces in order (texts, calls and UNFINISHED)."""
    merged: list = []
    for item in items:
        if isinstance(item, str) and merged and isinstance(merged[-1], str):
            merged[-1] += item
        else:
            merged.append(item)
    content = []
    for i, item in enumerate(merged):
        if not isinstance(item, str):
            continue
        if i > 0:
            item = item.lstrip()
        last = i == len(merged) - 1
        if (last and not final) or (not last and not isinstance(merged[i + 1], str)):
            item = item.rstrip()
        if item:
            content.append(item)
    return "\n".join(content), [c for c in merged if isinstance(c, ParsedCall)]


class ToolParser:
    name = ""
    marker = ""

    def parse(self, text: str, final: bool = True,
              cut: bool = False) -> tuple[str, list[ParsedCall]]:
        """(content, calls) of an answer so far (final: the whole answer; cut: max_tokens ended
        it, see the module's doc)."""
        return _assemble(self._items(text, final, final and cut), final)

    def _items(self, text: str, final: bool, cut: bool) -> list:
        raise NotImplementedError


class _JSONValues(ToolParser):
    """Formats of a marker followed by JSON values (each a call or a list of calls)."""

    argument_keys: tuple[str, ...] = ()
    separators = " \t\r\n"

    def _calls(self, value) -> list[ParsedCall] | None:
        raise NotImplementedError

    def _values(self, text: str, start: int, pos: int, final: bool, cut: bool) -> list:
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
                    items.append(UNFINISHED if cut and start < pos else text[start:])
                return items
            try:
                value, end = _decoder.raw_decode(text, pos)
            except (ValueError, RecursionError):  # malformed, or not complete yet
                if cut and self._was_call(text, start, pos, bool(items)):
                    items += [*self._completed(text, pos), UNFINISHED]
                elif final:
                    items.append(text[start:])
                return items
            calls = self._calls(value)
            if not calls:
                items.append(text[start:])
                return items
            items.extend(calls)
            start = pos = end

    def _was_call(self, text: str, start: int, pos: int, after_call: bool) -> bool:
        """Whether the value at pos that does not parse (content from start) is a call that was
        cut: JSON begun after the marker or after a call (other text stays content)."""
        return text.startswith(("{", "["), pos) \
            and (after_call or text.startswith(self.marker, start))

    def _completed(self, text: str, pos: int) -> list[ParsedCall]:
        """The calls an unfinished value at pos completed before it was cut."""
        return []

    def _before_marker(self, text: str, final: bool, cut: bool) -> list:
        if final:
            return _cut_tail(text, self.marker, cut)
        return [text[:len(text) - _held(text, self.marker)]]


class Llama3Parser(_JSONValues):
    name = "llama3"
    marker = "<|python_tag|>"
    argument_keys = ("parameters", "arguments")
    separators = " \t\r\n;"

    def _calls(self, value):
        call = _call(value, self.argument_keys)
        return [call] if call else None

    def _was_call(self, text, start, pos, after_call):
        head = "".join(text[pos:pos + 4 * len(_CALL_HEAD)].split())
        return super()._was_call(text, start, pos, after_call) \
            or head.startswith(_CALL_HEAD) or _CALL_HEAD.startswith(head)

    def _items(self, text, final, cut):
        i = text.find(self.marker)
        if i >= 0:
            return [text[:i], *self._values(text, i, i + len(self.marker), final, cut)]
        if text.lstrip().startswith("{"):  # the whole answer is a call, or not one
            return self._values(text, 0, 0, final, cut)
        if not final and not text.strip():
            return []  # it may yet start with "{"
        return self._before_marker(text, final, cut)


class MistralParser(_JSONValues):
    name = "mistral"
    marker = "[TOOL_CALLS]"
    argument_keys = ("arguments", "parameters")

    def _calls(self, value):
        values = value if isinstance(value, list) else [value]
        calls = [_call(v, self.argument_keys) for v in values]
        return calls if calls and all(calls) else None

    def _completed(self, text, pos):
        """The whole call objects at the start of a cut list."""
        calls, pos = [], pos + 1
        if not text.startswith("[", pos - 1):
            return calls
        while True:
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            try:
                value, pos = _decoder.raw_decode(text, pos)
            except (ValueError, RecursionError):
                return calls
            call = _call(value, self.argument_keys)
            if call is None:
                return calls
            calls.append(call)

    def _items(self, text, final, cut):
        i = text.find(self.marker)
        if i < 0:
            return self._before_marker(text, final, cut)
        return [text[:i], *self._values(text, i, i + len(self.marker), final, cut)]


class Qwen3Parser(ToolParser):
    name = "qwen3"
    marker = "<tool_call>"
    end = "</tool_call>"

    def _block(self, body: str) -> ParsedCall | None:
        try:
            return _call(json.loads(body), ("arguments", "parameters"))
        except (ValueError, RecursionError):
            return None

    def _items(self, text, final, cut):
        items, pos = [], 0
        while True:
            i = text.find(self.marker, pos)
            if i < 0:
                rest = text[pos:]
                if final:
                    return items + _cut_tail(rest, self.marker, cut)
                return items + [rest[:len(rest) - _held(rest, self.marker)]]
            items.append(text[pos:i])
            j = text.find(self.end, i)
            if j < 0:  # not closed: a call only if the answer ended right after its JSON
                if final:
                    items.append(self._block(text[i + len(self.marker):])
                                 or (UNFINISHED if cut else text[i:]))
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
