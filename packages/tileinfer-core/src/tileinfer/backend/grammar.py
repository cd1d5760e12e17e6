"""Structured outputs: a grammar that the sampled tokens must follow (JSON, a JSON schema, a
regular expression or a Lark grammar), through the llguidance library (the ``structured`` extra).

``compile_grammar(tokenizer, ...)`` gives a ``Grammar``: the request checked and compiled for
that tokenizer, once per (grammar, tokenizer) (a cache). It goes into
``SamplingParams(structure=grammar)``; each generation then runs a ``GrammarMatcher`` of it:
before each sampled token the matcher's allowed-token bitmask sets every disallowed logit to
-inf (``allowed_rows`` / ``mask_logits``), after it the matcher takes the token. EOS (the
tokenizer's, and every stop id of the generation) is allowed only where the grammar accepts;
a grammar with nothing left to match ends the generation (``GrammarMatcher.done``).

A thinking model (Qwen3, DeepSeek-R1's distills: ``<think>`` and ``</think>`` are tokens of its
vocabulary) thinks before it answers; ``think`` lets a JSON answer wait for that: "optional",
a think block may come first; "open", the prompt opened one and the answer starts inside it.
The thinking is free text up to ``</think>``, the JSON comes after (Lark: the block, then the
schema by ``%json``), as vLLM starts a structured answer after the reasoning.

The bitmask is llguidance's: (words,) int32 with words = ceil(tokenizer vocab / 32), bit b of
word w allowing token 32 * w + b. Model vocabularies padded past the tokenizer's get their extra
ids disallowed.
"""

from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass, field

import torch

from .schema_numbers import bounded_numbers

KINDS = ("json_object", "json_schema", "regex", "lark")
_CACHE_SIZE = 256
# Compact JSON, no free whitespace: a sampled model cannot pad its output with blanks.
_JSON_OPTIONS = {"whitespace_flexible": False}


class GrammarError(ValueError):
    """A grammar request that is malformed or that the library cannot compile."""


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise ImportError("structured outputs need the llguidance package: "
                          "pip install 'tileinfer-core[structured]'") from None
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """A compiled grammar request: kind (one of ``KINDS``), spec (the schema as canonical JSON,
    the regex or the Lark text; "" for json_object), the llguidance grammar it compiled to and
    the tokenizer it is for (compared by identity)."""

    kind: str
    spec: str
    compiled: str = field(repr=False)
    tokenizer: object = field(repr=False, compare=False)
    token_key: int = field(repr=False, default=0)
    think: str | None = None  # None, "optional" or "open" (see the module docstring)

    def matcher(self, stop_ids=()) -> GrammarMatcher:
        return GrammarMatcher(self, stop_ids)


_ll_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_grammars: dict = {}
_compiling: dict = {}  # key -> the lock its one compiling thread holds
_lock = threading.Lock()


def ll_tokenizer(tokenizer):
    """llguidance's tokenizer for a ``tileinfer.Tokenizer`` (made once per tokenizer: costly for
    a large vocabulary)."""
    ll = _llguidance()
    with _lock:
        found = _ll_tokenizers.get(tokenizer)
        if found is None:
            eos = tokenizer.eos_token_id
            found = ll.LLTokenizer(tokenizer.backend.to_str(), eos_token=eos)
            _ll_tokenizers[tokenizer] = found
        return found


