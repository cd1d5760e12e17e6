"""The answers of ``/v1/responses``: a whole ``response`` object, or its stream of events.

A response's ``output`` is a list of items: the reasoning of a thinking model (``reasoning``,
its text as one ``reasoning_text`` part), the answer's text (``message``, one ``output_text``
part, with the tokens' log-probabilities when ``include`` asks for them) and each tool call
(``function_call``, whose ``call_id`` a client answers with a ``function_call_output`` item).
An answer cut by ``max_output_tokens`` is ``"status": "incomplete"``, with the reason.

Streamed, the events follow OpenAI's order, each with its ``sequence_number``:
``response.created`` and ``response.in_progress`` (the response so far, no output), then per
item ``response.output_item.added``, its part's ``response.content_part.added``, the text's
deltas (``response.output_text.delta`` / ``response.reasoning_text.delta``; a call's
``response.function_call_arguments.delta``), the ``.done`` events in reverse, and at the end
``response.completed`` (or ``response.incomplete``) with the whole response; an error after the
stream began ends it with ``response.failed``. The text is split as the chat endpoint splits it
(``tileinfer_cli/reasoning.py``, ``tool_output.ToolStream``), so the items of a stream add up
to the whole answer's.

``usage.output_tokens_details.reasoning_tokens`` counts the reasoning's text encoded again
(the tokens of a split answer are not attributed one by one); ``input_tokens_details
.cached_tokens`` the prompt tokens the engine found in its prefix cache (the chat and
completions usage's ``prompt_tokens_details.cached_tokens``); ``cache_write_tokens`` is 0.
"""

from __future__ import annotations

import json
import secrets

from . import tool_output
from .chunks import whole_answer
from .logprobs import TokenTexts, chat_entries


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _status(finish: str | None) -> tuple[str, dict | None]:
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


class ResponsesFormat:
    def __init__(self, model_name: str, tokenizer, store):
        """store: the ``ResponseStore`` that keeps finished responses."""
        self.model_name, self.tokenizer, self.store = model_name, tokenizer, store
        self.texts = TokenTexts(tokenizer)

    def kept(self, job) -> bool:
        """Whether the job's response is kept (``store`` not false, and the server keeps some)."""
        return job.request.store is not False and self.store.capacity > 0

    def keep(self, job, whole: dict):
        """Keep a finished response with its conversation (its output items last)."""
        if self.kept(job):
            self.store.put(whole, job.plan.conversation + whole["output"])

    # -- the response object --------------------------------------------------------------------

    def envelope(self, job, status: str, output: list, usage: dict | None) -> dict:
        """The response object around its output: the request's settings as they applied."""
        req, plan = job.request, job.plan
        choice = req.tool_choice
        return {
            "id": job.id, "object": "response", "created_at": job.created, "status": status,
            "error": None, "incomplete_details": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "max_tool_calls": req.max_tool_calls,
            "model": self.model_name, "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None,
                          "summary": None},
            "store": self.kept(job), "temperature": plan.sampling.temperature,
            "top_p": plan.sampling.top_p, "top_logprobs": req.top_logprobs or 0,
            "text": {"format": req.text_format()},
            "tool_choice": choice.model_dump() if hasattr(choice, "model_dump") else
            (choice or "auto"),
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
            "truncation": "disabled", "usage": usage, "user": req.user,
            "metadata": req.metadata or {}}

    def usage(self, job, thoughts: list[str]) -> dict:
        prompt, output = job.plan.prompt_tokens, job.completion_tokens
        reasoning = sum(len(self.tokenizer.encode(t, add_special_tokens=False))
                        for t in thoughts if t)
        cached = {"cached_tokens": job.cached_tokens, "cache_write_tokens": 0}
        return {"input_tokens": prompt, "input_tokens_details": cached, "output_tokens": output,
                "output_tokens_details": {"reasoning_tokens": min(reasoning, output)},
                "total_tokens": prompt + output}

    def logprobs_field(self, job, lps) -> dict:
        return {} if job.plan.logprobs is None else {"logprobs": chat_entries(self.texts, lps)}

    def response(self, job) -> dict:
        """A whole (not streamed) answer."""
        c = job.choices[0]
        thought, content, calls, finish = whole_answer(job.plan, c)
        output = []
        if thought:
            output.append(reasoning_item(_item_id("rs"), thought))
        if content or not calls:
            output.append(message_item(_item_id("msg"), content or "",
                                       self.logprobs_field(job, c.lps)))
        output += [call_item(_item_id("fc"), call["id"], call["function"]["name"],
                             call["function"]["arguments"]) for call in calls]
        status, details = _status(finish)
        whole = self.envelope(job, status, output, self.usage(job, [thought]))
        whole["incomplete_details"] = details
        self.keep(job, whole)
        return whole

    # -- the stream -----------------------------------------------------------------------------

    def _stream(self, job) -> ResponseStream:
        stream = getattr(job, "response_stream", None)
        if stream is None:
            stream = job.response_stream = ResponseStream(self, job)
        return stream

    def chunks(self, job, deltas) -> str:
        stream = self._stream(job)
        return "".join(stream.feed(*d) for d in deltas)

    def end(self, job) -> bytes:
        return self._stream(job).end().encode()


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def message_item(item_id: str, text: str, logprobs: dict, status: str = "completed") -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], **logprobs}]}


