"""``tileinfer run [MODEL] [PROMPT]``: answer one prompt, streaming the reply (or as JSON)."""

from __future__ import annotations

import io
import json
import sys
import time

from .cuda_start import start_cuda_in_background
from .errors import UserError
from .log_record import model_reference, options_of
from .logs import Log, add_log_flag, new_conversation_id
from .options import (add_model_options, add_sampling_options, add_speculative_options,
                      kv_cache_from, load, sampling_from, seed_from, speculative_from,
                      warm_up_on_gpu)
from .reasoning import HiddenThinking, prompt_is_thinking
from .startup import Clock
from .stops import StopStringFound, StopWriter
from .structure_options import add_structure_options, with_structure
from .templates import add_template_options, check_template_options, template_from
from .text_input import checked_text, read_file, read_stdin, stdin_is_terminal
from .thinking_switch import check_thinking_switch

EPILOG = """\
The prompt comes from the command line, from --file, or from standard input ("-", or when no
prompt is given and standard input is not a terminal). Text piped in beside a prompt argument
comes first, then a blank line, then the argument: cat notes.txt | tileinfer run "Summarize".

examples:
  tileinfer run "What is the capital of France?"
  echo "What is the capital of France?" | tileinfer run
  cat notes.txt | tileinfer run "Summarize these notes in three bullets."
  tileinfer run -m Qwen/Qwen3-0.6B --system "Answer in one word." "Capital of Italy?"
  tileinfer run -f question.txt --stop $'\\n\\n' --max-new-tokens 200
  tileinfer run --json "Name three colours" | jq -r .text
  tileinfer run --raw "The three primary colours are"     no chat template: plain completion
  tileinfer run --chat-template chatml.jinja "Hi"
  tileinfer run SmolLM2-135M-Instruct "Hi" --threads 2 --seed 7 --temperature 0.7
  tileinfer run -o temperature 0.7 -o top_p 0.9 -o max_tokens 100 "Write a haiku"
  tileinfer run --json-schema person.json "Describe a person as JSON"

--json prints one object: text (with --hide-thinking, the answer without its reasoning, which
comes apart as reasoning), tokens (the answer's token ids), prompt_tokens, conversation_id
(the log's: tileinfer logs --cid ID), finish_reason
("stop": an end token or a --stop string; "length": --max-new-tokens or --max-len reached),
stop (the stop string found, or null), model, backend and timings in seconds: load (the
process's start to the loaded model), time_to_first_token (from the prompt's ids to the first
token), generate (the whole generation), tokens_per_second (decode, after the first token),
from_start_to_first_token, and startup: the parts of the time to the first token (start: the
interpreter and the command's own imports; import_torch; import_tileinfer; load_model; warm_up:
on a GPU, a short generation after a made-up prompt that loads the kernels and captures the
decode step, as llama.cpp's tools do at load; prompt: template and tokenizer; first_token).
"""


def add_parser(sub, formatter):
    p = sub.add_parser("run", help="answer one prompt, streaming the reply",
                       description="Answer one prompt, streaming the reply.", epilog=EPILOG,
                       formatter_class=formatter)
    p.add_argument("words", nargs="*", metavar="[MODEL] [PROMPT]",
                   help='the prompt ("-": standard input), optionally preceded by the model '
                   "(a lone word naming a model here is the model when the prompt is piped in)")
    p.add_argument("--file", "-f", metavar="PATH", help='read the prompt from a file ("-": '
                   "standard input; text piped in goes before it, as before an argument)")
    p.add_argument("--system", "-s", metavar="TEXT", help="a system message before the prompt")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end the answer where the model writes TEXT (not printed; repeatable)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object after the answer instead of streaming it")
    p.add_argument("--stats", action="store_true",
                   help="print token counts and speed to standard error after")
    add_log_flag(p)
    add_template_options(p, raw=True)
    add_model_options(p)
    add_sampling_options(p)
    add_speculative_options(p)
    add_structure_options(p)
    p.set_defaults(func=run)


def prompt_and_model(args) -> tuple[str, str | None]:
    """(prompt text, model or None) from the positional words, --file and standard input."""
    words = [checked_text(w, "the command line") for w in args.words]
    if len(words) > (1 if args.file is not None else 2):
        raise UserError('quote the prompt: tileinfer run [MODEL] "PROMPT"' if args.file is None
                        else "with --file, give at most the model positionally")
    model = args.model
    if len(words) == 2 or (args.file is not None and words) or (
            len(words) == 1 and not model and not stdin_is_terminal() and names_a_model(words[0])):
        if model:
            raise UserError("give the model either as --model or positionally, not both")
        model, words = words[0], words[1:]  # `echo PROMPT | tileinfer run MODEL`, as ollama
    if args.file is not None:
        prompt = read_file(args.file)
        if args.file != "-" and not stdin_is_terminal():
            prompt = joined_with_stdin(prompt)
    elif words and words[-1] != "-":
        prompt = words[-1]
        if not stdin_is_terminal():
            prompt = joined_with_stdin(prompt)
    elif words or not stdin_is_terminal():
        prompt = read_stdin()
    else:
        raise UserError('no prompt: tileinfer run "PROMPT", or pipe it in, or --file PATH')
    if not prompt.strip():
        raise UserError("the prompt is empty")
    return prompt.strip("\n"), model


def names_a_model(word: str) -> bool:
    """Whether a lone word is a model here: the default model's name, an imported model's, a
    model folder or a .gguf file (never the hub: a word of a prompt is not looked up)."""
    from pathlib import Path

    from tileinfer.io.default_model import DEFAULT_MODEL_NAME
    from tileinfer.io.local_models import is_plain_name, local_model_dir

    path = Path(word).expanduser()
    return (word == DEFAULT_MODEL_NAME or (path.suffix == ".gguf" and path.is_file())
            or (path / "config.json").is_file()
            or (is_plain_name(word) and local_model_dir(word) is not None))


