"""The served engine: the model's weights and its ``LLMEngine``, built in a process of its own
(``tileinfer.EngineProcess``: the default) or on a thread of the server's process
(``--no-engine-process``).

The HTTP side (parsing, templates, detokenizing, streams) and the engine's step loop are both
Python; in one process they take turns on the GIL, which slowed every step under hundreds of
streams (benchmarks/RESULTS.md, 2026-12-03, "256 clients against the offline engine"). In its own
process the engine steps as it does offline, and the server's process never touches the GPU.
"""

from __future__ import annotations

from ..errors import UserError
from ..options import kv_cache_from
from .loading import load_weights, prepare_grammars


def new_engine(args, folder):
    """The model's LLMEngine as the server's options ask."""
    from tileinfer import LLMEngine

    model = load_weights(args, folder)
    kv_quantize, key_smoothing = kv_cache_from(args, model)
    return LLMEngine(model, max_running=args.max_running, max_step_tokens=args.max_step_tokens,
                     prefix_caching=not args.no_prefix_caching, kv_quantize=kv_quantize,
                     key_smoothing=key_smoothing, memory_fraction=args.memory_fraction,
                     cpu_tokens=args.kv_tokens)


def engine_parts(args, folder):
    """The engine process's build (run in the child): the engine, its CUDA graphs captured, and
    the tokenizer its requests' grammars are for."""
    from tileinfer import EngineParts, load_tokenizer

    engine = new_engine(args, folder)
    engine.warmup()
    tokenizer = load_tokenizer(folder)
    prepare_grammars(tokenizer)
    return EngineParts(engine, tokenizer, {"backend": engine.model.ops.name})


def start_engine(args, served):
    """The served engine (an EngineProcess, or an LLMEngine with --no-engine-process), warmed
    up, and served with its limits."""
    if args.no_engine_process:
        engine = new_engine(args, served.folder)
        served.with_engine(engine.model.max_len, engine.model.config.vocab_size,
                           engine.model.ops.name)
        return engine
    from tileinfer import EngineProcess

    try:
        process = EngineProcess(engine_parts, (args, served.folder)).start()
    except RuntimeError as e:
        raise UserError(str(e)) from None
    served.with_engine(process.limits["max_len"], process.limits["vocab_size"],
                       process.info["backend"])
    return process
