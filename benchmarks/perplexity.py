"""Perplexity of a model over public-domain text with bf16 / INT8 / FP8 weights and bf16 / INT8 KV.

Text: benchmarks/data/kjv-genesis.txt (King James Version, Genesis 1-16, public domain; see
data/README.md). Evaluated on chapters 1-10; key smoothing is calibrated on chapters 11-16, a
different text from the evaluated one.

Method: the evaluated text is tokenized once (no special tokens) and cut into windows of
``--window`` tokens starting every ``--stride`` tokens (stride = window, the default:
consecutive chunks that overlap by one token, so the first token of a chunk is predicted too).
Each window runs as one prefill of a fresh sequence through TileInfer's own
``forward(..., all_logits=True)`` on the paged cache, so every score reads the keys and values
back from the cache in the configuration's precision. A window scores the tokens not scored
by the window before it (all but its first token when it is the first window); perplexity is
``exp(mean NLL)`` over every scored token.

Configurations (all computed on the same windows, so they are compared token for token):

- ``bf16``: weights and KV cache in the activation dtype (``--dtype``, bf16 by default);
- ``int8-weights``: INT8 weight-only linear layers (``load_model(..., quantize="int8")``);
- ``int8-kv``: INT8 KV pages, one float32 scale per vector;
- ``int8-kv-smooth``: INT8 KV pages with per-channel key smoothing calibrated on the
  calibration chapters (``calibrate_key_smoothing``);
- ``int8-all``: INT8 weights and INT8 KV with smoothing;
- ``fp8-weights``: e4m3 linear layers and per-token e4m3 activations
  (``load_model(..., quantize="fp8")``; the backend must declare FP8 ops);
- ``fp8-weight-only``: the same e4m3 linear layers, activations in the model dtype
  (``quantize="fp8-weight-only"``);
- ``fp32`` (not run unless asked): the same weights, activations and KV cache in float32, to
  show how far bf16 itself is from full precision (the floor the INT8 errors compare with).

Besides perplexity, each configuration reports its mean KL divergence from the bf16 model's
next-token distribution and how often its top-1 token agrees with bf16's: more sensitive than
perplexity, which lets errors of opposite sign cancel. With ``fp32`` among the configurations,
each also reports its KL divergence from the fp32 model's distribution (``kl_from_fp32``).

Prints one JSON object per configuration, then (with --markdown) a table.

Backends against the float32 reference (``--vs-fp32-ref BACKENDS``, issue 21): the same windows
through the ref backend in float32 (the reference distribution) and through each listed backend
in ``--dtype``; per backend, the mean KL divergence from the reference's next-token distribution,
the top-1 agreement with its argmax (ties to the lowest id, as greedy decoding breaks them) and
the perplexity, twice: with the logits as the backend computes them (float32 sums of the
lm_head, unrounded) and with those logits rounded to bf16 first, which is what every backend
returned before the float32 logits (the lm_head rounded its float32 sum to bf16 in the
epilogue; rounding the unrounded sum gives the same bits for triton and cuda, whose sums did not
change, and for ref up to the summation order of a bf16 F.linear). It also prints each backend's
greedy answer to "What is the capital of France?" through the chat template.

    python benchmarks/perplexity.py                      # ref backend on the CPU, bf16
    python benchmarks/perplexity.py --backend triton --device cuda
    python benchmarks/perplexity.py --device cuda --vs-fp32-ref ref,triton,cuda --max-tokens 2048
    python benchmarks/perplexity.py --model GPTQ_OUT --reference PUBLISHED \
        --configs bf16,fp8-weight-only,fp32        # a quantized checkpoint against its source
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
from tileinfer.engine.kv.cache import new_cache

HERE = Path(__file__).resolve().parent
DEFAULT_TEXT = HERE / "data" / "kjv-genesis.txt"
CONFIGS = ("bf16", "int8-weights", "int8-kv", "int8-kv-smooth", "int8-all", "fp8-weights",
           "fp8-weight-only", "fp32")
DEFAULT_CONFIGS = CONFIGS[:5]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def chapters(text: str) -> dict[int, str]:
    """The text's chapters by number, each with its ``CHAPTER n`` heading."""
    parts = re.split(r"^(?=CHAPTER \d+$)", text, flags=re.M)
    out = {}
    for part in parts:
        m = re.match(r"CHAPTER (\d+)$", part, flags=re.M)
        if m:
            out[int(m.group(1))] = part.strip() + "\n"
    return out


def chapter_range(spec: str) -> list[int]:
    first, _, last = spec.partition("-")
    return list(range(int(first), int(last or first) + 1))


