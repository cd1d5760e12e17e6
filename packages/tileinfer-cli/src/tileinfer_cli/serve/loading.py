"""The served model: one per server process, chosen at start (no request names a file or a model
to load).

``--load-format dummy`` builds random weights of the folder's config shape instead of reading
its weights (``tileinfer.model.random_weights.random_model``, seed 0), as other engines' "dummy"
load format: a benchmarking aid for serving loads without the checkpoint (the folder needs its
config.json and tokenizer.json only). The answers are noise.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..options import quantize_of, resolve_dtype, resolve_quantize, set_threads
from .defaults import SamplingDefaults
from .template import ServedTemplate


@dataclass
class ServedModel:
    """What the HTTP side knows of the served model (the weights are the engine's, which may
    run in a process of its own)."""

    name: str  # the id clients name in "model" and /v1/models lists
    folder: Path
    tokenizer: object  # tileinfer.Tokenizer
    defaults: object  # SamplingDefaults: what requests that leave sampling out get
    template: object  # ServedTemplate: the chat template, read at start-up
    stop_ids: list[int]  # the model's end-of-sequence ids
    dummy: bool
    tool_parser: object = None  # tool_parsers.ToolParser of its tool-call format, or None
    reasoning: bool = False  # split answers' <think> reasoning from their content (../reasoning.py)
    max_len: int = 0  # the engine's, set once it is built (with_engine)
    vocab_size: int = 0
    backend: str = ""
    hidden_size: int = 0  # its embeddings' length (0: not known)
    model_type: str = ""  # config.json's

    def with_engine(self, max_len: int, vocab_size: int, backend: str) -> "ServedModel":
        self.max_len, self.vocab_size, self.backend = max_len, vocab_size, backend
        return self


def load_dummy(folder: Path, dtype, backend: str, max_len: int | None, quantize, allow_long: bool,
               batch_invariant: bool = False, rope_scaling: dict | None = None):
    """A model of folder's config shape (rope_scaling: load_config's) with random weights (seed
    0)."""
    from tileinfer import get_backend, load_config
    from tileinfer.model.config import check_max_len, default_max_len
    from tileinfer.model.loader import default_device
    from tileinfer.model.random_weights import random_model

    config = load_config(folder, rope_scaling)
    if max_len is None:
        max_len = default_max_len(config)
    check_max_len(config, max_len, allow_long)
    device = default_device(get_backend(backend))
    return random_model(config, dtype=dtype, backend=backend, device=device, quantize=quantize,
                        max_len=max_len, seed=0, batch_invariant=batch_invariant)


def load_served(args) -> ServedModel:
    """Everything of the served model but its weights: the tokenizer, the chat template, the
    sampling defaults (the engine's limits come with_engine)."""
    from tileinfer import generation_defaults, load_config, load_tokenizer, resolve_model_dir

    folder = resolve_model_dir(args.model)
    tokenizer = load_tokenizer(folder)
    prepare_grammars(tokenizer)
    config = load_config(folder)
    _, stop_ids = generation_defaults(folder, config)
    try:
        defaults = SamplingDefaults.of_folder(folder)
    except ValueError as e:
        raise UserError(str(e)) from None
    name = args.served_model_name or (args.model if args.model and not Path(args.model).exists()
                                      else folder.name)
    template = ServedTemplate(folder)
    return ServedModel(name, folder, tokenizer, defaults, template, list(stop_ids),
                       args.load_format == "dummy",
                       served_tool_parser(args.tool_parser, template, tokenizer),
                       served_reasoning(getattr(args, "reasoning_parser", "auto"), template,
                                        tokenizer), hidden_size=config.hidden_size,
                       model_type=config.model_type)


def load_weights(args, folder: Path):
    """The served model (tileinfer.Model): the folder's weights, or random ones (dummy)."""
    from tileinfer import load_model
    from tileinfer.backend import default_backend_name

    set_threads(args)
    backend = args.backend or default_backend_name()
    dtype = resolve_dtype(args.dtype, backend)
    if args.load_format == "dummy":
        return load_dummy(folder, dtype, backend, args.max_len, quantize_of(args),
                          args.allow_long_context, args.deterministic, args.rope_scaling)
    return load_model(folder, dtype=dtype, backend=backend, max_len=args.max_len,
                      quantize=resolve_quantize(args, folder, backend),
                      allow_long=args.allow_long_context, batch_invariant=args.deterministic,
                      rope_scaling=args.rope_scaling)


def prepare_grammars(tokenizer):
    """Build llguidance's view of the tokenizer (costly for a large vocabulary) on a thread while
    the model loads, so that the first request with a grammar does not wait for it; nothing
    without the structured extra. A tokenizer it cannot take is reported by such a request."""
    try:
        import llguidance  # noqa: F401
        from tileinfer.backend.grammar import ll_tokenizer
    except ImportError:
        return

    def build():
        try:
            ll_tokenizer(tokenizer)
        except Exception:  # noqa: BLE001 - the first structured request says what is wrong
            pass

    threading.Thread(target=build, name="tileinfer-grammar-tokenizer", daemon=True).start()


def served_reasoning(option: str, template: ServedTemplate, tokenizer) -> bool:
    """--reasoning-parser: whether answers' reasoning is split from their content; auto: when
    the model thinks in <think> blocks (both tags are tokens of its vocabulary, or its chat
    template writes them)."""
    from ..reasoning import END, START, tags_are_tokens

    if option != "auto":
        return option != "none"
    return tags_are_tokens(tokenizer) or bool(template.source and START in template.source
                                              and END in template.source)


def served_tool_parser(option: str, template: ServedTemplate, tokenizer):
    """--tool-parser's parser; auto: the format the chat template (else the tokenizer) shows."""
    from .tool_parsers import detect, tool_parser

    if option == "auto":
        option = detect(template.tool_source, tokenizer)
    return tool_parser(option)
