"""The engine layer: the paged KV cache, step metadata, the model runner (static buffers, CUDA
graphs, pipelined decoding), generation, chat sessions and speculative decoding. It imports the
model, backend and io layers."""

from .cache import (ContextLengthError, OutOfPagesError, PagedKVCache, Sequence, kv_bytes_per_token,
                    new_cache)
from .calibration import calibrate_key_smoothing, key_smoothing_from_calibration
from .chat import ChatSession, PromptTooLongError, TurnStats
from .forward import forward, forward_batch
from .generate import generate, generate_into
from .memory import memory_report
from .runner import ModelRunner
from .speculative import (DFlashDrafter, DFlashProposer, Draft, DraftProposer, NgramProposer,
                          Proposer, SpecStats, load_dflash)
from .step import StepMetadata, prepare_step, static_metadata
from .batch import generate_batch
from .batch_runner import BatchRunner
from .engine_thread import EngineThread
from .llm_engine import LLMEngine
from .pool import kv_pool_pages
from .request import RequestError, RequestOutput
