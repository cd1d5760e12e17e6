"""``tileinfer quantize --fp8 --calibration FILE OUT``: write a model as an FP8 checkpoint whose
weights are rounded with GPTQ's error compensation on the calibration text
(``tileinfer.engine.generation.gptq``); ``tileinfer run -m OUT --fp8`` then runs it in FP8.
``--fp8-weight-only`` rounds them for activations left unquantized (``run --fp8-weight-only``)."""

from __future__ import annotations

from pathlib import Path

from .errors import UserError

EPILOG = """\
examples:
  tileinfer quantize --fp8 --calibration notes.txt ./smollm2-fp8
  tileinfer run -m ./smollm2-fp8 --fp8 "What is the capital of France?"
  tileinfer quantize -m Qwen/Qwen3-0.6B --fp8 --calibration wiki.txt --tokens 4096 ./qwen3-fp8
  tileinfer quantize --fp8-weight-only --calibration notes.txt ./smollm2-fp8-wo
  tileinfer run -m ./smollm2-fp8-wo --fp8-weight-only "What is the capital of France?"

The calibration text should look like what the model will read; its first --tokens tokens
are used (more tokens than the widest layer's inputs, or the rounding fits the text alone).
Slow for large models: each layer's inputs make a matrix of (width x width) float32 values.
"""


def add_parser(sub, formatter):
    p = sub.add_parser("quantize", help="write a model as a GPTQ-rounded FP8 checkpoint",
                       epilog=EPILOG, formatter_class=formatter)
    p.add_argument("out", metavar="OUT", help="the new checkpoint's folder (must not exist)")
    p.add_argument("-m", "--model", help="a folder, a pulled repo id, an imported name or a "
                                         ".gguf file (default: the embedded model)")
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--fp8", action="store_true",
                      help="e4m3 weights with one scale per output row, rounded for activations "
                           "quantized per token (run --fp8)")
    kind.add_argument("--fp8-weight-only", action="store_true",
                      help="the same weights rounded for unquantized activations "
                           "(run --fp8-weight-only)")
    p.add_argument("--calibration", required=True, metavar="FILE",
                   help="a UTF-8 text file to round the weights for")
    p.add_argument("--tokens", type=int, default=2048, help="calibration tokens to use")
    p.add_argument("-b", "--backend", default="ref",
                   help="the backend that runs the calibration text (default ref)")
    p.set_defaults(func=run)


def run(args, out):
    import torch
    from tileinfer import load_model, load_tokenizer, resolve_model_dir
    from tileinfer.engine.generation.gptq import write_gptq_fp8

    target = Path(args.out).expanduser()
    if target.exists():
        raise UserError(f"{target} exists; give a new folder")
    parent = target.absolute().parent
    if not parent.is_dir():
        raise UserError(f"cannot write {target}: {parent} is not a folder")
    try:
        text = Path(args.calibration).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read the calibration text {args.calibration}: {exc}") from None
    if args.tokens < 1:
        raise UserError("--tokens must be at least 1")
    folder = resolve_model_dir(args.model)
    ids = load_tokenizer(folder).encode(text, add_special_tokens=False)[:args.tokens]
    if not ids:
        raise UserError(f"the calibration text {args.calibration} holds no tokens")
    # bf16, the dtype the FP8 model's activations come in: its inputs are the ones to fit.
    model = load_model(folder, dtype=torch.bfloat16, backend=args.backend)
    print(f"rounding {folder.name}'s linear weights on {len(ids)} calibration tokens ...",
          file=out)
    try:  # written whole or not at all (write_gptq_fp8)
        write_gptq_fp8(model, target, ids, weight_only=args.fp8_weight_only)
    except OSError as exc:
        raise UserError(f"writing {target} failed: {exc.strerror or exc}") from None
    print(f"wrote {target}", file=out)
    return 0
