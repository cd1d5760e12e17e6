"""``tileinfer embed [TEXT ...]``: each text's embedding, one JSON array a line (llm's
``embed`` habit): the model's final hidden state at the text's last token, L2-normalized, as
``tileinfer serve``'s /v1/embeddings gives it. Texts come from the arguments, else one a line
from standard input, output line N being input line N's embedding (so that the two can be
zipped); a blank line, which has nothing to embed, is refused rather than skipped, which would
shift every later line. They run together on the batched engine (``LLMEngine`` requests with
``hidden_state``). Made for decoder embedding models (Qwen3-Embedding and its kind), whose
tokenizers end a text with their end token: a text is encoded with the tokenizer's special
tokens."""

from __future__ import annotations

import json

from .errors import UserError
from .options import add_model_options, load
from .parsing import INT32_MAX, int_range
from .text_input import checked_text, read_stdin

EPILOG = """\
Output line N is the embedding of TEXT N, or of line N of standard input; a blank text or line
is refused (grep -v '^[[:space:]]*$' drops blank lines first).

examples:
  tileinfer embed -m Qwen/Qwen3-Embedding-0.6B "a cat on a mat" "a dog in a fog"
  cat sentences.txt | tileinfer embed -m Qwen/Qwen3-Embedding-0.6B --dimensions 256 > vectors.jsonl
  paste sentences.txt vectors.jsonl                  each line beside its embedding
"""


def add_parser(sub, formatter):
    p = sub.add_parser("embed", help="print texts' embeddings, one JSON array a line",
                       epilog=EPILOG, formatter_class=formatter)
    p.add_argument("text", metavar="TEXT", nargs="*",
                   help="texts to embed (default: each line of standard input)")
    p.add_argument("--dimensions", type=int_range(1, INT32_MAX), metavar="N",
                   help="keep the first N values before normalizing (Matryoshka embeddings)")
    add_model_options(p)
    p.set_defaults(func=run)


def texts_of(args) -> list[str]:
    """The arguments, else the lines of standard input (without their line ends), one text a
    line; a UserError naming the first blank one."""
    if args.text:
        texts, what = [checked_text(t, "TEXT") for t in args.text], "TEXT"
    else:
        data, what = read_stdin(), "line"
        # not splitlines(): U+2028 and the like are text, not line ends
        texts = data.split("\n") if data else []
        if data.endswith("\n"):
            texts.pop()
        texts = [t.removesuffix("\r") for t in texts]
    if not texts:
        raise UserError("no text to embed: give TEXT arguments, or lines on standard input")
    blank = next((i for i, t in enumerate(texts) if not t.strip()), None)
    if blank is not None:
        where = "of standard input " if what == "line" else ""
        raise UserError(f"{what} {blank + 1} {where}is blank: each text gets one output line, "
                        "and a blank one has nothing to embed (remove blank lines first)")
    return texts


def run(args, out):
    texts = texts_of(args)
    model, tokenizer, _ = load(args)
    hidden_size = model.config.hidden_size
    if args.dimensions is not None and args.dimensions > hidden_size:
        raise UserError(f"--dimensions is {args.dimensions}; this model's embeddings have "
                        f"{hidden_size}")
    prompts = [tokenizer.encode(t, add_special_tokens=True) for t in texts]
    for i, ids in enumerate(prompts):
        if not ids:
            raise UserError(f"text {i + 1} has no tokens")
        if len(ids) > model.max_len:
            raise UserError(f"text {i + 1} has {len(ids)} tokens; the context is "
                            f"{model.max_len} (--max-len)")
    for vector in embed(model, prompts, args.dimensions):
        print(json.dumps(vector), file=out)
    return 0


def embed(model, prompts: list[list[int]], dimensions: int | None = None) -> list[list[float]]:
    """The prompts' embeddings, in order, run together on an LLMEngine of the model."""
    from tileinfer import LLMEngine

    from .embedding import embedding

    engine = LLMEngine(model)
    try:
        rids = [engine.add_request(ids, max_new_tokens=0, hidden_state=True) for ids in prompts]
        found = {}
        while engine.has_unfinished():
            for output in engine.step():
                if output.finish_reason == "error":
                    raise RuntimeError(f"embedding failed: {output.error}")
                found[output.request_id] = output.hidden_state
    finally:
        engine.close()
    return [embedding(found[rid], dimensions) for rid in rids]
