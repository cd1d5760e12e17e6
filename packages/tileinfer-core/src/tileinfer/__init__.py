"""TileInfer: a small, readable single-GPU LLM inference engine with pluggable op backends.

Start with ``load_model``, ``load_tokenizer`` and ``generate`` or ``ChatSession``; ``pull`` and
``model_dir`` reach the Hugging Face cache; ``get_backend`` / ``list_backends`` the op backends.
"""

from .backends import BackendError, BackendInfo, get_backend, list_backends
from .config import ConfigError, ModelConfig, config_from_dict, load_config
from .rope import rope_tables
from .quant import Int8Weight, quantize_int8
from .weights import WeightsError, load_weights, weight_bytes
from .cache import (ContextLengthError, OutOfPagesError, PagedKVCache, Sequence,
                    calibrate_key_smoothing, key_smoothing_from_calibration, kv_bytes_per_token)
from .step import StepMetadata, prepare_step
from .model import Model, StepBuffers, forward, forward_batch, load_model, max_length
from .sampling import SamplingParams, accept_host, sample_host
from .runner import ModelRunner
from .generate import generate, generate_into
from .tokenizer import TextStream, Tokenizer, load_tokenizer
from .chat_template import ChatMessage, ChatTemplateError, chat_prompt
from .chat import ChatSession, PromptTooLongError, TurnStats
from .generation_config import generation_defaults
from .hub import CachedModel, HubError, list_models, model_dir, pull, remove_model
from .gguf_import import GGUFImportError, import_gguf
from .default_model import DefaultModelUnavailable, default_model_dir
from .speculative import (DFlashDrafter, DFlashProposer, Draft, DraftProposer, NgramProposer,
                          Proposer, SpecStats, load_dflash)
from .memory import memory_report
