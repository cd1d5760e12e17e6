"""What a log row says about the run that made an answer, so that the run can be made again:
the model by a name that loads it again (``chat --continue`` reloads it), and the options that
shaped the answer (``options_of``)."""

from __future__ import annotations

from pathlib import Path

from .errors import UserError, first_line, user_errors
from .options import quantize_of, speculative_name


def model_reference(model: str | None, folder: Path) -> str:
    """A name of the model that ``resolve_model_dir`` takes back: the default model's and an
    imported model's name, a repo id (``OWNER/NAME`` or ``OWNER/NAME:TAG``) as given, a folder by
    its absolute path, a .gguf file by the name of its import."""
    if model is None:
        return folder.name
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if path.suffix == ".gguf" and path.is_file():
        return folder.name  # the import in the models home: `-m NAME` loads it
    return model


def options_of(args, sampling, stops, seed, turn_seed=None) -> dict:
    """What shaped an answer, for the log: the sampling options by the API's names, with the
    seed the sampler used (null when none was given and the answer was greedy: no seed was
    drawn), the stop strings, and the options of the prompt format, the weights' precision,
    speculative decoding and structured output that differ from the defaults.

    turn_seed: in a chat, the seed of this turn's sampler (the session's seed + its turns)."""
    options = {"temperature": sampling.temperature, "top_p": sampling.top_p,
               "top_k": sampling.top_k, "seed": seed, "max_tokens": args.max_new_tokens}
    if turn_seed is not None:
        options["turn_seed"] = turn_seed
    for name, off in (("presence_penalty", 0), ("frequency_penalty", 0),
                      ("repetition_penalty", 1), ("min_p", 0), ("logit_bias", ())):
        if getattr(sampling, name) != off:
            value = getattr(sampling, name)
            options[name] = {str(i): b for i, b in value} if name == "logit_bias" else value
    if stops:
        options["stop"] = list(stops)
    return {**options, **_format_options(args), **_model_options(args)}


def _format_options(args) -> dict:
    found = {}
    if getattr(args, "raw", False):
        found["raw"] = True
    if getattr(args, "chat_template", None):
        found["chat_template"] = args.chat_template
    if getattr(args, "thinking", None) is not None:
        found["enable_thinking"] = args.thinking
    for name in ("regex", "json_schema"):
        if getattr(args, name, None) is not None:
            found[name] = getattr(args, name)
    return found


def _model_options(args) -> dict:
    """The options of add_model_options and add_speculative_options that are not the
    defaults."""
    found = {}
    quantization = quantize_of(args)
    if quantization is not None:
        found["quantization"] = quantization
    if args.dtype != "auto":
        found["dtype"] = args.dtype
    if args.kv_cache != "bf16":
        found["kv_cache"] = args.kv_cache
    if args.deterministic:
        found["deterministic"] = True
    if args.max_len is not None:
        found["max_len"] = args.max_len
    if getattr(args, "rope_scaling", None) is not None:
        found["rope_scaling"] = args.rope_scaling
    speculative = speculative_name(args)
    if speculative not in (None, "none"):
        found["speculative"] = speculative
        if args.draft_k is not None:
            found["draft_k"] = args.draft_k
    return found


def continued_model(cid: str, rows: list[dict]) -> str | None:
    """The model that answered the latest turn of the logged conversation ``cid`` (None for the
    default model of a row that names none); a UserError when it is no longer here."""
    name = rows[-1].get("model")
    if name is None:
        return None
    from tileinfer import resolve_model_dir

    try:
        resolve_model_dir(name)
    except user_errors() as e:
        raise UserError(f"conversation {cid} was with the model {name!r}, which is not here "
                        f"({first_line(e)}); -m MODEL goes on with another model") from None
    return name