def compile_grammar(tokenizer, *, json_object: bool = False, json_schema=None,
                    regex: str | None = None, lark: str | None = None,
                    think: str | None = None) -> Grammar:
    """The ``Grammar`` of exactly one request: any JSON object (json_object=True), a JSON schema
    (a dict or its JSON text; strict: no properties beyond those it names unless it says so),
    a regular expression the whole output matches, or a Lark grammar (llguidance's dialect,
    which also reads GBNF-like rules). think ("optional" or "open", JSON requests of a tokenizer
    with <think> and </think> tokens): the thinking that may come first (module docstring).
    GrammarError for a bad request or one that fails to compile. Cached per (request,
    tokenizer)."""
    given = [k for k, v in (("json_object", json_object), ("json_schema", json_schema),
                            ("regex", regex), ("lark", lark)) if v not in (None, False)]
    if len(given) != 1:
        raise GrammarError(f"give exactly one of json_object, json_schema, regex, lark; "
                           f"got {given or 'none'}")
    kind = given[0]
    _check_think(tokenizer, kind, think)
    if kind == "json_object":
        spec = ""
    elif kind == "json_schema":
        spec = _schema_text(json_schema)
    else:
        spec = regex if kind == "regex" else lark
        if not isinstance(spec, str) or not spec:
            raise GrammarError(f"{kind} must be a non-empty string, got {spec!r}")
    ll_tok = ll_tokenizer(tokenizer)
    key = (kind, spec, id(ll_tok), think)
    with _lock:
        found = _grammars.get(key)
        if found is not None and found.tokenizer is ll_tok:
            return found
        # One compile per key at a time: requests of one schema arriving together wait for
        # the first one's compile instead of each compiling it.
        gate = _compiling.setdefault(key, threading.Lock())
    with gate:
        with _lock:
            found = _grammars.get(key)
        if found is not None and found.tokenizer is ll_tok:
            return found
        try:
            grammar = Grammar(kind, spec, _compile(kind, spec, ll_tok, think), ll_tok, id(ll_tok),
                              think)
            with _lock:
                if len(_grammars) >= _CACHE_SIZE:
                    _grammars.pop(next(iter(_grammars)))
                _grammars[key] = grammar
        finally:
            with _lock:
                _compiling.pop(key, None)
    return grammar


THINK_START, THINK_END = "<think>", "</think>"


def _check_think(tokenizer, kind: str, think):
    if think is None:
        return
    if think not in ("optional", "open"):
        raise GrammarError(f'think must be "optional" or "open", got {think!r}')
    if kind not in ("json_object", "json_schema"):
        raise GrammarError(f"think applies to json_object and json_schema, not {kind}")
    if any(tokenizer.token_to_id(tag) is None for tag in (THINK_START, THINK_END)):
        raise GrammarError("think needs <think> and </think> tokens in the vocabulary")


def _after_thinking(schema: dict, think: str) -> str:
    """The Lark grammar of the thinking (free text up to </think>, then blanks) and then JSON of
    ``schema``, compact as the JSON requests are."""
    schema = {**schema, "x-guidance": {**schema.get("x-guidance", {}), **_JSON_OPTIONS}}
    block = f"/(?s:.*)/ {THINK_END} /[ \\t\\n]*/"
    start = f"start: {block} body" if think == "open" else f"start: ({THINK_START} {block})? body"
    return f"{start}\nbody: %json {json.dumps(schema)}\n"


def _schema_text(schema) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"json_schema is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise GrammarError(f"json_schema must be a JSON object (a schema), got "
                           f"{type(schema).__name__}")
    # the keys in the order given: llguidance writes an object's properties in its schema's
    # order (as OpenAI's structured outputs do), and two orders are two grammars in the cache
    return json.dumps(schema, separators=(",", ":"))


def _compile(kind: str, spec: str, ll_tok, think: str | None = None) -> str:
    ll = _llguidance()
    M = ll.LLMatcher
    try:
        if think is not None:
            schema = {"type": "object"} if kind == "json_object" else \
                bounded_numbers(json.loads(spec))
            grammar = M.grammar_from_lark(_after_thinking(schema, think))
        elif kind == "json_object":
            grammar = M.grammar_from_json_schema('{"type":"object"}', defaults=_JSON_OPTIONS)
        elif kind == "json_schema":  # numbers with at most 6 fraction digits: schema_numbers
            schema = json.dumps(bounded_numbers(json.loads(spec)))
            grammar = M.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
        elif kind == "regex":
            grammar = M.grammar_from_regex(spec)
        else:
            grammar = M.grammar_from_lark(spec)
    except (ValueError, TypeError, RuntimeError) as e:
        raise GrammarError(f"bad {kind}: {e}") from None
    ok, is_error, messages = _validate(M, grammar, ll_tok)
    if not ok:
        raise GrammarError(f"bad {kind}: {messages}")
    return grammar


