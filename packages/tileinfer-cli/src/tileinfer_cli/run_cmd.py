"""``tileinfer run [MODEL] PROMPT``: stream one answer to a prompt."""

from __future__ import annotations

import sys

from .errors import UserError
from .options import (add_model_options, add_sampling_options, add_speculative_options, load,
                      sampling_from)
from .session import new_session


def add_parser(sub):
    p = sub.add_parser("run", help="answer one prompt, streaming the reply")
    p.add_argument("words", nargs="+", metavar="[MODEL] PROMPT",
                   help="the prompt, optionally preceded by the model")
    add_model_options(p)
    add_sampling_options(p)
    add_speculative_options(p)
    p.add_argument("--stats", action="store_true", help="print token counts and speed after")
    p.set_defaults(func=run)


def run(args, out):
    if len(args.words) > 2:
        raise UserError('quote the prompt: tileinfer run [MODEL] "PROMPT"')
    if len(args.words) == 2:
        if args.model:
            raise UserError("give the model either as --model or positionally, not both")
        args.model = args.words[0]
    prompt = args.words[-1]
    model, tokenizer, folder = load(args)
    sampling, stop_ids = sampling_from(args, folder, model.config)
    session, stream = new_session(args, model, tokenizer, sampling, stop_ids, out)
    _, stats = session.reply(prompt, args.max_new_tokens, on_token=stream.put)
    stream.end()
    print(file=out)
    if args.stats:
        print(f"[{stats.prefilled} prompt tokens, {stats.generated} generated, "
              f"{stats.tokens_per_second:.1f} tok/s, backend {model.ops.name}]", file=sys.stderr)
        if stats.spec is not None:
            print(f"[{stats.spec.summary()}]", file=sys.stderr)
    return 0
