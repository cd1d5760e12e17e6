"""From a validated request to what the engine runs: prompt ids, sampling, lengths, stops.

Refused with a 400 that gives the numbers: a prompt that leaves no room in the model's context
(``max_len``), a ``max_tokens`` beyond what the context has left, a template that rejects the
conversation, text that is not valid Unicode. Sampling parameters left out take the server's
defaults (``defaults.py``: generation_config.json's, else OpenAI's); ``max_tokens`` defaults to
what the context has left (chat) or 16 (completions, as OpenAI's legacy endpoint). A completions
request may give a list of prompts (texts or token lists): each gets n choices, indexed in order.
With ``echo`` each choice's text starts with its prompt (the text given, or the ids decoded) and
its ``logprobs`` with the prompt tokens' (the first token's null), which the engine computes from
the prompt's rows (``prompt_logprobs``); ``max_tokens: 0`` then answers the prompt only.
A chat request that offers tools renders them into the prompt and has its answers read for calls
by the served model's tool parser (none: the answers stay text).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import bad_request
from ..reasoning import prompt_is_thinking, tags_are_tokens
from .schemas import ChatRequest, CompletionRequest
from .structured import structure_of
from .tool_grammar import forced_call_grammar
from .tools import check_tools, offered

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
MAX_CHOICES = 256  # prompts x n in one request
INT64 = 2**63
# Logit processing parameters a request may give (SamplingParams' names); left out: off, or for
# those of DEFAULTED the server's default.
PROCESSING = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
DEFAULTED = ("repetition_penalty", "min_p")


@dataclass
class Plan:
    prompts: list[list[int]]  # token ids; several for a completions request's list of prompts
    max_tokens: list[int]  # per prompt; 0: answer without generating (completions)
    sampling: object  # tileinfer.SamplingParams
    seed: int | None
    stops: list[str]
    stop_ids: list[int]
    n: int  # choices per prompt: prompt i's are choices i * n .. i * n + n - 1
    logprobs: int | None  # top log-probabilities per token; None: no logprobs
    stream: bool
    include_usage: bool
    tools: object = None  # the ToolParser reading calls from the answers; None: no tools
    max_tool_calls: int | None = None  # 1: parallel_tool_calls false
    echoes: list[str] | None = None  # per prompt, the text its choices start with (echo)
    reasoning: bool = False  # split each answer's reasoning from its content (../reasoning.py)
    thinking: bool = False  # the prompt ends inside a think block: answers start in reasoning
    min_tokens: int = 0  # no stop token before an answer has this many tokens
    hidden_state: bool = False  # run the prompts only, for their hidden states (embeddings)
    conversation: list | None = None  # a Responses API request's input items so far

    @property
    def prompt_logprobs(self) -> int | None:
        """The top log-probabilities per prompt token the engine reports (echo with logprobs)."""
        return self.logprobs if self.echoes is not None else None

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    def seed_of(self, choice: int) -> int | None:
        """The seed of choice ``choice`` (prompt ``choice // n``'s choice ``choice % n``):
        ``choice_seed(seed, choice % n)``, so that each prompt samples as it would alone; None
        stays random."""
        if self.seed is None:
            return None
        return choice_seed(self.seed, choice % self.n)


MASK64 = 2**64 - 1


def choice_seed(seed: int, j: int) -> int:
    """The seed of a prompt's choice j: the request's seed for j = 0 (the first of n choices is
    the answer of the same request with n = 1), else SplitMix64's mix of seed and j, as a signed
    64-bit integer. seed + j would make choice 1 of seed s the first choice of seed s + 1:
    requests with consecutive seeds would repeat each other's samples."""
    if j == 0:
        return seed
    z = (seed + j * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return z - 2 * INT64 if z >= INT64 else z


def chat_prompt_ids(served, req: ChatRequest) -> tuple[str, list[int]]:
    """The chat request's prompt: its text and token ids."""
    check_tools(req.tools, req.tool_choice)
    text = served.template.render(req.messages, req.template_kwargs(),
                                  req.add_generation_prompt, offered(req.tools, req.tool_choice),
                                  req.continue_final_message)
    try:
        return text, served.tokenizer.encode(text, add_special_tokens=False)
    except ValueError as e:  # a lone surrogate
        raise bad_request(str(e), "messages") from None


def completion_prompts(served, req: CompletionRequest) -> list[list[int]]:
    """The request's prompts as token ids: one text or token list, or a list of them."""
    return token_prompts(served, req.prompt, req.n)


def token_prompts(served, prompt, n: int = 1, param: str = "prompt") -> list[list[int]]:
    """One text or token list, or a list of them, as token ids (texts with the tokenizer's
    special tokens); param: the request's name for them."""
    prompts = prompt if _several(prompt) else [prompt]
    if len(prompts) * n > MAX_CHOICES:
        raise bad_request(f"{len(prompts)} prompts of n={n} choices each: at most "
                          f"{MAX_CHOICES} choices a request", param)
    return [_prompt_ids(served, p, _name(prompt, i, param), param)
            for i, p in enumerate(prompts)]


def _several(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))


def _name(prompt, i: int, param: str = "prompt") -> str:
    return f"{param} {i}" if _several(prompt) else f"the {param}"


def _prompt_ids(served, prompt, what: str, param: str = "prompt") -> list[int]:
    if not prompt:
        raise bad_request(f"{what} is empty", param)
    if isinstance(prompt, str):
        try:
            return served.tokenizer.encode(prompt, add_special_tokens=True)
        except ValueError as e:
            raise bad_request(str(e), param) from None
    vocab = served.vocab_size
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise bad_request(f"token id {bad[0]} of {what} is outside the vocabulary "
                          f"(0..{vocab - 1})", param)
    return list(prompt)


def _max_tokens(served, prompt_len: int, asked: int | None, default: int | None,
                param: str, prompt_param: str, what: str = "the prompt") -> int:
    room = served.max_len - prompt_len
    if room < 1 and not (asked == 0 and room == 0):
        raise bad_request(
            f"{what} has {prompt_len} tokens; this model's context is {served.max_len} "
            "tokens, which leaves no room for an answer", prompt_param, "context_length_exceeded")
    if asked is None:
        return room if default is None else min(default, room)
    if asked > room:
        raise bad_request(
            f"{param} is {asked}, but {what} has {prompt_len} tokens and this model's "
            f"context is {served.max_len} tokens: at most {room} tokens fit", param,
            "context_length_exceeded")
    return asked


def _sampling(served, req, think: str | None = None):
    from tileinfer import SamplingParams

    d = served.defaults
    top_k = d.top_k if req.top_k is None else max(0, req.top_k)  # -1: off, as 0
    top_p = d.top_p if req.top_p is None else req.top_p
    if top_p == 0:  # OpenAI's smallest nucleus: the most probable token alone
        top_k, top_p = 1, 1.0
    if top_k >= served.vocab_size:  # keeps every token: off (and within the kernels' int32)
        top_k = 0
    bias = req.logit_bias_ids()
    outside = [i for i in bias if i >= served.vocab_size]
    if outside:
        raise bad_request(f"logit_bias names token {outside[0]}, outside the vocabulary "
                          f"(0..{served.vocab_size - 1})", "logit_bias")
    structure = structure_of(served, req, think)
    forced = forced_call_grammar(served, getattr(req, "tools", None) or [],
                                 getattr(req, "tool_choice", None),
                                 getattr(req, "parallel_tool_calls", None) is not False)
    if forced is not None:
        if structure is not None:
            raise bad_request("a tool_choice that forces a call cannot be combined with "
                              "response_format or a guided_* grammar", "tool_choice")
        structure = forced
    optional = {name: getattr(req, name) for name in PROCESSING
                if getattr(req, name) is not None}
    for name in DEFAULTED:
        optional.setdefault(name, getattr(d, name))
    try:
        return SamplingParams(temperature=d.temperature if req.temperature is None
                              else req.temperature,
                              top_k=top_k, top_p=top_p,
                              logit_bias=bias, structure=structure, **optional)
    except ValueError as e:
        raise bad_request(str(e)) from None


def _stop_ids(served, req) -> list[int]:
    """The model's end-of-answer ids (none with ignore_eos) and the request's stop_token_ids
    (vLLM's: they stop an answer even with ignore_eos)."""
    extra = list(req.stop_token_ids or [])
    outside = [i for i in extra if not 0 <= i < served.vocab_size]
    if outside:
        raise bad_request(f"stop_token_ids names token {outside[0]}, outside the vocabulary "
                          f"(0..{served.vocab_size - 1})", "stop_token_ids")
    own = [] if req.ignore_eos else list(served.stop_ids)
    return own + [i for i in dict.fromkeys(extra) if i not in own]


def _common(served, req, prompts, max_tokens, logprobs, think=None) -> Plan:
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options needs stream: true", "stream_options")
    sampling = _sampling(served, req, think)
    if req.min_tokens:
        if req.min_tokens > min(max_tokens):
            raise bad_request(f"min_tokens ({req.min_tokens}) is more than max_tokens "
                              f"({min(max_tokens)})", "min_tokens")
        if sampling.structured:
            raise bad_request("min_tokens cannot be combined with a structured output or a "
                              "forced tool call: the grammar decides where the answer ends",
                              "min_tokens")
    return Plan(prompts=prompts, max_tokens=max_tokens, sampling=sampling,
                seed=req.seed, stops=req.stops(), stop_ids=_stop_ids(served, req), n=req.n,
                logprobs=logprobs, stream=req.stream,
                include_usage=bool(req.stream_options and req.stream_options.include_usage),
                min_tokens=req.min_tokens)


def plan_chat(served, req: ChatRequest) -> Plan:
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    if req.max_tokens is not None and req.max_completion_tokens is not None \
            and req.max_tokens != req.max_completion_tokens:
        raise bad_request("max_tokens and max_completion_tokens differ: give one",
                          "max_completion_tokens")
    text, ids = chat_prompt_ids(served, req)
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = _max_tokens(served, len(ids), asked, None, param, "messages")
    thinking = served.reasoning and prompt_is_thinking(text)
    plan = _common(served, req, [ids], [max_tokens],
                   (req.top_logprobs or 0) if req.logprobs else None,
                   _think_mode(served, thinking))
    if offered(req.tools, req.tool_choice) is not None:
        plan.tools = served.tool_parser
        plan.max_tool_calls = 1 if req.parallel_tool_calls is False else None
    plan.reasoning, plan.thinking = served.reasoning, thinking
    return plan


def _think_mode(served, thinking: bool) -> str | None:
    """How a structured answer lets the model think first (``compile_grammar``'s think): when
    the server splits reasoning and both tags are tokens of the vocabulary; "open" when the
    prompt opened the thinking."""
    if not served.reasoning or not tags_are_tokens(served.tokenizer):
        return None
    return "open" if thinking else "optional"


def plan_completion(served, req: CompletionRequest) -> Plan:
    prompts = completion_prompts(served, req)
    max_tokens = [_max_tokens(served, len(ids), req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS,
                              "max_tokens", "prompt", _name(req.prompt, i))
                  for i, ids in enumerate(prompts)]
    plan = _common(served, req, prompts, max_tokens, req.logprobs)
    if req.echo:
        given = req.prompt if _several(req.prompt) else [req.prompt]
        plan.echoes = [p if isinstance(p, str) else served.tokenizer.decode(ids)
                       for p, ids in zip(given, prompts)]
    return plan
