"""The io layer: what comes from and goes to files and the hub (tokenizer, chat templates,
generation config, pulling and importing models, the embedded default model, paths). It imports
the backend layer only (for ``SamplingParams``)."""

from .chat_template import ChatMessage, ChatTemplateError, chat_prompt
from .default_model import DefaultModelUnavailable, default_model_dir
from .generation_config import generation_defaults, sampling_settings
from .import_record import GGUFImportError
from .import_staging import clean_interrupted_imports
from .local_models import (LocalModel, LocalModelError, list_local_models, local_model_dir,
                           remove_local_model)
from .model_dir import resolve_model_dir
from .tokenizer import TextStream, Tokenizer, load_tokenizer

# Imported on first use: huggingface_hub (the hub) and the GGUF reader with numpy (importing)
# take longer to import than everything else here, and most runs need neither.
LAZY = {"import_gguf": "gguf_import", "CachedModel": "hub", "HubError": "hub",
        "list_models": "hub", "model_dir": "hub", "pull": "hub", "pull_gguf": "hub",
        "remove_model": "hub"}


def __getattr__(name):
    module = LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)
