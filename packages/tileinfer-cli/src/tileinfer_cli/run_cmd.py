"""``tileinfer run [MODEL] PROMPT``: stream one answer to a prompt."""

from __future__ import annotations

import sys
import time

from .errors import UserError
from .options import (add_model_options, add_sampling_options, add_speculative_options,
                      kv_cache_from, load, sampling_from, speculative_from)


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
    from tileinfer import ChatMessage, SpecStats, TextStream, chat_prompt, generate

    template_kwargs = {} if args.thinking is None else {"enable_thinking": args.thinking}
    text = chat_prompt(folder, [ChatMessage("user", prompt)], add_generation_prompt=True,
                       **template_kwargs)
    ids = tokenizer.encode(text, add_special_tokens=False)
    room = model.max_len - len(ids)
    if room < 1:
        raise UserError(f"the prompt is {len(ids)} tokens; --max-len {model.max_len} leaves no "
                        "room for an answer")
    kv_cache, key_smoothing = kv_cache_from(args, model)
    speculative = speculative_from(args, model)
    spec = SpecStats() if speculative is not None else None
    stream = TextStream(tokenizer, out)
    start = time.perf_counter()
    new = generate(model, ids, min(args.max_new_tokens, room), sampling, stop_ids=stop_ids,
                   seed=args.seed, on_token=stream.put, kv_quantize=kv_cache,
                   key_smoothing=key_smoothing, speculative=speculative, spec_stats=spec)
    seconds = time.perf_counter() - start
    stream.end()
    print(file=out)
    if args.stats:
        print(f"[{len(ids)} prompt tokens, {len(new)} generated, "
              f"{len(new) / seconds if seconds > 0 else 0.0:.1f} tok/s, backend "
              f"{model.ops.name}]", file=sys.stderr)
        if spec is not None:
            print(f"[{spec.summary()}]", file=sys.stderr)
    return 0
