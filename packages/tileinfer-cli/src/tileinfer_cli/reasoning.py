"""A thinking model's reasoning, apart from its answer (``serve --reasoning-parser``, ``run`` and
``chat --hide-thinking``).

Qwen3, SmolLM3 and DeepSeek-R1's distillations think first, between ``<think>`` and
``</think>``, then answer. A client wants the answer as the message's ``content`` and the
thinking beside it: DeepSeek's API, llama.cpp's server and most clients read it as
``reasoning_content``, vLLM's server now writes ``reasoning``; the server writes both (the same
text). The answer's tool calls are read from the content only.

Where the answer starts: a template that opens the thinking itself (DeepSeek-R1's distills end
the prompt with ``<think>\\n``) leaves the prompt inside a think block: the answer then starts in
its reasoning. Otherwise the reasoning is the think block the answer starts with (after any
whitespace), if any; Qwen3 with ``enable_thinking: false`` writes an empty block into the prompt
and the answer is all content. Reasoning runs to ``</think>``; an answer that ends before it
(cut by max_tokens) is all reasoning, as vLLM's DeepSeek-R1 parser reads it. The newlines
around the reasoning and before the content (which templates write beside the tags) are part of
neither text.

Streamed, ``ReasoningStream`` holds back a tail of the text that could be the start of the tag
it waits for (and newlines that may end the reasoning), so that the pieces it gives add up to
the whole answer's split.
"""

from __future__ import annotations

START, END = "<think>", "</think>"
NAMES = ("think", "qwen3", "deepseek_r1")  # vLLM's names of the same format


def prompt_is_thinking(prompt: str) -> bool:
    """Whether a rendered prompt ends inside a think block (its last <think> is not closed)."""
    return prompt.rfind(START) > prompt.rfind(END)


def tags_are_tokens(tokenizer) -> bool:
    """Whether <think> and </think> are tokens of the tokenizer's vocabulary."""
    return all(tokenizer.token_to_id(tag) is not None for tag in (START, END))


def split(text: str, thinking: bool) -> tuple[str | None, str | None]:
    """(reasoning, content) of a whole answer (None for an empty part); thinking: the prompt
    ends inside a think block. The answer in one piece through ``ReasoningStream``."""
    reasoning, content = ReasoningStream(thinking).feed(text, final=True)
    return reasoning or None, content or None


def _held(text: str, tag: str) -> int:
    """The length of the longest end of text that is a proper start of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningStream:
    """One streamed choice's text, split into reasoning and content as it comes (the module
    docstring says where each part starts and ends): given the whole text at once, the split of
    a whole answer. It keeps only what it holds back (a start of the tag it waits for, newlines
    that may end the reasoning), so a long answer costs each piece's length, not the text so
    far."""

    __slots__ = ("thinking", "state", "held", "reasoning_started", "content_started")

    def __init__(self, thinking: bool):
        self.thinking = thinking
        self.state = "start"  # then "reasoning" or "content"
        self.held = ""
        self.reasoning_started = self.content_started = False

    def feed(self, piece: str, final: bool) -> tuple[str, str]:
        """The new reasoning and content that the choice's new text piece settles; final: the
        choice has ended."""
        text, self.held = self.held + piece, ""
        if self.state == "start":
            opened = text.lstrip()
            if not final and len(opened) < len(START) and START.startswith(opened):
                self.held = text  # it may still open a think block
                return "", ""
            if opened.startswith(START):
                self.state, text = "reasoning", opened[len(START):]
            elif self.thinking:
                self.state = "reasoning"
            else:  # no thinking: the answer as it is
                self.state, self.content_started = "content", True
        if self.state == "content":
            return "", self._content(text)
        end = text.find(END)
        if end >= 0:
            self.state = "content"
            return self._reasoning(text[:end].rstrip("\n")), self._content(text[end + len(END):])
        if final:
            return self._reasoning(text.rstrip("\n")), ""
        # Hold a start of </think>, and the newlines before it (the reasoning may end there).
        before = text[:len(text) - _held(text, END)]
        given = before.rstrip("\n")
        self.held = text[len(given):]
        return self._reasoning(given), ""

    def _reasoning(self, text: str) -> str:
        if not self.reasoning_started:
            text = text.lstrip("\n")
            self.reasoning_started = bool(text)
        return text

    def _content(self, text: str) -> str:
        if not self.content_started:
            text = text.lstrip("\n")
            self.content_started = bool(text)
        return text


class HiddenThinking:
    """A file-like object between the answer's text and ``out`` that writes the content only
    (``--hide-thinking``); ``reasoning`` and ``content`` hold what went by."""

    def __init__(self, out, thinking: bool):
        self.out, self.stream = out, ReasoningStream(thinking)
        self._reasoning: list[str] = []
        self._content: list[str] = []

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    @property
    def content(self) -> str:
        return "".join(self._content)

    def write(self, text: str):
        self._put(*self.stream.feed(text, False))

    def _put(self, reasoning: str, content: str):
        self._reasoning.append(reasoning)
        self._content.append(content)
        if content:
            self.out.write(content)

    def flush(self):
        self.out.flush()

    def end(self):
        """The answer ended: write what was held back."""
        self._put(*self.stream.feed("", True))
        self.flush()
