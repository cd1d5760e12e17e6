"""What an ``LLMEngine`` holds and has done, as one dict (its ``stats()``, the server's metrics)."""

from __future__ import annotations


def engine_stats(engine) -> dict:
    """Requests and pages now: running, waiting, pages_total / used / cached / free (cached
    pages are unreferenced prefix pages, reusable or evictable), page_size, preemptions,
    prefix-cache hit tokens, steps (pipelined_steps of them launched before the previous
    step's tokens were read), generated tokens, tokens run through the model, graph replays
    and eager steps."""
    alloc, s, runner, prefix = (engine.cache.allocator, engine.scheduler, engine.runner,
                                engine.prefix)
    with engine._inbox_lock:
        queued = sum(kind == "add" for kind, _ in engine._inbox)
    return dict(running=len(s.running), waiting=len(s.waiting) + queued,
                pages_total=engine.num_pages, pages_used=alloc.held - 1,
                pages_cached=alloc.cached, pages_free=alloc.free - alloc.cached,
                page_size=engine.cache.page_size, pool_bytes=engine.cache.nbytes,
                preemptions=s.preemptions,
                prefix_hit_tokens=0 if prefix is None else prefix.hit_tokens,
                prefix_query_tokens=0 if prefix is None else prefix.queried_tokens,
                steps=engine.steps, pipelined_steps=engine.pipelined_steps,
                generated_tokens=engine.generated_tokens, computed_tokens=runner.tokens_run,
                graph_replays=runner.replays, eager_steps=runner.eager_steps,
                static_mixed_steps=runner.mixed_steps)
