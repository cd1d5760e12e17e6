"""Sampling: the exact definition every backend's ``sample_tokens`` / ``accept_tokens`` follows.

A sampled token is a function of the logits row, the sampling parameters and a counter-based
random stream ``(seed, counter)``: no hidden generator state, so the host (``sample_host``) and a
device kernel pick the same token, pipelined or not, captured in a graph or not.

Randomness. ``uniform(seed, counter, index)`` hashes the three integers with a 32-bit integer mixer
(``mix32``, the "lowbias32" construction with constants below 2**31 so that products fit in
int64) and maps the top 23 bits to ``(h + 0.5) / 2**23`` in (0, 1), exactly representable in
float32 (with 24 bits, ``2**24 - 0.5`` would round up to 2**24 and give u = 1, an infinite
noise). Token ``i`` of a row gets the Gumbel noise ``-log(-log(uniform(seed, counter, i)))``.

Before any of this, a row sampled with logit bias, penalties or min_p goes through
``tileinfer.backend.logit_processing`` (``sample_host`` applies it; the sampling ops see its result).

Filtering (temperature > 0). ``s = logits * float32(1 / temperature)`` (a multiply, exactly rounded
on every device). top_k > 0 keeps ``s >= t_k`` where t_k is the k-th largest value of s (ties
kept). top_p < 1 then keeps ``s >= t_p``, where t_p is the largest value of s whose upper set
``{s >= t_p}`` within the kept tokens holds at least top_p of the kept mass
``sum exp(s - max s)``. Both thresholds are found by bisection over the float32 bit patterns of s
(32 steps of counting / summing over the vocabulary), so no sort of the vocabulary is needed.
The token is ``argmax over kept of s_i + gumbel_i`` (the Gumbel-max trick: a sample of
softmax(s) restricted to the kept set). Temperature 0 is plain argmax, lowest index on ties.

Speculative acceptance (the p/q rule, Leviathan et al. 2023 / Chen et al. 2023): with p the
target's filtered distribution and q the draft's, accept draft d when
``uniform(seed, counter, ACCEPT_SALT) * q[d] < p[d]``, else sample ``max(p - q, 0)`` by Gumbel-max
with the same per-token noise. Host and device agree except when two candidates' scores tie to
within float32 rounding of ``log`` (about one token in a million).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .logit_processing import process_host

MASK32 = 0xFFFFFFFF
# The index hashed for the acceptance uniform: no token id reaches it.
ACCEPT_SALT = 0xFFFFFFFF
_MUL1 = 0x7FEB352D
_MUL2 = 0x1B873593
_GOLDEN = 0x9E3779B9


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy; top_k 0 and top_p 1 disable those filters.

    The logit processing options (``tileinfer.backend.logit_processing`` defines them exactly,
    in vLLM's order: logit_bias, repetition, frequency and presence penalties on the logits,
    then temperature, then min_p, top_k and top_p):

    - presence_penalty, frequency_penalty in [-2, 2] (OpenAI's): subtracted from the logit of
      every token the output so far holds, once (presence) and once per occurrence (frequency);
    - repetition_penalty > 0 (HF's and vLLM's; 1 is off): the logits of tokens of the prompt or
      the output so far are divided by it when positive, multiplied by it otherwise;
    - logit_bias: token id -> a bias in [-100, 100] added to its logit; given as a mapping (or
      (id, bias) pairs), kept as a sorted tuple of pairs so that the parameters stay hashable;
    - min_p in [0, 1] (0 is off): keeps the tokens whose probability is at least min_p times the
      most likely token's (it does not change a greedy choice).

    structure: a ``tileinfer.backend.grammar.Grammar`` (``compile_grammar``: JSON, a JSON
    schema, a regex or a Lark grammar, for a tokenizer) that the output must follow: each
    step's disallowed tokens get -inf after the processing above, before the sampling op.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple = ()
    min_p: float = 0.0
    structure: object = None

    def __post_init__(self):
        t, k, p = self.temperature, self.top_k, self.top_p
        if not _finite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {k!r}")
        if not isinstance(p, (int, float)) or math.isnan(p) or not 0 < p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _finite(v) or not -2 <= v <= 2:
                raise ValueError(f"{name} must be a number in [-2, 2] (0 disables it), got {v!r}")
        r = self.repetition_penalty
        if not _finite(r) or r <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 disables it), "
                             f"got {r!r}")
        if not _finite(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be a number in [0, 1] (0 disables it), got "
                             f"{self.min_p!r}")
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        if self.structure is not None:
            from .grammar import Grammar
            if not isinstance(self.structure, Grammar):
                raise ValueError(f"structure must be a Grammar (tileinfer.compile_grammar), got "
                                 f"{type(self.structure).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def inv_temperature(self) -> float:
        """1 / temperature rounded to float32: the factor every backend multiplies logits by."""
        return float(torch.tensor(1.0 / self.temperature, dtype=torch.float32))

    @property
    def penalized(self) -> bool:
        """Whether a penalty needs the tokens seen so far (presence, frequency, repetition)."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)

    @property
    def structured(self) -> bool:
        """Whether a grammar masks the tokens (read from the host at every step)."""
        return self.structure is not None

    @property
    def processes_logits(self) -> bool:
        """Whether the logits go through ``logit_processing`` before the sampling op: a penalty,
        a logit bias, or min_p when sampling (min_p keeps the greedy token)."""
        return self.penalized or bool(self.logit_bias) or (self.min_p > 0 and not self.greedy)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _bias_pairs(bias) -> tuple:
    """logit_bias as sorted (token id, bias) pairs, each id once, each bias in [-100, 100]."""
    items = bias.items() if hasattr(bias, "items") else bias
    try:
        pairs = [(i, b) for i, b in items]
    except (TypeError, ValueError):
        raise ValueError(f"logit_bias must map token ids to biases, got {bias!r}") from None
    out = {}
    for i, b in pairs:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {i!r}")
        if not _finite(b) or not -100 <= b <= 100:
            raise ValueError(f"logit_bias of token {i} must be a number in [-100, 100], got {b!r}")
        if i in out:
            raise ValueError(f"logit_bias names token {i} twice")
        out[i] = float(b)
    return tuple(sorted(out.items()))


