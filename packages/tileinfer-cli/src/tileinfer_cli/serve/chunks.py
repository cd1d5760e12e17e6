"""The answers' JSON: streamed chunks (server-sent events) and whole responses.

Chunks are written as text around ``json.dumps`` of the new text, with the fixed part of each
job's chunks (id, created, model) built once: a server streaming hundreds of answers writes
thousands of chunks a second, and building and validating a pydantic model per chunk would
cost more than the decoding. ``responses.py`` describes them (the tests check written chunks
against those models); whole responses go through the pydantic models.

Streams follow OpenAI's: each choice's first chunk carries ``role`` (chat), a chunk carries a
choice's new text (one per choice per flush), the choice's last chunk its ``finish_reason``;
with ``stream_options.include_usage`` every chunk has ``"usage": null`` and a last chunk with no
choices carries the usage; then ``data: [DONE]``. An error after the stream started is sent as
an event ``{"error": {...}}`` (the ``openai`` client raises it), then ``[DONE]``. A request
with tools streams its choices' text through ``tool_output.ToolStream``: a flush's content and
each tool-call delta go out in chunks of their own, the finish reason on the last. A thinking
model's reasoning (``tileinfer_cli/reasoning.py``) goes out as ``reasoning_content`` and
``reasoning`` deltas before the content.
"""

from __future__ import annotations

import json

from .. import reasoning
from . import responses, tool_output
from .logprobs import TokenTexts, chat_entries, completion_logprobs

DONE = b"data: [DONE]\n\n"
_dumps = json.dumps


def _finish(reason) -> str:
    return "null" if reason is None else f'"{reason}"'


def whole_answer(plan, c) -> tuple[str | None, str | None, list[dict], str | None]:
    """A finished choice's (reasoning, content, tool calls as chat ``tool_calls`` entries,
    finish reason): the reasoning split off first, the calls read from the content."""
    content, thought, calls = c.text.text, None, []
    if plan.reasoning:
        thought, content = reasoning.split(content, plan.thinking)
    if plan.tools is not None and content:
        cut = c.finish_reason == "length"
        said, found = tool_output.message(plan.tools, content, plan.max_tool_calls, cut)
        # An answer without calls keeps its text as it is, unless a cut call leaves it.
        if found or cut:
            content, calls = said, found
    return thought, content, calls, tool_output.finish_reason(c.finish_reason, bool(calls))


class _Format:
    object = ""

    def __init__(self, model_name: str, tokenizer):
        self.model_name = model_name
        self.texts = TokenTexts(tokenizer)

    def head(self, job) -> str:
        """The fixed start of a job's chunks (cached on the job)."""
        head = getattr(job, "chunk_head", None)
        if head is None:
            head = job.chunk_head = (f'data: {{"id":{_dumps(job.id)},"object":"{self.object}",'
                                     f'"created":{job.created},"model":{_dumps(self.model_name)},'
                                     '"choices":[')
        return head

    def tail(self, job) -> str:
        return '],"usage":null}\n\n' if job.plan.include_usage else "]}\n\n"

    def usage(self, job) -> dict:
        prompt, completion = job.plan.prompt_tokens, job.completion_tokens
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": job.cached_tokens}}

    def end(self, job) -> bytes:
        """What a stream sends after the last chunk."""
        if job.error is not None:
            return f"data: {job.error.json()}\n\n".encode() + DONE
        if job.plan.include_usage:
            head = self.head(job)
            return (f"{head}],\"usage\":{_dumps(self.usage(job))}}}\n\n").encode() + DONE
        return DONE

    def chunks(self, job, deltas) -> str:
        head, tail = self.head(job), self.tail(job)
        return "".join(head + c + tail for d in deltas for c in self.choice_chunks(job, *d))

    def response(self, job) -> dict:
        """A whole (not streamed) answer: the endpoint's schema over every choice's."""
        return self.schema(id=job.id, created=job.created, model=self.model_name,
                           choices=[self.choice(job, c) for c in job.choices],
                           usage=self.usage(job)).model_dump()


class ChatFormat(_Format):
    object = "chat.completion.chunk"
    schema = responses.ChatCompletion

    def choice_chunks(self, job, choice, text, lps, finish) -> list[str]:
        calls, thought = (), ""
        if choice.reasoning is not None:
            thought, text = choice.reasoning.feed(text, finish is not None)
        if choice.tools is not None:
            text, calls = choice.tools.feed(text, finish)
            finish = tool_output.finish_reason(finish, choice.tools.called)
        # The delta's fields: reasoning, content, then each tool-call entry in a chunk of its own.
        fields = [f'"content":{_dumps(text)}'] if text or not (calls or thought) else []
        if thought:
            thought = _dumps(thought)
            fields.insert(0, f'"reasoning_content":{thought},"reasoning":{thought}')
        fields += [f'"tool_calls":[{_dumps(call)}]' for call in calls]
        if not choice.role_sent:
            choice.role_sent = True
            fields[0] = '"role":"assistant",' + fields[0]
        elif fields == ['"content":""']:
            fields = [""]
        logprobs = "null"
        if job.plan.logprobs is not None:
            logprobs = _dumps({"content": chat_entries(self.texts, lps)})
        last = len(fields) - 1
        return [f'{{"index":{choice.index},"delta":{{{f}}},'
                f'"logprobs":{logprobs if k == 0 else "null"},'
                f'"finish_reason":{_finish(finish if k == last else None)}}}'
                for k, f in enumerate(fields)]

    def choice(self, job, c):
        logprobs = None
        if job.plan.logprobs is not None:
            logprobs = {"content": chat_entries(self.texts, c.lps)}
        thought, content, calls, finish = whole_answer(job.plan, c)
        if job.plan.reasoning:
            message = responses.AssistantReasoning(content=content or None,
                                                   tool_calls=calls or None,
                                                   reasoning_content=thought, reasoning=thought)
        elif calls:
            message = responses.AssistantToolCalls(content=content, tool_calls=calls)
        else:
            message = responses.AssistantMessage(content=content or "")
        return responses.ChatChoice(index=c.index, logprobs=logprobs, message=message,
                                  finish_reason=finish)


class CompletionFormat(_Format):
    object = "text_completion"
    schema = responses.Completion

    def _logprobs(self, choice, lps):
        found = completion_logprobs(self.texts, lps, choice.lp_offset)
        if found["tokens"]:
            choice.lp_offset = found["text_offset"][-1] + len(found["tokens"][-1])
        return found

    def choice_chunks(self, job, choice, text, lps, finish) -> list[str]:
        logprobs = "null"
        if job.plan.logprobs is not None:
            logprobs = _dumps(self._logprobs(choice, lps))
        return [f'{{"index":{choice.index},"text":{_dumps(text)},"logprobs":{logprobs},'
                f'"finish_reason":{_finish(finish)}}}']

    def choice(self, job, c):
        logprobs = self._logprobs(c, c.lps) if job.plan.logprobs is not None else None
        return responses.CompletionChoice(index=c.index, text=c.echo + c.text.text,
                                          logprobs=logprobs, finish_reason=c.finish_reason)
