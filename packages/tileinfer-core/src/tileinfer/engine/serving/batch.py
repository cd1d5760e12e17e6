"""generate_batch: many prompts through one ``LLMEngine``, for offline use."""

from __future__ import annotations

from ...backend.sampling import SamplingParams
from ..arguments import token_ids
from .llm_engine import DEFAULT_MAX_RUNNING, LLMEngine
from .request import ERROR


def generate_batch(model, prompts, sampling: SamplingParams | list = SamplingParams(),
                   max_new_tokens: int | list = 256, stop_ids=None, seeds=None,
                   **engine_kwargs) -> list[list[int]]:
    """Each prompt's new tokens (without the stop token), in prompt order, generated together
    with continuous batching. Request i equals ``tileinfer.generate(model, prompts[i], ...,
    seed=seeds[i])`` (exactly so on the CPU in float32).

    sampling, max_new_tokens, seeds: one value for every prompt or a list of one per prompt
    (seeds None: random seeds; one int: that seed for every prompt). stop_ids: the model's EOS
    ids by default. engine_kwargs go to ``LLMEngine`` (num_pages, max_running, ...); on the CPU
    the pool holds every request's full length unless num_pages or cpu_tokens is given.
    RuntimeError naming the first failed request if a step failed; TypeError or ValueError,
    before any engine is made, for a prompt or stop id that is not a token id.
    """
    vocab = model.config.vocab_size
    prompts = [token_ids(p, f"prompts[{i}]", vocab) for i, p in enumerate(prompts)]
    if stop_ids is not None:
        stop_ids = token_ids(stop_ids, "stop_ids", vocab)
    n = len(prompts)

    def per_prompt(value, name):
        if isinstance(value, (list, tuple)):
            if len(value) != n:
                raise ValueError(f"{name}: {len(value)} values for {n} prompts")
            return list(value)
        return [value] * n

    samplings = per_prompt(sampling, "sampling")
    max_news = per_prompt(max_new_tokens, "max_new_tokens")
    seed_list = per_prompt(seeds, "seeds")
    if not n:
        return []
    if n <= engine_kwargs.get("max_running", DEFAULT_MAX_RUNNING):
        # One wave: every prompt is admitted at the first steps, so no later step mixes
        # prefill chunks with decode rows. A static mixed step would only serve those first
        # steps, once per call, and capturing one (at its shape's second use) costs more than
        # it saves: they run eagerly on their own shapes.
        engine_kwargs.setdefault("static_mixed", False)
    if model.device.type != "cuda" and "num_pages" not in engine_kwargs:
        engine_kwargs.setdefault("cpu_tokens", sum(len(p) + m for p, m in zip(prompts, max_news)
                                                   if isinstance(m, int)) or 1)
    engine = LLMEngine(model, **engine_kwargs)
    try:
        ids = [engine.add_request(p, s, m, stop_ids, seed)
               for p, s, m, seed in zip(prompts, samplings, max_news, seed_list)]
        index = {rid: i for i, rid in enumerate(ids)}
        results: list[list[int]] = [[] for _ in prompts]
        errors: dict[int, str] = {}
        while engine.has_unfinished():
            for out in engine.step():
                results[index[out.request_id]].extend(out.new_tokens)
                if out.finish_reason == ERROR:
                    errors[index[out.request_id]] = out.error
        if errors:
            first = min(errors)
            raise RuntimeError(f"request {first} (of {n}) failed: {errors[first]}")
        return results
    finally:
        engine.close()
