"""Do structured outputs hold on a real model? ``tileinfer serve`` (the embedded default model, or
``--model``) answers ``--schemas`` JSON schemas (50 by default: objects of strings with lengths,
enums, integers and numbers with bounds, booleans, arrays, nested objects, optional fields),
each with its own prompt, through the official ``openai`` client with ``response_format``
json_schema, once whole and once streamed; every answer must parse and validate (``jsonschema``).
One JSON object per line (progress on stderr): counts, and the first failures.

    python benchmarks/structured_validity.py --backend ref
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

from serve_load import free_port, log, stop_server, wait_health

TOPICS = ["a person", "a book", "a city", "a recipe", "a product", "a movie", "a planet",
          "a song", "a company", "a car"]
NAMES = ["name", "title", "label", "city", "brand", "author", "country", "genre", "color",
         "owner"]


def field(rng: random.Random, depth: int = 0) -> dict:
    """One property's schema, bounded so that a small model's answer ends."""
    kind = rng.choice(["string", "enum", "integer", "number", "boolean", "array", "object"]
                      if depth == 0 else ["string", "enum", "integer", "boolean"])
    if kind == "string":
        return {"type": "string", "maxLength": rng.choice([8, 16, 24])}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "small", "large", "yes", "no"], 3)}
    if kind == "integer":
        lo = rng.randint(0, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(1, 500)}
    if kind == "number":
        return {"type": "number", "minimum": 0, "maximum": 1000}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        return {"type": "array", "items": field(rng, depth + 1), "maxItems": rng.randint(1, 3)}
    return schema(rng, depth + 1, rng.randint(1, 3))


def schema(rng: random.Random, depth: int = 0, size: int | None = None) -> dict:
    names = rng.sample(NAMES, size or rng.randint(2, 4))
    props = {n: field(rng, depth) for n in names}
    required = [n for n in names if rng.random() < 0.8] or names[:1]
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


def cases(n: int, seed: int = 0) -> list[tuple[dict, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        s = schema(rng)
        topic = TOPICS[i % len(TOPICS)]
        out.append((s, f"Describe {topic} as JSON with the fields "
                       f"{', '.join(s['properties'])}."))
    return out


def ask(client, model: str, s: dict, prompt: str, stream: bool, seed: int) -> str:
    kwargs = dict(model=model, messages=[{"role": "user", "content": prompt}],
                  response_format={"type": "json_schema",
                                   "json_schema": {"name": "answer", "schema": s,
                                                   "strict": True}},
                  max_tokens=300, temperature=0.7, seed=seed)
    if not stream:
        return client.chat.completions.create(**kwargs).choices[0].message.content
    parts = client.chat.completions.create(stream=True, **kwargs)
    return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)


def check(text: str, s: dict) -> str | None:
    try:
        jsonschema.validate(json.loads(text), s)
    except (ValueError, jsonschema.ValidationError) as e:
        return f"{type(e).__name__}: {str(e)[:120]}"
    return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a model folder (default: the embedded default model)")
    p.add_argument("--backend")
    p.add_argument("--schemas", type=int, default=50)
    p.add_argument("--concurrent", type=int, default=8)
    args = p.parse_args(argv)
    import subprocess

    port = free_port()
    cmd = [sys.executable, "-m", "tileinfer_cli", "serve", "--port", str(port),
           "--log-level", "warning", "--max-running", str(args.concurrent)]
    if args.model:
        cmd += ["--model", args.model]
    if args.backend:
        cmd += ["--backend", args.backend]
    log("starting:", " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=sys.stderr, stderr=sys.stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, proc)
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=600, max_retries=0)
        model = client.models.list().data[0].id
        jobs = [(s, prompt, stream, i) for i, (s, prompt) in enumerate(cases(args.schemas))
                for stream in (False, True)]
        with ThreadPoolExecutor(args.concurrent) as pool:
            texts = list(pool.map(lambda j: ask(client, model, j[0], j[1], j[2], j[3]), jobs))
    finally:
        stop_server(proc)
    failures = [(j, t, check(t, j[0])) for j, t in zip(jobs, texts)]
    failures = [(j, t, why) for j, t, why in failures if why is not None]
    row = {"bench": "structured_validity", "schemas": args.schemas, "answers": len(jobs),
           "valid": len(jobs) - len(failures),
           "valid_streamed": sum(1 for j in jobs if j[2]) - sum(1 for j, _, _ in failures if j[2]),
           "first_failures": [{"schema": j[0], "streamed": j[2], "text": t[:200], "why": why}
                              for j, t, why in failures[:3]],
           "example": texts[0]}
    print(json.dumps(row), flush=True)
    log(f"{row['valid']} of {row['answers']} answers valid ({row['valid_streamed']} of "
        f"{len(jobs) // 2} streamed)")


if __name__ == "__main__":
    main()
