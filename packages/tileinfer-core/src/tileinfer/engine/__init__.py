"""The engine layer: running a loaded model. It imports the model, backend and io layers.

    kv/          the paged KV cache, its page allocator, prefix cache, and step metadata
    runtime/     what a model keeps between calls: its KV pool, static steps, CUDA graphs
    generation/  one sequence: the runner, generate, chat sessions, speculative decoding
    serving/     many requests: the LLMEngine, its scheduler, batched runner and requests
"""

from .generation.calibration import calibrate_key_smoothing, key_smoothing_from_calibration
from .generation.chat import ChatSession, PromptTooLongError, TurnStats
from .generation.forward import forward, forward_batch
from .generation.generate import generate, generate_into
from .generation.runner import ModelRunner, runner_for
from .generation.warm_up import warm_up
from .generation.speculative import (DFlashDrafter, DFlashProposer, Draft, DraftProposer,
                                     NgramProposer, Proposer, SpecStats, load_dflash)
from .kv.cache import (ContextLengthError, OutOfPagesError, PagedKVCache, Sequence,
                       kv_bytes_per_token, new_cache)
from .kv.step import StepMetadata, prepare_step, static_metadata
from .memory import memory_report
from .runtime.finite import NonFiniteLogitsError
from .runtime.runtime import ModelRuntime, PoolBusyError, runtime_of

# The serving names, by module of serving/: imported on first use (``__getattr__``), so that a
# process that runs one sequence at a time (`tileinfer run`, `chat`) never imports the engine.
SERVING = {"generate_batch": "batch", "BatchRunner": "batch_runner",
           "EngineGone": "engine_process", "EngineParts": "engine_process",
           "EngineProcess": "engine_process", "EngineThread": "engine_thread",
           "LLMEngine": "llm_engine", "kv_pool_pages": "pool", "RequestError": "request",
           "RequestOutput": "request"}


def __getattr__(name):
    module = SERVING.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".serving.{module}", __name__), name)
