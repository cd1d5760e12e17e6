"""``tileinfer bench``: prefill and decode throughput at batch 1 for a model or random weights of
a named shape, with the fraction of the memory-bandwidth bound; with ``--batch N``, a static batch
of N requests on the serving engine (bench_batch.py), its decode steps likewise beside their bound.
Prints a table and JSON lines."""

from __future__ import annotations

import json
import sys

from .errors import UserError
from .options import DTYPES, default_threads, quantize_of, torch_dtype
from .parsing import int_range

SHAPES = ("llama3-8b", "llama3.2-3b", "llama3.2-1b", "smollm2-135m", "gemma3-270m",
          "gemma3-1b")  # random_weights.SHAPES

EPILOG = """\
examples:
  tileinfer bench --shape llama3-8b --int8
  tileinfer bench --shape llama3-8b --fp8 --batch 64
  tileinfer bench -m Qwen/Qwen3-0.6B --kv-cache int8 --new-tokens 512
  tileinfer bench --shape llama3.2-1b --backend ref --dtype fp32 --graphs off --pipeline off
  tileinfer bench --shape llama3-8b --batch 64
"""


def add_parser(sub, formatter):
    p = sub.add_parser("bench", help="measure prefill/decode throughput (random weights or a model)",
                       epilog=EPILOG, formatter_class=formatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--shape", default="llama3.2-1b", choices=SHAPES,
                     help="random weights of a named shape")
    src.add_argument("--model", "-m", help="a model (folder, pulled repo id, imported name) "
                     "instead of random weights")
    p.add_argument("--backend", "-b", help="op backend (default: the fastest that runs here)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                   help="weights and activations")
    q = p.add_mutually_exclusive_group()
    q.add_argument("--int8", action="store_true", help="INT8 weights")
    q.add_argument("--fp8", action="store_true",
                   help="FP8 weights and per-token FP8 activations (compute capability 8.9+)")
    q.add_argument("--fp8-weight-only", action="store_true",
                   help="FP8 weights, activations as they are")
    p.add_argument("--deterministic", action="store_true",
                   help="batch-invariant ops (what --deterministic of run, chat and serve costs)")
    p.add_argument("--kv-cache", choices=["bf16", "int8"], default="bf16",
                   help="KV cache precision")
    p.add_argument("--prompt-len", type=int_range(1, 1 << 20), default=16, metavar="N",
                   help="prompt tokens (random ids)")
    p.add_argument("--new-tokens", type=int_range(1, 1 << 20), default=256, metavar="N",
                   help="tokens generated per run")
    p.add_argument("--graphs", choices=["on", "off", "both"], default="on",
                   help="CUDA graphs (a GPU only)")
    p.add_argument("--pipeline", choices=["on", "off", "both"], default="on",
                   help="pipelined decoding (a GPU only)")
    p.add_argument("--batch", type=int_range(1, 4096), metavar="N",
                   help="a static batch of N requests on the serving engine (LLMEngine) instead "
                        "of one sequence: tok/s of the whole batch, and its KV pool")
    p.add_argument("--repeats", type=int_range(1, 1000), default=3, metavar="N",
                   help="runs per setting; the median is reported")
    p.add_argument("--threads", type=int_range(1, 1024), metavar="N",
                   help=f"CPU threads for PyTorch's ops (default: {default_threads()} here)")
    p.add_argument("--json", metavar="PATH",
                   help="also append the results as JSON lines to this file")
    p.set_defaults(func=run)


def _flags(choice):
    return {"on": [True], "off": [False], "both": [True, False]}[choice]


def run(args, out):
    import torch

    from tileinfer import load_model, memory_report
    from tileinfer.backend import default_backend_name
    from tileinfer.model.random_weights import random_model, shape_config

    from .bench_measure import bench_generation, bytes_per_decode_token, copy_bandwidth

    torch.set_num_threads(args.threads or default_threads())
    backend = args.backend or default_backend_name()
    quantize = quantize_of(args)
    kv = None if args.kv_cache == "bf16" else "int8"
    max_len = args.prompt_len + args.new_tokens + 64
    device = "cuda" if torch.cuda.is_available() else "cpu"
    what = f"loading {args.model}" if args.model else f"making random weights of {args.shape}"
    _progress(f"{what} ({args.dtype}{', ' + quantize if quantize else ''}) for backend {backend} "
              f"on {device}" + ("; on the CPU each run takes a while" if device == "cpu" else ""))
    if args.model:
        model = load_model(args.model, dtype=torch_dtype(args.dtype), backend=backend,
                           max_len=max_len, quantize=quantize,
                           batch_invariant=args.deterministic)
        name = args.model
    else:
        model = random_model(shape_config(args.shape), torch_dtype(args.dtype), backend,
                             device, quantize, max_len, batch_invariant=args.deterministic)
        name = args.shape
    on_gpu = model.device.type == "cuda"
    if not on_gpu and (args.graphs != "off" or args.pipeline != "off"):
        if args.graphs == "on" and args.pipeline == "on":
            args.graphs = args.pipeline = "off"  # the defaults: nothing to capture on a CPU
        else:
            raise UserError("CUDA graphs and pipelining need a GPU; use --graphs off --pipeline off")
    bandwidth = copy_bandwidth(model.device) if on_gpu else None
    if args.batch:
        _progress(f"measuring a static batch of {args.batch}: a warm-up and {args.repeats} runs")
        return _run_batch(args, model, name, kv, bandwidth, out)
    per_token = bytes_per_decode_token(model, args.prompt_len + args.new_tokens // 2, kv)
    memory = memory_report(model, kv_quantize=kv)
    rows = []
    for graphs in _flags(args.graphs):
        for pipeline in _flags(args.pipeline):
            if pipeline and not graphs:
                continue  # pipelining feeds the sampled token into the captured step
            _progress(f"measuring {args.prompt_len} prompt + {args.new_tokens} new tokens, "
                      f"graphs {'on' if graphs else 'off'}, pipeline {'on' if pipeline else 'off'}:"
                      f" 2 warm-ups and {args.repeats} runs")
            r = bench_generation(model, args.prompt_len, args.new_tokens, graphs, pipeline, kv,
                                 args.repeats, progress=_progress)
            r.update(model=name, deterministic=args.deterministic, bytes_per_token=per_token,
                     device=str(model.device),
                     weight_bytes=memory["weight_bytes"],
                     kv_bytes_per_token=memory["kv_bytes_per_token"],
                     gpu=torch.cuda.get_device_name() if on_gpu else None)
            if bandwidth:
                r.update(copy_bandwidth_tb_s=bandwidth / 1e12,
                         bound_tok_s=bandwidth / per_token,
                         fraction_of_bound=r["decode_tok_s"] * per_token / bandwidth)
            rows.append(r)
    _print_memory(memory, out)
    _print_table(rows, out)
    _write_json(rows, args.json, out)
    return 0


def _progress(text):
    """A line on standard error as the work goes (the table and JSON go to standard output)."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


def _write_json(rows, path, out):
    """Each result as a JSON line on out, and appended to path if given."""
    for r in rows:
        line = json.dumps(r)
        print(line, file=out)
        if path:
            with open(path, "a") as f:
                f.write(line + "\n")


def _run_batch(args, model, name, kv, bandwidth, out):
    """A static batch; on a GPU its decode steps beside their bound: a step of `batch` tokens
    reads the weights once and each sequence's KV cache at the run's mean context."""
    from tileinfer.engine.memory import format_bytes

    from .bench_batch import bench_static_batch
    from .bench_measure import bytes_per_decode_token

    r = bench_static_batch(model, args.batch, args.prompt_len, args.new_tokens, kv, args.repeats)
    r.update(model=name, deterministic=args.deterministic, device=str(model.device))
    per_step = bytes_per_decode_token(model, args.prompt_len + args.new_tokens // 2, kv,
                                      args.batch)
    if bandwidth and r["decode_tok_s"]:
        r.update(bytes_per_step=per_step, copy_bandwidth_tb_s=bandwidth / 1e12,
                 bound_tok_s=args.batch * bandwidth / per_step,
                 fraction_of_bound=r["decode_tok_s"] * per_step / (args.batch * bandwidth))
    print(f"KV pool: {r['pool_pages']:,} pages of {r['page_size']} positions, "
          f"{format_bytes(r['pool_bytes'])}", file=out)
    decode = f"{r['decode_tok_s']:.1f}" if r["decode_tok_s"] else "-"
    bound = f"{r['bound_tok_s']:.0f}" if "bound_tok_s" in r else "-"
    frac = f"{r['fraction_of_bound']:.0%}" if "fraction_of_bound" in r else "-"
    print(f"{'model':<14}{'backend':<8}{'weights':<16}{'kv':<6}{'batch':>6}{'tok/s':>11}"
          f"{'decode tok/s':>14}{'bound':>8}{'of bound':>9}", file=out)
    print(f"{name:<14}{r['backend']:<8}{r['weights']:<16}{r['kv_cache']:<6}{r['batch']:>6}"
          f"{r['tok_s']:>11.1f}{decode:>14}{bound:>8}{frac:>9}", file=out)
    _write_json([r], args.json, out)
    return 0


def _print_memory(m, out):
    from tileinfer.engine.memory import format_bytes

    print(f"weights {format_bytes(m['weight_bytes'])} ({m['weights']}; "
          f"{format_bytes(m['decode_weight_bytes'])} read per decode token), KV cache "
          f"{m['kv_bytes_per_token']:,} bytes per token ({m['kv_cache']}; "
          f"{m['kv_capacity_tokens']:,} tokens per {m['kv_budget_bytes'] / 2**30:g} GiB)",
          file=out)


def _print_table(rows, out):
    print(f"{'model':<14}{'backend':<8}{'weights':<16}{'kv':<6}{'graphs':<7}{'pipe':<6}"
          f"{'TTFT ms':>9}{'decode tok/s':>14}{'bound':>8}{'of bound':>9}"
          f"{'GPU ms/step':>12}{'host ms/step':>13}", file=out)
    for r in rows:
        bound = f"{r['bound_tok_s']:.0f}" if "bound_tok_s" in r else "-"
        frac = f"{r['fraction_of_bound']:.0%}" if "fraction_of_bound" in r else "-"
        gpu = f"{r['gpu_ms_per_step']:.3f}" if "gpu_ms_per_step" in r else "-"
        host = f"{r['host_ms_per_step']:.3f}" if "host_ms_per_step" in r else "-"
        print(f"{r['model']:<14}{r['backend']:<8}{r['weights']:<16}{r['kv_cache']:<6}"
              f"{'on' if r['graphs'] else 'off':<7}{'on' if r['pipeline'] else 'off':<6}"
              f"{r['time_to_first_token_ms']:>9.1f}{r['decode_tok_s']:>14.1f}{bound:>8}{frac:>9}"
              f"{gpu:>12}{host:>13}", file=out)
