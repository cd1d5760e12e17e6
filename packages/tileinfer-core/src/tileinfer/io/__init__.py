"""The io layer: what comes from and goes to files and the hub (tokenizer, chat templates,
generation config, pulling and importing models, the embedded default model, paths). It imports
the backend layer only (for ``SamplingParams``)."""

from .chat_template import ChatMessage, ChatTemplateError, chat_prompt
from .default_model import DefaultModelUnavailable, default_model_dir
from .generation_config import generation_defaults, sampling_settings
from .gguf_import import GGUFImportError, import_gguf
from .import_staging import clean_interrupted_imports
from .hub import CachedModel, HubError, list_models, model_dir, pull, remove_model
from .local_models import (LocalModel, LocalModelError, list_local_models, local_model_dir,
                           remove_local_model)
from .model_dir import resolve_model_dir
from .tokenizer import TextStream, Tokenizer, load_tokenizer
