"""A job: one completion request's choices, each an engine request, and the events its endpoint
awaits. Everything here runs on the asyncio loop's thread (the bridge hands it the engine's
outputs in batches, one per step or a few steps).

A choice decodes its tokens as they come (``ChoiceText``); a stop string ends it (its engine
request is aborted, its pages freed). Per batch of outputs a streamed job puts one event on its
queue: the new text, log-probabilities and finish reasons of the choices that changed; a job that
is not streamed puts only ``END``, when every choice has finished (or the job failed).

A job has n choices per prompt (a completions request may give several prompts): prompt p's
are choices ``p * n .. p * n + n - 1``. n > 1: each prompt's first choice (its leader) runs
alone until its first token, by which time the prompt's full pages are in the engine's prefix
cache; the prompt's other choices are added then and share those pages instead of prefilling
the prompt again. A prompt's choice j samples with ``prepare.choice_seed(seed, j)``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .errors import APIError, redact
from .text import ChoiceText
from ..reasoning import ReasoningStream
from .tool_output import ToolStream

END = object()  # the last event of a job
log = logging.getLogger("tileinfer.serve")


class Choice:
    __slots__ = ("job", "index", "prompt", "rid", "text", "tokens", "finish_reason", "lps",
                 "lps_sent", "t_last", "changed", "role_sent", "lp_offset", "started", "tools",
                 "echo", "reasoning", "cached", "hidden")

    def __init__(self, job, index, text: ChoiceText):
        self.job, self.index, self.text = job, index, text
        self.prompt = index // job.plan.n  # the plan's prompt it answers
        self.started = False  # it produced output
        self.rid: int | None = None
        self.tokens = 0  # generated tokens counted in usage (up to a stop string's last)
        self.finish_reason: str | None = None
        self.lps: list = []  # (token, logprob, tops) per token
        self.lps_sent = 0
        self.t_last = 0.0
        self.changed = False
        self.role_sent = False
        self.lp_offset = 0  # completions logprobs: text_offset of the next token
        self.cached = 0  # its prompt tokens found in the engine's prefix cache
        self.hidden: list | None = None  # its prompt's last hidden state (embeddings)
        plan = job.plan
        self.echo = "" if plan.echoes is None else plan.echoes[self.prompt]  # not sent yet
        # A streamed answer to a request with tools: its text split into content and calls.
        self.tools = ToolStream(plan.tools, plan.max_tool_calls) \
            if plan.tools is not None and plan.stream else None
        # A streamed answer of a thinking model: its text split into reasoning and content.
        self.reasoning = ReasoningStream(plan.thinking) if plan.reasoning and plan.stream \
            else None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Job:
    def __init__(self, bridge, plan, tokenizer, request_id: str, request=None):
        """request: the validated request (its schema's model), which its answer's format may
        read; ``user`` its end-user id."""
        self.bridge, self.plan, self.id, self.request = bridge, plan, request_id, request
        self.user = getattr(request, "user", None)
        self.created = int(time.time())
        self.arrival = time.perf_counter()
        self.choices = [Choice(self, i, ChoiceText(tokenizer, plan.stops))
                        for i in range(plan.choices)]
        self.events: asyncio.Queue = asyncio.Queue()
        self.started = False  # a choice produced output
        self.deferred = plan.choices - len(plan.prompts)  # choices waiting for their leader
        self.error: APIError | None = None
        self.outcome: str | None = None  # set once, when the job ends
        self.unfinished = plan.choices
        self.ttft: float | None = None  # seconds from arrival to the first token
        self.t_last = 0.0  # when the last token came

    @property
    def done(self) -> bool:
        return self.outcome is not None

    @property
    def completion_tokens(self) -> int:
        return sum(c.tokens for c in self.choices)

    @property
    def cached_tokens(self) -> int:
        """The prompts' tokens the engine found in its prefix cache (each prompt's first
        choice's: the others share its pages, and the usage counts each prompt once)."""
        return sum(c.cached for c in self.leaders)

    def engine_args(self, choice: Choice) -> dict:
        p = self.plan
        return dict(prompt_ids=p.prompts[choice.prompt], sampling=p.sampling,
                    max_new_tokens=p.max_tokens[choice.prompt], stop_ids=p.stop_ids,
                    seed=p.seed_of(choice.index), logprobs=p.logprobs,
                    prompt_logprobs=p.prompt_logprobs, min_new_tokens=p.min_tokens,
                    hidden_state=p.hidden_state)

    @property
    def leaders(self) -> list[Choice]:
        """Each prompt's first choice."""
        return self.choices[::self.plan.n]

    def finish_unrun(self):
        """max_tokens 0: every choice ends at once, empty or its echoed prompt (finish reason
        length)."""
        for c in self.choices:
            self._finish(c, "length")
        self.publish()

    # -- the bridge's calls ---------------------------------------------------------------------

    def on_output(self, choice: Choice, out, t: float, step_began: float):
        """One engine output of one of its choices (tokens, maybe the end); t: when the engine
        handed it over, step_began: about when the step that made it began."""
        if self.done or choice.finished:
            return
        metrics = self.bridge.metrics
        if not self.started:
            self.started = True
            if out.new_tokens:
                self.ttft = t - self.arrival
                metrics.ttft.observe(self.ttft)
                metrics.queue.observe(max(0.0, step_began - self.arrival))
        if not choice.started:
            choice.started = True
            n = self.plan.n
            if n > 1 and choice.index % n == 0 and out.finish_reason not in ("error", "abort"):
                self.bridge.add_choices(self, self.choices[choice.index + 1:choice.index + n])
                if self.done:
                    return
        choice.cached = out.cached_tokens
        if out.hidden_state is not None:
            choice.hidden = out.hidden_state
        if out.prompt_logprobs is not None:  # echo: the prompt's entries come first
            prompt = self.plan.prompts[choice.prompt]
            choice.lps.extend((t, *(e or (None, None))) for t, e in zip(prompt,
                                                                        out.prompt_logprobs))
            choice.changed = True
        if out.new_tokens:
            if choice.t_last:
                metrics.itl.observe(t - choice.t_last)
            choice.t_last = self.t_last = t
            lps = out.logprobs
            for k, token in enumerate(out.new_tokens):
                choice.tokens += 1
                if lps is not None:
                    choice.lps.append((token, *lps[k]))
                if choice.text.add(token):
                    self._finish(choice, "stop", abort=True)
                    break
            metrics.generated_tokens += len(out.new_tokens)
            choice.changed = True
        if out.finished and not choice.finished:
            reason = out.finish_reason
            if reason in ("stop", "length"):
                if choice.text.end():  # the held-back tail completed a stop string
                    reason = "stop"
                self._finish(choice, reason)
            elif reason == "error":
                self.fail(APIError(500, f"generation failed: {redact(str(out.error))}",
                                   "server_error"), "error")
            else:  # "abort": not by this job (it forgets its requests when it aborts them)
                self.fail(APIError(503, "the request was aborted by the server",
                                   "server_error"), "abort")

    def publish(self):
        """After a batch of outputs: an event for the endpoint, and END when all finished."""
        if self.done and self.outcome != "finished":
            return
        if self.plan.stream:
            changed = [c for c in self.choices if c.changed]
            if changed:
                deltas = []
                for c in changed:
                    c.changed = False
                    lps = c.lps[c.lps_sent:]
                    c.lps_sent = len(c.lps)
                    text, c.echo = c.echo + c.text.take(), ""
                    deltas.append((c, text, lps, c.finish_reason))
                self.events.put_nowait(deltas)
        if self.unfinished == 0:
            self.events.put_nowait(END)

    def fail(self, error: APIError, outcome: str):
        """End the job with an error (the endpoint answers it); aborts what still runs."""
        if self.done:
            return
        self.error = error
        self._end(outcome)
        self.events.put_nowait(END)

    def close(self):
        """The endpoint is done with the job (answered, or the client went away): abort what
        still runs. Called in every case; only the first call of close or fail counts."""
        if not self.done:
            self._end("abort")

    # -- inside ---------------------------------------------------------------------------------

    def _finish(self, choice: Choice, reason: str, abort: bool = False):
        choice.finish_reason = reason
        choice.changed = True
        self.unfinished -= 1
        self.bridge.forget(choice, abort=abort)
        if self.unfinished == 0:
            self._end("finished")

    def _end(self, outcome: str):
        self.outcome = outcome
        for c in self.choices:
            if not c.finished:
                self.bridge.forget(c, abort=True)
        self.bridge.job_ended(self)
        m = self.bridge.metrics
        reasons = ",".join(sorted({c.finish_reason or outcome for c in self.choices}))
        if outcome == "finished":
            m.outcome(self.choices[0].finish_reason)
            m.e2e.observe(self.t_last - self.arrival if self.t_last else
                          time.perf_counter() - self.arrival)
        else:
            m.outcome(outcome)
        if log.isEnabledFor(logging.INFO):
            ttft = f"{self.ttft:.3f} s" if self.ttft is not None else "-"
            log.info("%s%s: %d prompt + %d output tokens, TTFT %s, %.3f s, %s", self.id,
                     f" (user {self.user!r})" if self.user else "", self.plan.prompt_tokens,
                     self.completion_tokens, ttft, time.perf_counter() - self.arrival,
                     reasons if outcome == "finished" else outcome)
