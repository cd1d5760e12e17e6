"""``tileinfer chat [MODEL]``: an interactive conversation.

On a terminal the line is edited with the arrow keys and kept in a history (Up recalls earlier
messages); a paste of several lines is one message, and so is a block between two \"\"\" lines.
Commands: /set KEY VALUE changes a sampling option (temperature, top_p, top_k, seed,
max_tokens), /set system TEXT the system message, /reset clears the conversation, /stats shows
the last turn's statistics, /help lists them, /exit quits. Ctrl-C while the model replies stops
the reply and keeps the conversation as it was before it; Ctrl-C or Ctrl-D at the prompt quits.
Errors go to standard error, and a line that fails changes nothing.
Piped in (not a terminal), each line is a message and no prompt is written; the first line that
fails (an unknown command, a bad /set, a message that does not fit) ends the chat with its error
and a non-zero exit code (2 for a mistake), the later lines unsent; the turns before it are
logged, so --continue goes on from there.
"""

from __future__ import annotations

from .chat_commands import HELP
from .chat_input import open_input
from .chat_loop import ChatLoop
from .cuda_start import start_cuda_in_background
from .errors import UserError
from .log_record import continued_model, model_reference
from .logs import Log, add_log_flag, conversation, new_conversation_id
from .options import add_model_options, add_sampling_options, add_speculative_options, load, \
    sampling_from
from .session import new_session, replay
from .templates import add_template_options, check_template_options, template_from
from .text_input import checked_text
from .thinking_switch import check_thinking_switch

EPILOG = """\
examples:
  tileinfer chat
  tileinfer chat Qwen/Qwen3-0.6B --no-think
  tileinfer chat -m SmolLM2-135M-Instruct --system "You are a pirate." --temperature 0.8
  tileinfer chat -o temperature 0.7 -o top_p 0.9 --stop "User:"
  printf 'Hi\\n/set temperature 0\\nName a colour\\n' | tileinfer chat
  tileinfer chat --continue                   go on with the latest logged conversation, with
                                              its model
  tileinfer chat -c -m Qwen/Qwen3-0.6B        go on with it, answered by another model
"""


def add_parser(sub, formatter):
    p = sub.add_parser("chat", help="chat interactively (/set, /reset, /stats, /exit)",
                       description=__doc__.split("\n\n", 1)[1], epilog=EPILOG,
                       formatter_class=formatter)
    p.add_argument("model_pos", nargs="?", metavar="MODEL", help="model (or use --model)")
    p.add_argument("--system", "-s", metavar="TEXT", help="a system message that starts the "
                   "conversation (kept by /reset)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end a reply where the model writes TEXT (not printed; repeatable)")
    resume = p.add_mutually_exclusive_group()
    resume.add_argument("--continue", "-c", dest="continue_", action="store_true",
                        help="go on with the latest logged conversation, with the model of its "
                             "latest turn unless MODEL or --model names another (as llm -c)")
    resume.add_argument("--cid", metavar="ID",
                        help="go on with the logged conversation ID (tileinfer logs shows ids), "
                             "with its model as --continue")
    add_log_flag(p)
    add_template_options(p, raw=False)
    add_model_options(p)
    add_sampling_options(p)
    add_speculative_options(p)
    p.set_defaults(func=run)


def run(args, out):
    if args.model and args.model_pos:
        raise UserError("give the model either as --model or positionally, not both")
    args.model = args.model or args.model_pos
    if args.system is not None:
        checked_text(args.system, "--system")
    stops = [checked_text(s, "--stop") for s in args.stop]
    if any(not s for s in stops):
        raise UserError("--stop needs a non-empty text")
    check_template_options(args)
    resuming = args.continue_ or args.cid is not None
    if resuming:  # before loading: an unknown id is one line at once
        cid, rows = conversation(args.cid)
        if args.model is None:
            args.model = continued_model(cid, rows)
    check_thinking_switch(args)
    start_cuda_in_background(args.backend)
    model, tokenizer, folder = load(args)
    sampling, stop_ids = sampling_from(args, folder, model.config)
    session = new_session(args, model, tokenizer, sampling, stop_ids,
                          template=template_from(args, folder))
    log, state = Log(args, "chat"), {"cid": cid if resuming else new_conversation_id()}
    if resuming:
        replay(session, rows, args.system)
    reader, console = open_input()
    if console is not None:
        print(f"{folder.name} on {model.ops.name} ({model.device}). {HELP}", file=console)
        if resuming:
            print(f"(conversation {state['cid']}: {len(rows)} earlier turns)", file=console)
    ChatLoop(session, args, stops, log, state, reader, console, out,
             model_reference(args.model, folder)).run()
    return 0