def windows(n: int, window: int, stride: int):
    """(begin, end, first_scored) of each window over n tokens: tokens first_scored..end-1 are
    scored in it (token t is predicted by the logits of position t - 1). A window starts stride
    tokens after the one before, but no later than one token before the first token it scores,
    so every token from the second on is scored exactly once (consecutive windows of the same
    size overlap by one token)."""
    prev_end, begin = 0, 0
    while prev_end < n:
        begin = min(begin, max(prev_end - 1, 0))
        end = min(begin + window, n)
        yield begin, end, max(prev_end, 1)
        prev_end = end
        begin += stride


def window_log_probs(model, cache, ids, begin, end, first):
    """Log-probabilities (scored, vocab) float32 of the window's scored tokens' predictions."""
    from tileinfer import forward

    seq = cache.new_sequence()
    try:
        logits = forward(model, cache, seq, ids[begin:end], all_logits=True)
    finally:
        cache.release(seq)
    return torch.log_softmax(logits[first - begin - 1:end - begin - 1].float(), dim=-1).cpu()


def window_logits(model, cache, ids, begin, end, first):
    """Float32 logits (scored, vocab) of the window's scored tokens' predictions, on the CPU."""
    from tileinfer import forward

    seq = cache.new_sequence()
    try:
        logits = forward(model, cache, seq, ids[begin:end], all_logits=True)
    finally:
        cache.release(seq)
    return logits[first - begin - 1:end - begin - 1].float().cpu()


def greedy_answer(model, model_dir, tokenizer, question: str, n: int = 12) -> str:
    from tileinfer import ChatMessage, chat_prompt, generate

    prompt = tokenizer.encode(chat_prompt(model_dir, [ChatMessage("user", question)]),
                              add_special_tokens=False)
    return tokenizer.decode(generate(model, prompt, n, graphs=False))