def call_item(item_id: str, call_id: str, name: str, arguments: str,
              status: str = "completed") -> dict:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


class ResponseStream:
    """One streamed response: its events so far (numbered), its items, the item still open."""

    def __init__(self, fmt: ResponsesFormat, job):
        self.fmt, self.job = fmt, job
        self.sequence = 0
        self.items: list[dict] = []  # every item begun, in its final form once closed
        self.open: dict | None = None  # the reasoning or message item taking text
        self.pending_lps: list = []  # log-probabilities not yet sent with a message's text
        self.thoughts: list[str] = []
        self.finish: str | None = None
        self.began = False

    def event(self, kind: str, **fields) -> str:
        fields = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {_dumps(fields)}\n\n"

    def _begin(self) -> str:
        if self.began:
            return ""
        self.began = True
        response = self.fmt.envelope(self.job, "in_progress", [], None)
        return (self.event("response.created", response=response)
                + self.event("response.in_progress", response=response))

    def feed(self, choice, text: str, lps, finish) -> str:
        out = [self._begin()]
        thought, calls, final = "", [], finish is not None
        if choice.reasoning is not None:
            thought, text = choice.reasoning.feed(text, final)
        if choice.tools is not None:
            text, calls = choice.tools.feed(text, finish)
        if lps and self.job.plan.logprobs is not None:
            self.pending_lps += chat_entries(self.fmt.texts, lps)
        if thought:
            out.append(self._text("reasoning", thought))
        if text:
            out.append(self._text("message", text))
        for first, rest in zip(calls[0::2], calls[1::2]):  # ToolStream's two deltas a call
            out.append(self._call(first["id"], first["function"]["name"],
                                  rest["function"]["arguments"]))
        if final:
            called = choice.tools is not None and choice.tools.called
            self.finish = tool_output.finish_reason(finish, called)
            out.append(self._close())
        return "".join(out)

    def _text(self, kind: str, text: str) -> str:
        out = ""
        if self.open is None or self.open["type"] != kind:
            out = self._close() + self._open(kind)
        item, index = self.open, len(self.items) - 1
        part = item["content"][0]
        part["text"] += text
        if kind == "reasoning":
            return out + self.event("response.reasoning_text.delta", item_id=item["id"],
                                    output_index=index, content_index=0, delta=text)
        lps, self.pending_lps = self.pending_lps, []
        if "logprobs" in part:
            part["logprobs"] += lps
        return out + self.event("response.output_text.delta", item_id=item["id"],
                                output_index=index, content_index=0, delta=text, logprobs=lps)

    def _open(self, kind: str) -> str:
        if kind == "reasoning":
            item = reasoning_item(_item_id("rs"), "", "in_progress")
        else:
            item = message_item(_item_id("msg"), "", self.fmt.logprobs_field(self.job, []),
                                "in_progress")
        self.items.append(item)
        self.open = item
        index = len(self.items) - 1
        # Added without its part (as OpenAI's), which the next event adds.
        out = self.event("response.output_item.added", output_index=index,
                         item={**item, "content": []})
        return out + self.event("response.content_part.added", item_id=item["id"],
                                output_index=index, content_index=0, part=item["content"][0])

    def _close(self) -> str:
        item, self.open = self.open, None
        if item is None:
            return ""
        index, part = len(self.items) - 1, item["content"][0]
        item["status"] = "completed"
        common = dict(item_id=item["id"], output_index=index, content_index=0)
        if item["type"] == "reasoning":
            self.thoughts.append(part["text"])
            done = self.event("response.reasoning_text.done", text=part["text"], **common)
        else:
            if "logprobs" in part:
                part["logprobs"] += self.pending_lps
                self.pending_lps = []
            done = self.event("response.output_text.done", text=part["text"],
                              **({"logprobs": part["logprobs"]} if "logprobs" in part
                                 else {"logprobs": []}), **common)
        return (done + self.event("response.content_part.done", part=part, **common)
                + self.event("response.output_item.done", output_index=index, item=item))

    def _call(self, call_id: str, name: str, arguments: str) -> str:
        out = self._close()
        item = call_item(_item_id("fc"), call_id, name, "", "in_progress")
        self.items.append(item)
        index = len(self.items) - 1
        out += self.event("response.output_item.added", output_index=index, item=item)
        out += self.event("response.function_call_arguments.delta", item_id=item["id"],
                          output_index=index, delta=arguments)
        out += self.event("response.function_call_arguments.done", item_id=item["id"],
                          output_index=index, arguments=arguments, name=name)
        item.update(arguments=arguments, status="completed")
        return out + self.event("response.output_item.done", output_index=index, item=item)

    def end(self) -> str:
        """The stream's last events: the whole response (or the failure)."""
        out = self._begin()
        job = self.job
        if job.error is not None:
            failed = self.fmt.envelope(job, "failed", self.items, None)
            failed["error"] = {"code": "server_error", "message": job.error.message}
            return out + self.event("response.failed", response=failed)
        out += self._close()
        if not self.items:  # an empty answer is an empty message, as a whole one is
            out += self._open("message") + self._close()
        status, details = _status(self.finish)
        whole = self.fmt.envelope(job, status, self.items,
                                  self.fmt.usage(job, self.thoughts))
        whole["incomplete_details"] = details
        self.fmt.keep(job, whole)
        return out + self.event(f"response.{status}", response=whole)