# --- the counter-based random stream -----------------------------------------------------------


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer hash on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _MUL1) & MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL2) & MASK32
    return x ^ (x >> 16)


def stream_key(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """The 32-bit key of stream (seed, counter); seed and counter are int64 tensors (broadcast)."""
    key = mix32((seed & MASK32) ^ _GOLDEN)
    key = mix32(key ^ ((seed >> 32) & MASK32))
    return mix32(key ^ (counter & MASK32))


def uniform_bits(key: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """23 random bits for (stream key, index), as int64."""
    return mix32(mix32(key ^ index)) >> 9


def bits_to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """(bits + 0.5) / 2**23 in float32: strictly inside (0, 1) for every 23-bit value."""
    return (bits.to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def uniform(seed, counter, index) -> torch.Tensor:
    """A float32 uniform in (0, 1) for (seed, counter, index); arguments are ints or int64 tensors."""
    as_t = lambda v: torch.as_tensor(v, dtype=torch.int64)  # noqa: E731
    return bits_to_uniform(uniform_bits(stream_key(as_t(seed), as_t(counter)), as_t(index)))


def gumbel_noise(key: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel noise for tokens 0..vocab-1 of each stream key: key (n, 1) -> (n, vocab) float32."""
    index = torch.arange(vocab, dtype=torch.int64, device=key.device)
    return -torch.log(-torch.log(bits_to_uniform(uniform_bits(key, index))))


# --- filtering ---------------------------------------------------------------------------------


def _order_key(x: torch.Tensor) -> torch.Tensor:
    """Map float32 values to int64 keys with the same order (negative floats flip their bits)."""
    bits = x.view(torch.int32).to(torch.int64)
    return torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


def _bisect_threshold(keys: torch.Tensor, enough) -> torch.Tensor:
    """Largest integer key t (per row) such that ``enough(keys >= t)`` holds; keys (n, vocab).

    ``enough`` maps a boolean mask (n, vocab) to a boolean (n,) and must be monotone (true for
    low thresholds). 32 bisection steps over the int32 range, no data-dependent control flow.
    """
    lo = torch.full(keys.shape[:1], -(1 << 31), dtype=torch.int64, device=keys.device)  # enough
    hi = torch.full_like(lo, 1 << 31)  # not enough (above every key)
    for _ in range(32):
        mid = (lo + hi) // 2
        ok = enough(keys >= mid[:, None])
        lo = torch.where(ok, mid, lo)
        hi = torch.where(ok, hi, mid)
    return lo


def filtered_scores(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Scaled logits s with -inf outside the kept set; logits (n, vocab) float32, temperature > 0."""
    return _filtered(logits, params.inv_temperature, params.top_k, params.top_p)


def _filtered(logits, inv_temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """filtered_scores with the factor float32(1 / temperature) given (a float32 value)."""
    s = logits.float() * inv_temperature
    keys = _order_key(s)
    kept = torch.ones_like(s, dtype=torch.bool)
    if 0 < top_k < s.shape[-1]:
        t_k = _bisect_threshold(keys, lambda m: m.sum(-1) >= top_k)
        kept = keys >= t_k[:, None]
    if top_p < 1:
        m = torch.where(kept, s, -math.inf).amax(-1, keepdim=True)
        e = torch.where(kept, torch.exp(s - m), 0.0)
        need = top_p * e.sum(-1)
        t_p = _bisect_threshold(keys, lambda mask: torch.where(mask, e, 0.0).sum(-1) >= need)
        kept = kept & (keys >= t_p[:, None])
    return torch.where(kept, s, -math.inf)


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution ``sample_tokens`` samples from: (n, vocab) float32, rows sum to 1.

    Greedy parameters give the one-hot of the argmax.
    """
    if params.greedy:
        ids = logits.argmax(-1, keepdim=True)
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(1, ids, 1.0)
    return torch.softmax(filtered_scores(logits, params), dim=-1)


# --- the host sampler (and the ref backend's implementation) ------------------------------------


def _row_keys(seed: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    rows = torch.arange(n, dtype=torch.int64, device=counter.device)
    return stream_key(seed.reshape(1), counter.reshape(1) + rows)[:, None]  # (n, 1)


def sample_rows(logits, params: SamplingParams, seed, counter, probs_out=None) -> torch.Tensor:
    """Token ids (n,) int64 for logits (n, vocab) with streams (seed, counter + j); pure torch.

    seed, counter: int64 tensors of one element on the logits' device. Writes the filtered
    distribution into probs_out if given.
    """
    if params.greedy:
        ids = logits.argmax(-1)
        if probs_out is not None:
            probs_out.zero_().scatter_(1, ids[:, None], 1.0)
        return ids
    s = filtered_scores(logits, params)
    if probs_out is not None:
        probs_out.copy_(torch.softmax(s, dim=-1))
    noise = gumbel_noise(_row_keys(seed, counter, logits.shape[0]), logits.shape[-1])
    return (s + noise).argmax(-1)


def row_parameters(params: list[SamplingParams]) -> tuple[list, list, list]:
    """The per-row parameters of ``sample_per_row`` (the op and its definition) for a list of
    SamplingParams: float32(1 / temperature) (0 for a greedy row), top_k, float32(top_p)."""
    inv_t = [0.0 if p.greedy else p.inv_temperature for p in params]
    return inv_t, [p.top_k for p in params], [p.top_p for p in params]


def sample_per_row(logits, inv_temperature, top_k, top_p, seed, counter) -> torch.Tensor:
    """Token ids (n,) int64 for logits (n, vocab), row j sampled with its own parameters and
    stream: inv_temperature (n,) float32 (0: greedy), top_k (n,) int (0: off), top_p (n,)
    float32 (1: off), seed and counter (n,) int64; row j is ``sample_rows`` of that row alone
    with SamplingParams of those values and the stream (seed[j], counter[j]). Pure torch, one
    row at a time (the parameters are read on the host)."""
    inv_t, ks, ps = inv_temperature.tolist(), top_k.tolist(), top_p.tolist()
    ids = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    for j in range(logits.shape[0]):
        row = logits[j:j + 1]
        if inv_t[j] == 0:
            ids[j] = row.argmax(-1)[0]
            continue
        s = _filtered(row, inv_t[j], int(ks[j]), ps[j])
        ids[j] = (s + gumbel_noise(_row_keys(seed[j], counter[j], 1), row.shape[-1])).argmax(-1)[0]
    return ids


def accept_rows(logits, draft_ids, draft_probs, params: SamplingParams, seed, counter):
    """The p/q rule for each row (see the module docstring): token ids (n,) int64."""
    n, vocab = logits.shape
    d = draft_ids.long()[:, None]
    p = filtered_probs(logits, params)
    if draft_probs is None:
        q = torch.zeros_like(p).scatter_(1, d, 1.0)
    else:
        q = draft_probs.float()
    keys = _row_keys(seed, counter, n)
    u = bits_to_uniform(uniform_bits(keys[:, 0], torch.tensor(ACCEPT_SALT, device=keys.device)))
    p_d, q_d = p.gather(1, d)[:, 0], q.gather(1, d)[:, 0]
    accept = u * q_d < p_d
    residual = torch.clamp(p - q, min=0.0)
    # When p == q exactly the residual is empty; acceptance is then certain, so any fill works.
    score = torch.where(residual > 0, torch.log(residual), -math.inf) + gumbel_noise(keys, vocab)
    return torch.where(accept, d[:, 0], score.argmax(-1))


def sample_host(logits, params: SamplingParams, seed: int, counter: int, prompt=(),
                output=()) -> int:
    """The token the device samples from one logit row (vocab,) for stream (seed, counter).
    prompt, output: the token ids before the output and the output so far, which the penalties
    read (``logit_processing``; only when params.processes_logits)."""
    row = logits.detach().float().cpu().reshape(1, -1)
    if params.processes_logits:
        row = process_host(row, params, prompt, output)
    ids = sample_rows(row, params, torch.tensor([seed]), torch.tensor([counter]))
    return int(ids[0])


def accept_host(logits, draft: int, draft_probs, params: SamplingParams, seed: int, counter: int):
    """The token a verify step emits at a position drafted as ``draft`` (see accept_rows)."""
    row = logits.detach().float().cpu().reshape(1, -1)
    q = None if draft_probs is None else draft_probs.detach().float().cpu().reshape(1, -1)
    ids = accept_rows(row, torch.tensor([draft]), q, params, torch.tensor([seed]), torch.tensor([counter]))
    return int(ids[0])
