"""Building a ChatSession and its stream printer from the command's options."""

from __future__ import annotations

from .options import kv_cache_from, speculative_from


def new_session(args, model, tokenizer, sampling, stop_ids, out):
    from tileinfer import ChatSession, TextStream

    kv_cache, key_smoothing = kv_cache_from(args, model)
    session = ChatSession(model, tokenizer, sampling=sampling, stop_ids=stop_ids,
                          enable_thinking=args.thinking, max_tokens=args.max_len,
                          kv_cache=kv_cache, key_smoothing=key_smoothing, seed=args.seed,
                          system=getattr(args, "system", None),
                          speculative=speculative_from(args, model, sampling))
    return session, TextStream(tokenizer, out)
