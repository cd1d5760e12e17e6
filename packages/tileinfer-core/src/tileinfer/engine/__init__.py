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
from .serving.batch import generate_batch
from .serving.batch_runner import BatchRunner
from .serving.engine_process import EngineGone, EngineParts, EngineProcess
from .serving.engine_thread import EngineThread
from .serving.llm_engine import LLMEngine
from .serving.pool import kv_pool_pages
from .serving.request import RequestError, RequestOutput
