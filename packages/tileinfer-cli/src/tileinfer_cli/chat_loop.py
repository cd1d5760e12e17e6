"""The turns of ``tileinfer chat``: read a message or a command, answer it, log the turn; and
what a line that fails does.

A line fails when it cannot be run: an unknown command, a bad ``/set``, a message longer than
the room left, text that is not UTF-8, input that ends inside a \"\"\" block, a turn that raises.
It changes nothing: the conversation stays as it was before it. Its error goes to standard
error. At a terminal the chat goes on. Piped in, the chat ends there with the error's exit code
(2 for a mistake): a script learns that a turn failed, and its later messages, which were
written to follow the answer that did not come, are not sent. The turns before it are logged,
so ``tileinfer chat --continue`` goes on from the failed line.
"""

from __future__ import annotations

import random
import sys

from .chat_commands import Commands
from .chat_input import read_turn
from .cli_words import in_cli_words
from .errors import UserError
from .log_record import options_of
from .logs import new_conversation_id
from .options import draw_seed
from .session import chat_turn


class ChatLoop:
    def __init__(self, session, args, stops, log, state, reader, console, out, model_name):
        self.session, self.args, self.stops, self.log = session, args, stops, log
        self.state, self.reader, self.console, self.out = state, reader, console, out
        self.model_name = model_name
        self.commands = Commands(session, args, out, on_reset=self.new_conversation)

    def new_conversation(self):
        self.state["cid"] = new_conversation_id()

    def run(self):
        """Turns until /exit or the end of the input; a UserError (or the turn's exception)
        when a piped line fails."""
        while True:
            first_line = getattr(self.reader, "lines", 0) + 1  # piped input counts its lines
            try:
                text = read_turn(self.reader.read_line).strip()
            except (EOFError, KeyboardInterrupt):
                if self.console is not None:
                    print(file=self.console)
                return
            except UserError as e:
                self.failed(e, first_line)
                continue
            if not text:
                continue
            try:
                if text.startswith("/"):
                    if not self.commands(text):
                        return
                else:
                    self.answer(text)
            except KeyboardInterrupt:
                print("\n(stopped; the conversation is as before this message)", file=self.out)
            except BrokenPipeError:
                raise
            except UserError as e:
                self.failed(e, first_line)
            except Exception as exc:  # a failed turn leaves the session as it was before it
                print(file=self.out)  # after whatever part of the reply was written
                if self.console is None:
                    raise
                self.say(exc)

    def failed(self, error: UserError, line: int):
        if self.console is None:
            raise UserError(f"line {line}: {error}") from None
        self.say(error)

    @staticmethod
    def say(error: Exception):
        """An error at a terminal, which the chat goes on after."""
        print(f"tileinfer: error: {in_cli_words(str(error))}", file=sys.stderr)

    def answer(self, text: str):
        s, args = self.session, self.args
        if s.seed is None and s.sampling.temperature > 0:
            s.seed = draw_seed(random)  # drawn here (not in generate) so that the log can say it
        turn_seed = s.turn_seed()
        turn = self.commands.last = chat_turn(s, text, args.max_new_tokens, self.stops, self.out,
                                              args.hide_thinking)
        print(file=self.out)
        self.out.flush()
        self.log.write(self.state["cid"], model=self.model_name, backend=s.model.ops.name,
                       system=s.system, prompt=text, answer=turn.text,
                       options=options_of(args, s.sampling, self.stops, s.seed, turn_seed),
                       prompt_tokens=turn.prompt_tokens, answer_tokens=len(turn.tokens),
                       time_to_first_token=turn.time_to_first_token, seconds=turn.seconds,
                       finish_reason=turn.finish)
        if turn.finish == "context":
            print(f"(the reply was cut: the conversation filled the {s.max_tokens} tokens of "
                  "--max-len; /reset starts over, or start the chat again with a larger "
                  "--max-len)", file=self.out)
