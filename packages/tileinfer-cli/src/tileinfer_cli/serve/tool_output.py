"""A choice's tool calls in the answer: ids, the whole message, and the stream's deltas.

Each call gets an id, ``"call_"`` and 24 random hex digits; Mistral's template takes back only
ids of 9 letters and digits, so with its parser the ids are such (as Mistral's own tokenizer
code makes them). A choice that called a tool and stopped on its own ends with finish_reason
``"tool_calls"``; ``parallel_tool_calls: false`` keeps the first call only.

Streamed, a choice's text goes through ``ToolStream``: content as soon as the parser knows it
is content, and each call once its JSON is complete (the model's JSON is checked before it is
sent: malformed JSON stays content). A call goes out in two deltas, as the ``openai`` client
accumulates them: ``{index, id, type, function: {name, arguments: ""}}``, then ``{index,
function: {arguments}}``. An answer that max_tokens cut (finish reason ``"length"``, which it
keeps) loses the call it was writing, whole and streamed (``tool_parsers``' ``cut``).
"""

from __future__ import annotations

import secrets
import string

_ALPHANUMERIC = string.ascii_letters + string.digits


def call_id(parser) -> str:
    if parser.name == "mistral":
        return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))
    return "call_" + secrets.token_hex(12)


def as_tool_calls(parser, calls) -> list[dict]:
    return [{"id": call_id(parser), "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def finish_reason(reason: str | None, called: bool) -> str | None:
    return "tool_calls" if called and reason == "stop" else reason


def message(parser, text: str, max_calls: int | None,
            cut: bool = False) -> tuple[str | None, list[dict]]:
    """A whole answer's content (None when empty) and tool calls; cut: max_tokens ended it."""
    content, calls = parser.parse(text, final=True, cut=cut)
    return content or None, as_tool_calls(parser, calls[:max_calls])


class ToolStream:
    """One streamed choice's text, split into content and tool calls as it comes."""

    __slots__ = ("parser", "max_calls", "text", "content_sent", "calls_sent")

    def __init__(self, parser, max_calls: int | None):
        self.parser, self.max_calls = parser, max_calls
        self.text = ""
        self.content_sent = 0
        self.calls_sent = 0

    def feed(self, piece: str, finish: str | None) -> tuple[str, list[dict]]:
        """The content and the calls (as their deltas' tool_calls entries) that the choice's
        new text piece settles; finish: the choice's finish reason once it has ended."""
        final = finish is not None
        if not piece and not final:
            return "", []
        self.text += piece
        content, calls = self.parser.parse(self.text, final, cut=finish == "length")
        new_content = content[self.content_sent:]
        self.content_sent = len(content)
        calls = calls[self.calls_sent:self.max_calls]
        deltas = []
        for k, (call, whole) in enumerate(zip(calls, as_tool_calls(self.parser, calls))):
            index = self.calls_sent + k
            deltas.append({"index": index, "id": whole["id"], "type": "function",
                           "function": {"name": call.name, "arguments": ""}})
            deltas.append({"index": index, "function": {"arguments": call.arguments}})
        self.calls_sent += len(calls)
        return new_content, deltas

    @property
    def called(self) -> bool:
        return self.calls_sent > 0
