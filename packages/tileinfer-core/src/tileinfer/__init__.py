"""TileInfer: a small, readable single-GPU LLM inference engine with pluggable op backends.

Start with ``load_model``, ``load_tokenizer`` and ``generate`` or ``ChatSession``; ``pull`` and
``model_dir`` reach the Hugging Face cache; ``get_backend`` / ``list_backends`` the op backends.

The package is layered (docs/architecture.md): ``backend`` (the op contract and registry) <
``io`` (files and the hub) < ``model`` (config, weights, the decoder) < ``engine`` (cache, runner,
generation, chat, speculation); each imports only the layers before it.
"""

from .backend import (BackendError, BackendInfo, SamplingParams, default_backend_name,
                      get_backend, hookimpl, list_backends)
from .backend.grammar import Grammar, GrammarError, compile_grammar
from .backend.sampling import accept_host, sample_host
from .io import (ChatMessage, ChatTemplateError, DefaultModelUnavailable, GGUFImportError,
                 TextStream, Tokenizer, chat_prompt, default_model_dir, generation_defaults,
                 load_tokenizer, resolve_model_dir)
from .model import (ConfigError, Fp8Weight, Int8Weight, Model, QuantizedWeight, StepBuffers,
                    WeightsError, config_from_dict, load_config, load_model, load_weights,
                    max_length, quantize_fp8, quantize_int8, rope_tables, weight_bytes)
from .engine import (ChatSession, ContextLengthError, DFlashDrafter, DFlashProposer, Draft,
                     DraftProposer, ModelRunner, NgramProposer, OutOfPagesError, PagedKVCache,
                     PromptTooLongError, Proposer, Sequence, SpecStats, StepMetadata, TurnStats,
                     calibrate_key_smoothing, forward, forward_batch, generate, generate_into,
                     key_smoothing_from_calibration, kv_bytes_per_token, load_dflash,
                     memory_report, new_cache, prepare_step, static_metadata)
from .engine import (ModelRuntime, NonFiniteLogitsError, PoolBusyError, runner_for, runtime_of,
                     warm_up)


def __getattr__(name):
    """On first use: the io layer's names that import huggingface_hub or the GGUF reader, and
    the engine's serving names (engine.SERVING)."""
    from . import engine, io

    if name in io.LAZY:
        return getattr(io, name)
    if name in engine.SERVING:
        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