def _validate(M, grammar, ll_tok):
    try:
        is_error, messages = M.validate_grammar_with_warnings(grammar, ll_tok)
    except (ValueError, TypeError, RuntimeError) as e:
        return False, True, str(e)
    if is_error:
        return False, True, "; ".join(messages) if isinstance(messages, list) else messages
    # A grammar that validates may still fail to build (limits): build one matcher now.
    m = M(ll_tok, grammar, log_level=0)
    if m.is_error():
        return False, True, m.get_error()
    return True, False, ""


class GrammarMatcher:
    """One generation's position in a grammar. ``fill(words)`` writes the allowed-token bitmask
    for the next token into a (words,) int32 CPU tensor; ``advance(token)`` takes the sampled
    token (False: the grammar rejects it); ``done``: nothing but the end can follow."""

    def __init__(self, grammar: Grammar, stop_ids=()):
        ll = _llguidance()
        self.grammar = grammar
        self.matcher = ll.LLMatcher(grammar.tokenizer, grammar.compiled, log_level=0)
        self.stop_ids = sorted({int(i) for i in stop_ids})
        self.words = (grammar.tokenizer.vocab_size + 31) // 32
        self.consumed = 0  # tokens taken so far

    def fill(self, out: torch.Tensor):
        self.matcher.unsafe_compute_mask_ptr(out.data_ptr(), out.numel() * out.element_size())
        self.allow_stops(out)

    def allow_stops(self, out: torch.Tensor):
        """Set the generation's own stop ids in the mask ``out`` (words,) where the grammar
        accepts: they end it like EOS."""
        if self.stop_ids and self.matcher.is_accepting():
            for i in self.stop_ids:
                if i < 32 * self.words:
                    out[i // 32] |= _bit(i % 32)

    def advance(self, token: int) -> bool:
        ok = self.matcher.consume_token(int(token))
        self.consumed += 1
        return bool(ok) and not self.matcher.is_error()

    @property
    def accepting(self) -> bool:
        return self.matcher.is_accepting()

    @property
    def done(self) -> bool:
        """The grammar ended the output (it was stopped, e.g. by taking EOS)."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str:
        return self.matcher.get_error()


_executor = None


def _parallel():
    """llguidance's thread pool for the masks of many matchers at once (made on first use)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = _llguidance().LLExecutor()
        return _executor


def fill_masks(matchers: list[GrammarMatcher], out: torch.Tensor):
    """Each matcher's ``fill`` into row i of ``out`` (len(matchers), words) int32 CPU
    (contiguous), computed in parallel on llguidance's threads, outside the GIL."""
    if not matchers:
        return
    words = matchers[0].words
    if out.shape != (len(matchers), words) or not out.is_contiguous() or out.dtype != torch.int32:
        raise ValueError(f"fill_masks needs a contiguous ({len(matchers)}, {words}) int32 tensor")
    _parallel().unsafe_compute_mask_ptr([(m.matcher, i) for i, m in enumerate(matchers)],
                                        out.data_ptr(), words * 4, len(matchers))
    for i, m in enumerate(matchers):
        m.allow_stops(out[i])


def _bit(b: int) -> int:
    """Bit b of an int32 word as a Python int in int32 range (bit 31 is the sign)."""
    return -(1 << 31) if b == 31 else 1 << b


def allowed_rows(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """(n, vocab) bool from bitmasks (n, words) int32 (on any device; no host read): token i
    is allowed when bit i % 32 of word i // 32 is set; ids past 32 * words are not."""
    bits = torch.arange(32, dtype=torch.int32, device=words.device)
    allowed = ((words[:, :, None] >> bits) & 1).bool().reshape(words.shape[0], -1)
    if allowed.shape[1] >= vocab:
        return allowed[:, :vocab]
    pad = torch.zeros(words.shape[0], vocab - allowed.shape[1], dtype=torch.bool,
                      device=words.device)
    return torch.cat([allowed, pad], dim=1)


def mask_logits(logits: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """A new (n, vocab) float32 tensor: logits (n, vocab) with disallowed tokens at -inf."""
    allowed = allowed_rows(words, logits.shape[1])
    return torch.where(allowed, logits.float(), float("-inf"))
