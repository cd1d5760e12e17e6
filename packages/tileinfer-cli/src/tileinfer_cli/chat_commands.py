"""The slash commands of ``tileinfer chat``: /help, /reset, /stats, /set, /exit."""

from __future__ import annotations

import dataclasses

from .errors import UserError
from .sampling_options import KNOWN, SAMPLING_FIELDS, parsed

HELP = ("commands: /set KEY VALUE (" + KNOWN + "), /set system TEXT, /set (show), /reset, "
        '/stats, /exit; """ starts and ends a multi-line message; Ctrl-C stops a reply')
EXIT = ("/exit", "/quit", "/bye")


class Commands:
    """What a slash command changes: the session, the answer length (``args.max_new_tokens``),
    the last turn shown by /stats. ``on_reset`` runs after /reset (a new logged conversation).
    A command that cannot be run (unknown, a bad /set) is a UserError and changes nothing: the
    chat says it on standard error, and a piped chat ends there."""

    def __init__(self, session, args, out, on_reset=None):
        self.session, self.args, self.out = session, args, out
        self.last = None
        self.on_reset = on_reset

    def __call__(self, line: str) -> bool:
        """Run the command ``line``; False when it ends the chat."""
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        if word in EXIT:
            return False
        if word in ("/help", "/?"):
            self.say(HELP)
        elif word in ("/reset", "/clear"):
            self.session.reset()
            self.last = None
            if self.on_reset is not None:
                self.on_reset()
            self.say("(conversation cleared)")
        elif word == "/stats":
            self.stats()
        elif word == "/set":
            self.set(rest)
        else:
            raise UserError(f"unknown command {word!r}; {HELP}")
        return True

    def say(self, text: str):
        print(text, file=self.out)

    def stats(self):
        t = self.last
        if t is None:
            self.say("(no turn yet)")
            return
        reused = "the cache rebuilt after a stop string" if t.reused is None else (
            f"reused {t.reused} cached prompt tokens, prefilled {t.prompt_tokens - t.reused}")
        self.say(f"{reused}, generated {len(t.tokens)} at {t.tokens_per_second:.1f} tok/s "
                 f"({t.finish}); {len(self.session.seq)} tokens cached")
        if t.spec is not None:
            self.say(t.spec.summary())

    def settings(self) -> dict:
        s = self.session
        p = s.sampling
        return {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
                "presence_penalty": p.presence_penalty, "frequency_penalty": p.frequency_penalty,
                "repetition_penalty": p.repetition_penalty, "min_p": p.min_p,
                "logit_bias": dict(p.logit_bias), "seed": s.seed,
                "max_tokens": self.args.max_new_tokens, "system": s.system}

    def set(self, rest: str):
        key, _, value = rest.partition(" ")
        if key == "parameter":  # ollama's spelling: /set parameter temperature 0.7
            key, _, value = value.strip().partition(" ")
        value = value.strip()
        if not key:
            self.say("  ".join(f"{k}={v!r}" for k, v in self.settings().items()))
            return
        if key == "system":
            self.set_system(value or None)
            return
        if not value:
            raise UserError(f"/set {key} needs a value")
        attr, checked = parsed(key, value)
        s = self.session
        if attr in SAMPLING_FIELDS:
            s.sampling = dataclasses.replace(s.sampling, **{attr: checked})
        elif attr == "seed":
            s.seed = checked
        else:
            self.args.max_new_tokens = checked
        self.say(f"(set {key.lower().replace('-', '_')} to {checked})")

    def set_system(self, text):
        """A new system message for the rest of the conversation (kept by /reset)."""
        from tileinfer import ChatMessage

        s = self.session
        s.system = text
        messages = [m for m in s.messages if m.role != "system"]
        s.messages = ([ChatMessage("system", text)] if text else []) + messages
        self.say("(system message set)" if text else "(system message removed)")