def compare_backends(args, backends, model_dir, tokenizer, ids, stride, commit) -> int:
    """Each backend in args.dtype against the ref backend in float32 (see the module
    docstring). Prints one JSON row per backend and logits form, then a table."""
    from tileinfer import load_model

    dtype = DTYPES[args.dtype]
    start = time.perf_counter()
    load = dict(device=args.device, max_len=args.window)
    reference = load_model(model_dir, dtype=torch.float32, backend="ref", **load)
    models = {b: load_model(model_dir, dtype=dtype, backend=b, **load) for b in backends}
    caches = {b: new_cache(m, args.window, page_size=args.page_size) for b, m in models.items()}
    ref_cache = new_cache(reference, args.window, page_size=args.page_size)
    forms = ("float32", "bf16-rounded")
    totals = {(b, f): dict(nll=0.0, kl=0.0, agree=0) for b in backends for f in forms}
    ref_nll, scored = 0.0, 0
    with torch.no_grad():
        for begin, end, first in windows(len(ids), args.window, stride):
            targets = torch.tensor(ids[first:end])
            ref_lp = torch.log_softmax(window_logits(reference, ref_cache, ids, begin, end, first),
                                       -1)
            ref_nll -= ref_lp.gather(1, targets[:, None]).sum().item()
            ref_top = ref_lp.argmax(-1)
            for b, model in models.items():
                logits = window_logits(model, caches[b], ids, begin, end, first)
                for form in forms:
                    shown = logits if form == "float32" else logits.to(torch.bfloat16).float()
                    lp = torch.log_softmax(shown, -1)
                    t = totals[(b, form)]
                    t["nll"] -= lp.gather(1, targets[:, None]).sum().item()
                    t["kl"] += (ref_lp.exp() * (ref_lp - lp)).sum().item()
                    t["agree"] += (shown.argmax(-1) == ref_top).sum().item()
            scored += end - first
            print(f"window {begin}-{end}: {scored}/{len(ids) - 1} tokens scored, "
                  f"{time.perf_counter() - start:.0f} s", file=sys.stderr)
    question = "What is the capital of France?"
    answers = {b: greedy_answer(m, model_dir, tokenizer, question) for b, m in models.items()}
    answers["ref-fp32"] = greedy_answer(reference, model_dir, tokenizer, question)
    meta = dict(model=str(model_dir.name), device=args.device, dtype=args.dtype,
                torch=torch.__version__, commit=commit, text=args.text.name,
                eval_chapters=args.eval_chapters, tokens=len(ids), scored_tokens=scored,
                window=args.window, stride=stride, seconds=round(time.perf_counter() - start, 1))
    rows = [dict(config="vs-fp32-ref", backend="ref-fp32", logits="float32",
                 perplexity=round(math.exp(ref_nll / scored), 4), kl_from_fp32_ref=0.0,
                 top1_agreement=1.0, answer=answers["ref-fp32"], **meta)]
    for (b, form), t in totals.items():
        rows.append(dict(config="vs-fp32-ref", backend=b, logits=form,
                         perplexity=round(math.exp(t["nll"] / scored), 4),
                         kl_from_fp32_ref=round(t["kl"] / scored, 6),
                         top1_agreement=round(t["agree"] / scored, 5), answer=answers[b], **meta))
    for r in rows:
        print(json.dumps(r))
    print(f"\n{args.dtype} backends against the ref backend in float32, {scored} tokens of "
          f"{args.text.name} (chapters {args.eval_chapters}), windows of {args.window}:\n")
    print("| backend | logits | mean KL from fp32 ref | top-1 = fp32 ref | perplexity "
          "| \"What is the capital of France?\" |")
    print("|---|---|---:|---:|---:|---|")
    for r in rows:
        answer = r["answer"].replace("|", "\\|").replace("\n", " ")
        print(f"| {r['backend']} | {r['logits']} | {r['kl_from_fp32_ref']:.5f} "
              f"| {100 * r['top1_agreement']:.2f}% | {r['perplexity']:.3f} | {answer} |")
    return 0


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--reference", metavar="FOLDER",
                   help="the bf16 and fp32 configurations (and the KV ones) from this folder "
                        "instead, e.g. the published model when --model is a quantized "
                        "checkpoint of it (same tokenizer)")
    p.add_argument("--backend", default="ref")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                   help="activation dtype, also the weights' and the KV cache's in 'bf16'")
    p.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    p.add_argument("--eval-chapters", default="1-10")
    p.add_argument("--calib-chapters", default="11-16")
    p.add_argument("--calib-tokens", type=int, default=2048,
                   help="calibration tokens (the first of the calibration chapters)")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--stride", type=int, default=None, help="default: the window (no overlap)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="evaluate on the first N tokens only")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help=f"comma-separated, among {', '.join(CONFIGS)}")
    p.add_argument("--alpha", type=float, default=None, help="key smoothing strength")
    p.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    p.add_argument("--vs-fp32-ref", metavar="BACKENDS",
                   help="instead: these backends (comma-separated) in --dtype against the ref "
                        "backend in float32, with float32 and bf16-rounded logits")
    args = p.parse_args(argv)

    from tileinfer import calibrate_key_smoothing, load_model, load_tokenizer, memory_report
    from tileinfer.io.default_model import default_model_dir

    configs = args.configs.split(",")
    unknown = set(configs) - set(CONFIGS)
    if unknown or "bf16" not in configs:
        p.error(f"--configs must include bf16 and be among {', '.join(CONFIGS)}")
    stride = args.stride or args.window
    if not 0 < stride <= args.window:
        p.error("--stride must be in 1..window")

    model_dir = Path(args.model) if args.model else default_model_dir()
    tokenizer = load_tokenizer(model_dir)
    book = chapters(args.text.read_text())
    eval_ch, calib_ch = chapter_range(args.eval_chapters), chapter_range(args.calib_chapters)
    if set(eval_ch) & set(calib_ch):
        p.error("the calibration chapters must differ from the evaluated ones")
    eval_text = "".join(book[c] + "\n" for c in eval_ch)
    ids = tokenizer.encode(eval_text, add_special_tokens=False)[:args.max_tokens]
    calib_ids = tokenizer.encode("".join(book[c] + "\n" for c in calib_ch),
                                 add_special_tokens=False)[:args.calib_tokens]

    commit = git_commit()  # of the code that runs (before others may commit meanwhile)
    if args.vs_fp32_ref:
        return compare_backends(args, args.vs_fp32_ref.split(","), model_dir, tokenizer, ids,
                                stride, commit)
    dtype = DTYPES[args.dtype]
    max_len = args.window
    load = dict(dtype=dtype, backend=args.backend, device=args.device, max_len=max_len)
    start = time.perf_counter()
    reference_dir = Path(args.reference) if args.reference else model_dir
    base = load_model(reference_dir, **load)
    int8 = load_model(model_dir, quantize="int8", **load) if {"int8-weights", "int8-all"} & set(
        configs) else None
    fp8 = (load_model(model_dir, quantize="fp8", **load) if "fp8-weights" in configs
           else None)
    fp8_wo = (load_model(model_dir, quantize="fp8-weight-only", **load)
              if "fp8-weight-only" in configs else None)
    fp32 = (load_model(reference_dir, **dict(load, dtype=torch.float32)) if "fp32" in configs
            else None)
    smooth_kw = {} if args.alpha is None else dict(alpha=args.alpha)
    smoothing = (calibrate_key_smoothing(base, calib_ids, **smooth_kw)
                 if {"int8-kv-smooth", "int8-all"} & set(configs) else None)
    ps = args.page_size
    setups = {}  # name -> (model, cache), in CONFIGS order
    for name in (n for n in CONFIGS if n in configs):
        model = {"int8-weights": int8, "int8-all": int8, "fp8-weights": fp8,
                 "fp8-weight-only": fp8_wo, "fp32": fp32}.get(name, base)
        if name in ("bf16", "int8-weights", "fp8-weights", "fp8-weight-only", "fp32"):
            cache = new_cache(model, max_len, page_size=ps)
        else:
            cache = new_cache(model, max_len, page_size=ps, quantize="int8",
                                    key_smoothing=None if name == "int8-kv" else smoothing)
        setups[name] = (model, cache)

    totals = {name: dict(nll=0.0, kl=0.0, kl32=0.0, agree=0) for name in setups}
    scored = 0
    with torch.no_grad():
        for begin, end, first in windows(len(ids), args.window, stride):
            targets = torch.tensor(ids[first:end])
            lps = {name: window_log_probs(model, cache, ids, begin, end, first)
                   for name, (model, cache) in setups.items()}
            base_lp, fp32_lp = lps["bf16"], lps.get("fp32")
            for name, lp in lps.items():
                t = totals[name]
                t["nll"] -= lp.gather(1, targets[:, None]).sum().item()
                t["kl"] += (base_lp.exp() * (base_lp - lp)).sum().item()
                if fp32_lp is not None:
                    t["kl32"] += (fp32_lp.exp() * (fp32_lp - lp)).sum().item()
                t["agree"] += (lp.argmax(-1) == base_lp.argmax(-1)).sum().item()
            scored += end - first
            print(f"window {begin}-{end}: {scored}/{len(ids) - 1} tokens scored, "
                  f"{time.perf_counter() - start:.0f} s", file=sys.stderr)

    meta = dict(model=str(model_dir.name), reference=str(reference_dir.name),
                backend=base.backend, device=str(base.device), dtype=args.dtype,
                torch=torch.__version__, threads=torch.get_num_threads(), commit=commit,
                text=args.text.name, eval_chapters=args.eval_chapters,
                calib_chapters=args.calib_chapters, calib_tokens=len(calib_ids),
                tokens=len(ids), scored_tokens=scored, window=args.window, stride=stride,
                page_size=ps, seconds=round(time.perf_counter() - start, 1))
    base_ppl = math.exp(totals["bf16"]["nll"] / scored)
    rows = []
    for name, (model, cache) in setups.items():
        t = totals[name]
        ppl = math.exp(t["nll"] / scored)
        mem = memory_report(model, cache)
        row = dict(config=name, perplexity=round(ppl, 4),
                   vs_bf16_pct=round(100 * (ppl / base_ppl - 1), 3),
                   kl_from_bf16=round(t["kl"] / scored, 6),
                   **({"kl_from_fp32": round(t["kl32"] / scored, 6)} if "fp32" in setups
                      else {}),
                   top1_agreement=round(t["agree"] / scored, 5),
                   weights=mem["weights"], kv_cache=mem["kv_cache"],
                   decode_weight_bytes=mem["decode_weight_bytes"],
                   kv_bytes_per_token=mem["kv_bytes_per_token"], **meta)
        rows.append(row)
        print(json.dumps(row))
    if args.markdown:
        kl32 = "fp32" in setups
        print("\n| configuration | weights | KV cache | perplexity | vs bf16 | KL from bf16 "
              + ("| KL from fp32 " if kl32 else "")
              + "| top-1 = bf16 | weight bytes read / token | KV bytes / token |")
        print("|---|---|---|---:|---:|---:|" + ("---:|" if kl32 else "") + "---:|---:|---:|")
        for r in rows:
            print(f"| {r['config']} | {r['weights']} | {r['kv_cache']} | {r['perplexity']:.3f} "
                  f"| {r['vs_bf16_pct']:+.2f}% | {r['kl_from_bf16']:.5f} "
                  + (f"| {r['kl_from_fp32']:.5f} " if kl32 else "")
                  + f"| {100 * r['top1_agreement']:.2f}% "
                  f"| {r['decode_weight_bytes'] / 1e6:.1f} MB | {r['kv_bytes_per_token']:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
