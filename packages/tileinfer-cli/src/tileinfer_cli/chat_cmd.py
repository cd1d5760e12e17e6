"""``tileinfer chat [MODEL]``: an interactive conversation.

Commands: /reset clears the conversation, /stats shows the last turn's statistics, /exit quits.
Ctrl-C while the model replies stops the reply and keeps the conversation as it was before it;
Ctrl-C or end of input at the prompt quits.
"""

from __future__ import annotations

import sys

from .errors import UserError
from .options import (add_model_options, add_sampling_options, add_speculative_options, load,
                      sampling_from)
from .session import new_session
from .text_input import checked_text, decoded

HELP = "commands: /reset  /stats  /exit   (Ctrl-C stops a reply)"

EPILOG = """\
examples:
  tileinfer chat
  tileinfer chat Qwen/Qwen3-0.6B --no-think
  tileinfer chat -m SmolLM2-135M-Instruct --system "You are a pirate." --temperature 0.8
"""


def add_parser(sub, formatter):
    p = sub.add_parser("chat", help="chat interactively (/reset, /stats, /exit)",
                       description=__doc__.split("\n\n", 1)[1], epilog=EPILOG,
                       formatter_class=formatter)
    p.add_argument("model_pos", nargs="?", metavar="MODEL", help="model (or use --model)")
    p.add_argument("--system", "-s", metavar="TEXT", help="a system message that starts the "
                   "conversation (kept by /reset)")
    add_model_options(p)
    add_sampling_options(p)
    add_speculative_options(p)
    p.set_defaults(func=run)


def _read(prompt, out):
    out.write(prompt)
    out.flush()
    line = sys.stdin.buffer.readline()
    if not line:
        raise EOFError
    return decoded(line, "the line").rstrip("\r\n")


def run(args, out):
    if args.model and args.model_pos:
        raise UserError("give the model either as --model or positionally, not both")
    args.model = args.model or args.model_pos
    if args.system is not None:
        checked_text(args.system, "--system")
    model, tokenizer, folder = load(args)
    sampling, stop_ids = sampling_from(args, folder, model.config)
    session, stream = new_session(args, model, tokenizer, sampling, stop_ids, out)
    print(f"{folder.name} on {model.ops.name} ({model.device}). {HELP}", file=out)
    last = None
    while True:
        try:
            text = _read(">>> ", out).strip()
        except (EOFError, KeyboardInterrupt):
            print(file=out)
            return 0
        except UserError as e:  # a line that is not UTF-8: say so, keep the conversation
            print(f"tileinfer: error: {e}", file=sys.stderr)
            continue
        if not text:
            continue
        if text in ("/exit", "/quit", "/bye"):
            return 0
        if text == "/reset":
            session.reset()
            print("(conversation cleared)", file=out)
            continue
        if text == "/stats":
            if last is None:
                print("(no turn yet)", file=out)
            else:
                print(f"reused {last.reused} cached prompt tokens, prefilled {last.prefilled}, "
                      f"generated {last.generated} at {last.tokens_per_second:.1f} tok/s; "
                      f"{len(session.seq)} tokens cached", file=out)
                if last.spec is not None:
                    print(last.spec.summary(), file=out)
            continue
        if text.startswith("/"):
            print(f"unknown command {text!r}; {HELP}", file=out)
            continue
        try:
            _, last = session.reply(text, args.max_new_tokens, on_token=stream.put)
            stream.end()
            print(file=out)
        except KeyboardInterrupt:
            stream.end()
            print("\n(stopped; the conversation is as before this message)", file=out)
        except Exception as exc:  # a failed turn leaves the session usable
            stream.end()
            print(f"\nerror: {exc}", file=out)
