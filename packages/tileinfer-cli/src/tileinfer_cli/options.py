"""Options shared by the commands that load a model, and loading it from them.

Nothing heavy is imported at module level (``tileinfer --help`` must not wait for torch): torch
and tileinfer are imported inside the functions that run a command.
"""

from __future__ import annotations

import argparse
import os
import sys

from .errors import UserError
from .parsing import INT32_MAX, INT64_MAX, float_range, int_range, json_object, logit_bias
from .sampling_options import add_option_flag

# Logit processing options: off unless given (repetition_penalty and min_p: unless
# generation_config.json sets them, see generation_defaults).
PROCESSING = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p",
              "logit_bias")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# load_model's default max_len (tileinfer.model.config's, not imported here: that would import
# torch before the command line is parsed); capped by the model's positions and window.
DEFAULT_MAX_LEN = 4096
SEED_MAX = INT64_MAX // 2


def torch_dtype(name: str):
    import torch

    return getattr(torch, DTYPES[name])


def cpu_count() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads() -> int:
    """Threads for PyTorch's CPU ops when --threads is not given: half the CPUs, at most 8.

    PyTorch's OpenMP workers spin for every op and each op waits for its slowest worker, so a
    worker that loses its core to another process stalls every op: on a busy 2-core machine
    PyTorch's default (every core) decoded several times slower than one thread
    (benchmarks/RESULTS.md, 2026-12-04, "Figures that stood in code comments"). Leaving half the
    CPUs free avoids that; on more cores the cap of 8 is a guess, not a measurement: set
    --threads to tune it.
    """
    return max(1, min(8, cpu_count() // 2))


def add_model_options(p: argparse.ArgumentParser):
    g = p.add_argument_group("model")
    g.add_argument("--model", "-m", help="model: a folder, a pulled repo id (owner/name, or "
                   "owner/name:TAG for a pulled GGUF quantization), an imported name "
                   "(tileinfer list), or a .gguf file (default: the embedded "
                   "SmolLM2-135M-Instruct)")
    g.add_argument("--backend", "-b", help="op backend: ref, triton, cuda, ... (default: the "
                   "fastest that runs here; tileinfer backends lists them)")
    g.add_argument("--dtype", choices=["auto", *sorted(DTYPES)], default="auto",
                   help="weights and activations (auto: bf16 on a GPU, fp32 on the CPU, where "
                        "PyTorch's bf16 matrix products are slow)")
    q = g.add_mutually_exclusive_group()
    q.add_argument("--int8", action="store_true", help="INT8 weights (per-channel scales)")
    q.add_argument("--fp8", action="store_true",
                   help="FP8 (e4m3) weights with per-channel scales and per-token FP8 "
                        "activations (GPUs of compute capability 8.9 and newer)")
    q.add_argument("--fp8-weight-only", action="store_true",
                   help="FP8 (e4m3) weights with per-channel scales, activations as they are "
                        "(nearer the unquantized model than --fp8; faster for one sequence)")
    q.add_argument("--quantization", choices=["int8", "fp8", "fp8-weight-only", "none"],
                   help="the same as --int8, --fp8 or --fp8-weight-only (vLLM's name); none: "
                        "an FP8 checkpoint's weights dequantized (by default they run as "
                        "stored)")
    g.add_argument("--deterministic", action="store_true",
                   help="batch-invariant ops: an answer's tokens and logprobs do not depend on "
                        "what else runs beside it (docs/determinism.md has the cost)")
    g.add_argument("--kv-cache", choices=["bf16", "int8", "int8-smooth"], default="bf16",
                   help="KV cache precision (int8-smooth: INT8 with calibrated key smoothing)")
    g.add_argument("--max-len", type=int_range(1, INT32_MAX), metavar="N",
                   help=f"longest sequence, prompt and answer (default: {DEFAULT_MAX_LEN}, or "
                        "the model's max_position_embeddings or sliding_window if smaller)")
    g.add_argument("--allow-long-context", action="store_true",
                   help="accept a --max-len beyond the model's max_position_embeddings (with a "
                        "warning: the model was not trained for such positions)")
    g.add_argument("--rope-scaling", type=json_object, metavar="JSON",
                   help="replace config.json's RoPE scaling, e.g. '{\"rope_type\": \"yarn\", "
                        "\"factor\": 4.0, \"original_max_position_embeddings\": 32768}' for "
                        "Qwen3's long contexts (YaRN lets --max-len reach factor x the original)")
    g.add_argument("--threads", type=int_range(1, 1024), metavar="N",
                   help="CPU threads for PyTorch's ops (default: half the CPUs, at most 8: "
                        f"{default_threads()} here: PyTorch's default of every CPU decodes "
                        "several times slower when other work shares the cores)")


def add_sampling_options(p: argparse.ArgumentParser):
    g = p.add_argument_group("sampling (default: the model authors' generation_config.json)")
    g.add_argument("--temperature", "-t", type=float_range(0, 1e6), metavar="T",
                   help="0 is greedy")
    g.add_argument("--top-k", type=int_range(0, INT32_MAX), metavar="K", help="0 disables it")
    g.add_argument("--top-p", type=float_range(0, 1, lo_open=True), metavar="P",
                   help="in (0, 1]; 1 disables it")
    g.add_argument("--presence-penalty", type=float_range(-2, 2), metavar="X",
                   help="subtracted from the logit of every token the answer holds (OpenAI's)")
    g.add_argument("--frequency-penalty", type=float_range(-2, 2), metavar="X",
                   help="subtracted once per occurrence in the answer (OpenAI's)")
    g.add_argument("--repetition-penalty", type=float_range(0, 1e6, lo_open=True), metavar="R",
                   help="logits of prompt and answer tokens divided by R if positive, else "
                        "multiplied (HF's); 1 disables it")
    g.add_argument("--min-p", type=float_range(0, 1), metavar="P",
                   help="keep tokens at least P times as likely as the likeliest; 0 disables it")
    g.add_argument("--logit-bias", type=logit_bias, metavar="JSON",
                   help="token id -> bias added to its logit, e.g. '{\"2\": -100}'")
    g.add_argument("--seed", type=int_range(0, SEED_MAX), metavar="N",
                   help="random seed of the sampler (default: a random one, which the log "
                        "keeps)")
    g.add_argument("--max-new-tokens", "-n", type=int_range(1, INT32_MAX), default=512,
                   metavar="N", help="the longest answer in tokens")
    add_option_flag(g)
    think = g.add_mutually_exclusive_group()
    think.add_argument("--think", dest="thinking", action="store_true", default=None,
                       help="let a reasoning model think first (Qwen3's enable_thinking)")
    think.add_argument("--no-think", dest="thinking", action="store_false",
                       help="answer without thinking first (default: the chat template's)")
    g.add_argument("--hide-thinking", action="store_true",
                   help="print a thinking model's answer without its <think> reasoning "
                        "(ollama's --hidethinking; --json gives it apart as reasoning)")


def _speculative_spec(text: str) -> str:
    kind, colon, name = text.partition(":")
    if not ((kind in ("ngram", "none") and not colon) or (kind in ("draft", "dflash") and name)):
        raise argparse.ArgumentTypeError(f"{text!r}: use ngram, none, draft:MODEL or "
                                         "dflash:MODEL")
    return text


def add_speculative_options(p: argparse.ArgumentParser):
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--speculative", type=_speculative_spec, default=None,
                   metavar="ngram|none|draft:MODEL|dflash:MODEL",
                   help="check drafted tokens several per step: ngram (prompt lookup: it drafts "
                        "only while its guesses keep coming true), draft:MODEL (a smaller model "
                        "of the same vocabulary), dflash:MODEL (a DFlash drafter made for this "
                        "model), or none (plain decoding). With ngram the start-up also captures "
                        "its verify steps, so the answer runs at full speed from its first "
                        "token. Default: none (that capture lengthens every start, and answers "
                        "that copy nothing gain nothing), ngram when --draft-k is given")
    g.add_argument("--draft-k", type=int_range(1, 64), metavar="K",
                   help="drafts per step (default: 7 for ngram, 4 for draft:MODEL; a DFlash "
                        "drafter's block size - 1)")


def speculative_name(args) -> str | None:
    """What --speculative asks for (None for a command without the option). Without the option:
    none, or ngram when --draft-k asks for drafts."""
    if not hasattr(args, "speculative"):
        return None
    if args.speculative is None:
        return "ngram" if args.draft_k is not None else "none"
    return args.speculative


def speculative_from(args, model, sampling):
    """The proposer of --speculative (None for none, or a command without the option)."""
    spec = speculative_name(args)
    if spec is None:
        return None
    if spec == "none":
        if getattr(args, "draft_k", None) is not None:
            raise UserError("--draft-k needs speculative decoding (not --speculative none)")
        return None
    if sampling.processes_logits:
        s = sampling
        active = [f"{name} {value:g}" for name, value, off in (
            ("presence_penalty", s.presence_penalty, 0.0),
            ("frequency_penalty", s.frequency_penalty, 0.0),
            ("repetition_penalty", s.repetition_penalty, 1.0), ("min_p", s.min_p, 0.0))
            if value != off] + (["logit_bias"] if s.logit_bias else [])
        raise UserError(f"speculative decoding does not take {', '.join(active)} (the "
                        "model's generation_config.json may set repetition_penalty and min_p; "
                        "-o repetition_penalty 1 and -o min_p 0 turn them off)")
    from tileinfer import (DFlashProposer, DraftProposer, NgramProposer, load_dflash, load_model,
                           resolve_model_dir)

    kind, _, name = _speculative_spec(spec).partition(":")
    k = {} if args.draft_k is None else {"k": args.draft_k}
    if kind == "ngram":
        return NgramProposer(**k)
    # Drafts are sampled with the target's parameters when it samples (greedy otherwise).
    if kind == "draft":
        draft = load_model(resolve_model_dir(name), dtype=model.dtype, backend=model.ops.name,
                           device=model.device, max_len=model.max_len,
                           allow_long=getattr(args, "allow_long_context", False))
        return DraftProposer(draft, sample=True, **k)
    return DFlashProposer(load_dflash(resolve_model_dir(name), model), sample=True, **k)


def resolve_dtype(name, backend):
    import torch

    if name != "auto":
        return torch_dtype(name)
    from tileinfer import get_backend

    info = get_backend(backend).backend.info
    return torch.bfloat16 if "cuda" in info.devices and torch.cuda.is_available() else torch.float32


def set_threads(args):
    """PyTorch's CPU threads: --threads, else ``default_threads()``."""
    import torch

    torch.set_num_threads(args.threads or default_threads())


def quantize_of(args) -> str | None:
    """load_model's quantize from --int8 / --fp8 / --fp8-weight-only / --quantization (bench has
    no --quantization)."""
    if getattr(args, "quantization", None):
        return None if args.quantization == "none" else args.quantization
    flags = {"int8": args.int8, "fp8": args.fp8, "fp8-weight-only": args.fp8_weight_only}
    return next((name for name, given in flags.items() if given), None)


def resolve_quantize(args, folder, backend: str) -> str | None:
    """load_model's quantize: the options' choice; with none given, an FP8 checkpoint runs its
    weights as stored, as its config asks (W8A8 where it quantizes the activations and the
    backend declares FP8 products, else weight-only), and a line on stderr says so.
    ``--quantization none`` loads them dequantized."""
    from tileinfer.backend import BackendError, get_backend
    from tileinfer.model.fp8_checkpoint import QuantizationError, stored_scheme
    from tileinfer.model.quant import backend_takes

    quantize = quantize_of(args)
    if quantize is not None or getattr(args, "quantization", None) == "none":
        return quantize
    try:
        scheme = stored_scheme(folder)
        info = get_backend(backend).backend.info if scheme else None
    except (QuantizationError, BackendError):  # the loader's error says it
        return None
    if scheme == "fp8" and not backend_takes(info, scheme):
        scheme = "fp8-weight-only"
    if scheme is None or not backend_takes(info, scheme):
        return None
    print(f"tileinfer: {folder.name} stores FP8 weights: running them as stored (--{scheme}; "
          "--quantization none loads them dequantized)", file=sys.stderr)
    return scheme


def load(args):
    """(model, tokenizer, folder) from the model options. The tokenizer loads in a thread while
    the weights load (the tokenizers library parses its file without holding the interpreter's
    lock, and copying weights holds it little)."""
    from concurrent.futures import ThreadPoolExecutor

    from tileinfer import load_model, load_tokenizer, resolve_model_dir
    from tileinfer.backend import default_backend_name

    set_threads(args)
    folder = resolve_model_dir(args.model)
    backend = args.backend or default_backend_name()
    quantize = resolve_quantize(args, folder, backend)
    with ThreadPoolExecutor(1, thread_name_prefix="tileinfer-tokenizer") as pool:
        tokenizer = pool.submit(load_tokenizer, folder)
        model = load_model(folder, dtype=resolve_dtype(args.dtype, backend), backend=backend,
                           max_len=args.max_len, quantize=quantize,
                           allow_long=args.allow_long_context, batch_invariant=args.deterministic,
                           rope_scaling=args.rope_scaling)
        return model, tokenizer.result(), folder


def sampling_from(args, folder, config):
    """SamplingParams and stop ids: the authors' defaults, overridden by the options."""
    import dataclasses

    from tileinfer import generation_defaults

    defaults, stop_ids = generation_defaults(folder, config)
    given = {name: getattr(args, name, None) for name in ("temperature", "top_k", "top_p")
             + PROCESSING}
    params = dataclasses.replace(defaults, **{name: value for name, value in given.items()
                                              if value is not None})
    bad = [i for i, _ in params.logit_bias if i >= config.vocab_size]
    if bad:
        raise UserError(f"logit_bias: token {bad[0]} is outside the vocabulary "
                        f"(0..{config.vocab_size - 1})")
    return params, stop_ids


def seed_from(args, sampling) -> int | None:
    """The sampler's seed: --seed, else, for an answer that samples, one drawn here, so that the
    log can say it (``generate`` would draw one it does not tell); None for a greedy answer."""
    if args.seed is not None:
        return args.seed
    if sampling.temperature == 0:
        return None
    import random

    return draw_seed(random)


def draw_seed(rng) -> int:
    """A seed in --seed's range, so that the logged value can be given back as --seed."""
    return rng.randrange(SEED_MAX + 1)


def warm_up_on_gpu(model, sampling, kv_cache, key_smoothing, speculative=None):
    """``tileinfer.warm_up`` for the answers to come (with ``speculative``, their proposer), on
    a GPU (on the CPU there are no kernels to load or graphs to capture)."""
    from tileinfer import warm_up

    if model.device.type != "cpu":
        warm_up(model, sampling, kv_quantize=kv_cache, key_smoothing=key_smoothing,
                speculative=speculative)


def kv_cache_from(args, model):
    """(kv_quantize, key_smoothing) of --kv-cache."""
    if args.kv_cache == "bf16":
        return None, None
    if args.kv_cache == "int8-smooth":
        from tileinfer import calibrate_key_smoothing

        return "int8", calibrate_key_smoothing(model)
    return "int8", None
