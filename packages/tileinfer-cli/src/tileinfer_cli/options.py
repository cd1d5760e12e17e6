"""Options shared by the commands that load a model, and loading it from them."""

from __future__ import annotations

import argparse

import torch

from .errors import UserError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def add_model_options(p: argparse.ArgumentParser):
    g = p.add_argument_group("model")
    g.add_argument("--model", "-m", help="model folder, pulled repo id, or .gguf file "
                   "(default: the embedded SmolLM2-135M-Instruct)")
    g.add_argument("--backend", "-b", help="op backend: ref, triton, cuda, ... (default: the "
                   "fastest that runs here)")
    g.add_argument("--dtype", choices=["auto", *sorted(DTYPES)], default="auto",
                   help="weights and activations (auto: bf16 on a GPU, fp32 on the CPU, where "
                        "PyTorch's bf16 matrix products are slow)")
    g.add_argument("--int8", action="store_true", help="INT8 weights (per-channel scales)")
    g.add_argument("--kv-cache", choices=["bf16", "int8", "int8-smooth"], default="bf16",
                   help="KV cache precision (int8-smooth: INT8 with calibrated key smoothing)")
    g.add_argument("--max-len", type=int, default=4096, help="longest sequence (default 4096)")


def add_sampling_options(p: argparse.ArgumentParser):
    g = p.add_argument_group("sampling (default: the model authors' generation_config.json)")
    g.add_argument("--temperature", "-t", type=float)
    g.add_argument("--top-k", type=int)
    g.add_argument("--top-p", type=float)
    g.add_argument("--seed", type=int)
    g.add_argument("--max-new-tokens", "-n", type=int, default=512)
    think = g.add_mutually_exclusive_group()
    think.add_argument("--think", dest="thinking", action="store_true", default=None,
                       help="let a reasoning model think first (Qwen3's enable_thinking)")
    think.add_argument("--no-think", dest="thinking", action="store_false")


def _speculative_spec(text: str) -> str:
    kind, colon, name = text.partition(":")
    if not ((kind == "ngram" and not colon) or (kind in ("draft", "dflash") and name)):
        raise argparse.ArgumentTypeError(f"{text!r}: use ngram, draft:MODEL or dflash:MODEL")
    return text


def add_speculative_options(p: argparse.ArgumentParser):
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--speculative", type=_speculative_spec,
                   metavar="ngram|draft:MODEL|dflash:MODEL",
                   help="check drafted tokens several per step: ngram (prompt lookup), "
                        "draft:MODEL (a smaller model of the same vocabulary), or dflash:MODEL "
                        "(a DFlash drafter made for this model)")
    g.add_argument("--draft-k", type=int, metavar="K",
                   help="drafts per step (default: 4; a DFlash drafter's block size - 1)")


def speculative_from(args, model):
    """The proposer of --speculative (None without it)."""
    spec = getattr(args, "speculative", None)
    if spec is None:
        if getattr(args, "draft_k", None) is not None:
            raise UserError("--draft-k needs --speculative")
        return None
    from tileinfer import (DFlashProposer, DraftProposer, NgramProposer, load_dflash, load_model,
                           resolve_model_dir)

    kind, _, name = _speculative_spec(spec).partition(":")
    k = {} if args.draft_k is None else {"k": args.draft_k}
    if kind == "ngram":
        return NgramProposer(**k)
    # Drafts are sampled with the target's parameters when it samples (greedy otherwise).
    if kind == "draft":
        draft = load_model(resolve_model_dir(name), dtype=model.dtype, backend=model.ops.name,
                           device=model.device, max_len=model.max_len)
        return DraftProposer(draft, sample=True, **k)
    return DFlashProposer(load_dflash(resolve_model_dir(name), model), sample=True, **k)


def resolve_dtype(name, backend):
    if name != "auto":
        return DTYPES[name]
    from tileinfer import get_backend

    info = get_backend(backend).backend.info
    return torch.bfloat16 if "cuda" in info.devices and torch.cuda.is_available() else torch.float32


def load(args):
    """(model, tokenizer, folder) from the model options."""
    from tileinfer import load_model, load_tokenizer, resolve_model_dir
    from tileinfer.backend import default_backend_name

    folder = resolve_model_dir(args.model)
    backend = args.backend or default_backend_name()
    model = load_model(folder, dtype=resolve_dtype(args.dtype, backend), backend=backend,
                       max_len=args.max_len, quantize="int8" if args.int8 else None)
    return model, load_tokenizer(folder), folder


def sampling_from(args, folder, config):
    """SamplingParams and stop ids: the authors' defaults, overridden by the options."""
    from tileinfer import SamplingParams, generation_defaults

    defaults, stop_ids = generation_defaults(folder, config)
    params = SamplingParams(
        temperature=defaults.temperature if args.temperature is None else args.temperature,
        top_k=defaults.top_k if args.top_k is None else args.top_k,
        top_p=defaults.top_p if args.top_p is None else args.top_p,
    )
    return params, stop_ids


def kv_cache_from(args, model):
    """(kv_quantize, key_smoothing) of --kv-cache."""
    if args.kv_cache == "bf16":
        return None, None
    if args.kv_cache == "int8-smooth":
        from tileinfer import calibrate_key_smoothing

        return "int8", calibrate_key_smoothing(model)
    return "int8", None
