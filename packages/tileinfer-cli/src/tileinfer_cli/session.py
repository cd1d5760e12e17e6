"""Building a ChatSession from the command's options, and one chat turn with ``--stop`` strings
and a note when the context is full."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .errors import UserError
from .options import kv_cache_from, speculative_from, warm_up_on_gpu
from .reasoning import HiddenThinking, prompt_is_thinking
from .stops import StopStringFound, StopWriter


def new_session(args, model, tokenizer, sampling, stop_ids, template=None):
    from tileinfer import ChatSession

    kv_cache, key_smoothing = kv_cache_from(args, model)
    speculative = speculative_from(args, model, sampling)
    warm_up_on_gpu(model, sampling, kv_cache, key_smoothing, speculative)
    return ChatSession(model, tokenizer, sampling=sampling, stop_ids=stop_ids,
                       enable_thinking=args.thinking, max_tokens=args.max_len,
                       kv_cache=kv_cache, key_smoothing=key_smoothing, seed=args.seed,
                       system=getattr(args, "system", None), template=template,
                       speculative=speculative)


class ContextFull(UserError):
    """The conversation and a new message no longer fit the session's positions (the
    conversation is left as it was)."""

    def __init__(self, tokens: int, limit: int):
        super().__init__(f"the conversation is {tokens} tokens with this message, more than "
                         f"the {limit} of --max-len: /reset starts over, or start the chat "
                         "again with a larger --max-len")


@dataclass
class Turn:
    """One turn's outcome. finish: "stop" (an end token or a --stop string), "length"
    (--max-new-tokens) or "context" (the context filled up); reused is None for a turn that a
    stop string ended (the session recomputes its cache at the next turn)."""

    text: str
    tokens: list
    prompt_tokens: int
    reused: int | None
    finish: str
    stop: str | None
    seconds: float
    time_to_first_token: float | None
    spec: object = None

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


def chat_turn(session, text: str, max_new_tokens: int, stops, out,
              hide_thinking: bool = False) -> Turn:
    """Answer ``text`` in ``session``, streaming the reply to ``out`` up to a stop string
    (hide_thinking: without a thinking model's <think> reasoning; the conversation keeps it,
    for the template to drop or show).

    ChatSession rolls a turn back when the token callback raises, so a turn that a stop string
    ends is added here: the user message and the reply up to the stop string."""
    from tileinfer import ChatMessage, TextStream

    messages = session.messages + [ChatMessage("user", text)]
    ids = session.prompt_ids(messages)
    prompt = len(ids)
    if prompt + 1 > session.max_tokens:
        raise ContextFull(prompt, session.max_tokens)
    room = session.max_tokens - prompt
    shown = None
    if hide_thinking:  # the prompt's end says whether the template opened the thinking
        tail = session.tokenizer.decode(ids[-32:], skip_special_tokens=False)
        shown = HiddenThinking(out, prompt_is_thinking(tail))
    writer = StopWriter(stops, shown or out)
    stream = TextStream(session.tokenizer, writer)
    tokens, first = [], []
    start = time.perf_counter()

    def on_token(token):
        if not first:
            first.append(time.perf_counter() - start)
        tokens.append(token)
        stream.put(token)

    stats, reply = None, None
    try:
        reply, stats = session.reply(text, max_new_tokens, on_token=on_token)
        stream.end()
    except StopStringFound:
        session.messages = messages + [ChatMessage("assistant", writer.text)]
        session.turns += 1
    finally:
        writer.end()
        if shown is not None:
            shown.end()
    limit = min(max_new_tokens, room)
    if writer.found is not None or len(tokens) < limit:
        finish = "stop"
    else:
        finish = "context" if room < max_new_tokens else "length"
    return Turn(writer.text if reply is None else reply, tokens, prompt, stats.reused if stats else None, finish,
                writer.found, time.perf_counter() - start, first[0] if first else None,
                stats.spec if stats else None)


def replay(session, rows, system=None):
    """Put a logged conversation (``rows``, oldest first) into ``session``: its system message
    (unless ``system`` replaces it) and each prompt and answer; the next turn prefills them once
    and later turns reuse them from the cache."""
    from tileinfer import ChatMessage

    session.system = system if system is not None else rows[0]["system"]
    messages = [ChatMessage("system", session.system)] if session.system else []
    for r in rows:
        messages += [ChatMessage("user", r["prompt"]), ChatMessage("assistant", r["answer"])]
    session.messages = messages
