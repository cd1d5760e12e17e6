"""Building a ChatSession and its stream printer from the command's options."""

from __future__ import annotations

from .options import speculative_from


def new_session(args, model, tokenizer, sampling, stop_ids, out):
    from tileinfer import ChatSession, TextStream

    kv_cache = None if args.kv_cache == "bf16" else "int8"
    key_smoothing = None
    if args.kv_cache == "int8-smooth":
        from tileinfer.cache import calibrate_key_smoothing

        key_smoothing = calibrate_key_smoothing(model)
    session = ChatSession(model, tokenizer, sampling=sampling, stop_ids=stop_ids,
                          enable_thinking=args.thinking, max_tokens=args.max_len,
                          kv_cache=kv_cache, key_smoothing=key_smoothing, seed=args.seed,
                          speculative=speculative_from(args, model))
    return session, TextStream(tokenizer, out)