def joined_with_stdin(prompt: str) -> str:
    """Piped text first, a blank line, then the prompt (``cat notes.txt | tileinfer run
    "Summarize"``), as simonw's llm joins them; the prompt alone when nothing was piped."""
    piped = read_stdin().strip("\n")
    return f"{piped}\n\n{prompt}" if piped.strip() else prompt


def run(args, out):
    clock = Clock()
    clock.mark("start")
    prompt, args.model = prompt_and_model(args)
    system = checked_text(args.system, "--system") if args.system is not None else None
    stops = [checked_text(s, "--stop") for s in args.stop]
    if any(not s for s in stops):
        raise UserError("--stop needs a non-empty text")
    check_template_options(args)
    check_thinking_switch(args)
    start_cuda_in_background(args.backend)
    import torch  # noqa: F401  (timed apart: it is most of a new process's start)

    clock.mark("import_torch")
    import tileinfer  # noqa: F401

    clock.mark("import_tileinfer")
    model, tokenizer, folder = load(args)
    loaded = clock.mark("load_model")
    sampling, stop_ids = sampling_from(args, folder, model.config)
    sampling = with_structure(args, sampling, tokenizer)
    seed = seed_from(args, sampling)
    from tileinfer import ChatMessage, SpecStats, TextStream, chat_prompt, generate

    kv_cache, key_smoothing = kv_cache_from(args, model)
    speculative = speculative_from(args, model, sampling)
    warm_up_on_gpu(model, sampling, kv_cache, key_smoothing, speculative)
    clock.mark("warm_up")

    template = template_from(args, folder)
    if template is None:
        ids = tokenizer.encode(prompt, add_special_tokens=True)
    else:
        template_kwargs = {} if args.thinking is None else {"enable_thinking": args.thinking}
        messages = (([ChatMessage("system", system)] if system else [])
                    + [ChatMessage("user", prompt)])
        text = chat_prompt(template, messages, add_generation_prompt=True, **template_kwargs)
        ids = tokenizer.encode(text, add_special_tokens=False)
    room = model.max_len - len(ids)
    if room < 1:
        raise UserError(f"the prompt is {len(ids)} tokens; --max-len {model.max_len} leaves no "
                        "room for an answer")
    limit = min(args.max_new_tokens, room)
    spec = SpecStats() if speculative is not None else None
    sink = io.StringIO() if args.json else out
    shown = None
    if args.hide_thinking:
        shown = HiddenThinking(sink, prompt_is_thinking(prompt if template is None else text))
    writer = StopWriter(stops, shown or sink)
    stream = TextStream(tokenizer, writer)
    new, first = [], []

    def on_token(token):
        if not first:
            first.append(clock.mark("first_token"))
        new.append(token)
        stream.put(token)

    prepared = clock.mark("prompt")
    try:
        generate(model, ids, limit, sampling, stop_ids=stop_ids, seed=seed,
                 on_token=on_token, kv_quantize=kv_cache, key_smoothing=key_smoothing,
                 speculative=speculative, spec_stats=spec)
        stream.end()
    except StopStringFound:
        pass
    writer.end()
    if shown is not None:
        shown.end()
    done = time.perf_counter()
    seconds = done - prepared
    finish = "stop" if writer.found is not None or len(new) < limit else "length"
    decode_s = done - first[0] if first else 0.0
    rate = (len(new) - 1) / decode_s if len(new) > 1 and decode_s > 0 else 0.0
    cid = new_conversation_id()
    if args.json:
        hidden = {} if shown is None else {"reasoning": shown.reasoning or None}
        print(json.dumps({
            "text": writer.text if shown is None else shown.content, **hidden,
            "tokens": new, "prompt_tokens": len(ids),
            "conversation_id": cid,
            "finish_reason": finish, "stop": writer.found, "model": str(folder),
            "backend": model.ops.name,
            "timings": timings(clock, loaded, prepared, first, seconds, rate),
        }, ensure_ascii=False), file=out)
    else:
        print(file=out)
    out.flush()
    Log(args, "run").write(cid, model=model_reference(args.model, folder),
                           backend=model.ops.name, system=system, prompt=prompt,
                           answer=writer.text, options=options_of(args, sampling, stops, seed),
                           prompt_tokens=len(ids),
                           answer_tokens=len(new),
                           time_to_first_token=first[0] - prepared if first else None,
                           seconds=seconds, finish_reason=finish)
    if args.stats:
        print(f"[{len(ids)} prompt tokens, {len(new)} generated ({finish}), "
              f"{len(new) / seconds if seconds > 0 else 0.0:.1f} tok/s, backend "
              f"{model.ops.name}]", file=sys.stderr)
        parts = clock.parts()
        if first:
            print("[start-up: " + ", ".join(f"{k} {v:.3f} s" for k, v in parts.items()
                                            if k != "decode") + "]", file=sys.stderr)
        if spec is not None:
            print(f"[{spec.summary()}]", file=sys.stderr)
    return 0


def timings(clock: Clock, loaded: float, prepared: float, first: list, seconds: float,
            rate: float) -> dict:
    """The timings of ``--json`` (see the epilog)."""
    start = clock.since_start(loaded)
    return {"load": round(start, 4) if start is not None else None,
            "time_to_first_token": round(first[0] - prepared, 4) if first else None,
            "generate": round(seconds, 4), "tokens_per_second": round(rate, 3),
            "from_start_to_first_token": (round(clock.since_start(first[0]), 4)
                                          if first and start is not None else None),
            "startup": clock.parts()}
