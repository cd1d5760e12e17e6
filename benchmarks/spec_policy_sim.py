"""The pipelined n-gram loop's decisions, replayed on the CPU: which steps it launches on each
prompt of ``speculative.py``, and the speed-up those steps would give at given GPU step costs.

The loop (engine/generation/speculative/pipelined.py) decides from its hit rate and from what a
step of n rows costs against a 1-token step. On the GPU it measures that cost; here
``--row-cost`` fixes it (an extra row's cost in 1-token steps: 0.05 is about cuda's on SmolLM2
at 8 rows), so its decisions are deterministic and the same as on the GPU wherever the greedy
tokens are. The real SmolLM2 runs on the ref backend in float32. The estimate: ``--prefill-ms``
plus the cost of every launched step (``--step-ms``: ms by row count, 1..8) for speculation,
against the prefill plus the 1-token steps plain pipelined decoding launches (one per token after
the first, and one with the stop token). It ignores the host's time, which both pay.

    python benchmarks/spec_policy_sim.py --prompts quote_answer,rewrite
"""

from __future__ import annotations

import argparse
import json

import torch

from speculative import POLICY, PROMPTS, policy_settings
from tileinfer import (ChatMessage, ModelRunner, NgramProposer, SamplingParams, SpecStats,
                       chat_prompt, generate_into, load_model, load_tokenizer)
from tileinfer.engine.kv.cache import new_cache
from tileinfer.engine.generation.speculative import pipelined
from tileinfer.engine.generation.speculative.step_costs import DraftPolicy
from tileinfer.io.default_model import default_model_dir
from tileinfer.io.generation_config import generation_defaults

# cuda on the real SmolLM2, graph replays as the loop measured them (35359cc: benchmarks/RESULTS.md,
# 2026-12-02, "The speculative benchmark on the real SmolLM2")
CUDA_STEP_MS = "0.656,0.697,0.733,0.742,0.779,0.830,0.864,0.884"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", default="", help="comma list of speculative.py's prompt names")
    p.add_argument("--row-cost", type=float, default=0.05)
    p.add_argument("--step-ms", default=CUDA_STEP_MS)
    p.add_argument("--prefill-ms", type=float, default=2.0)
    p.add_argument("--policy-ms", default="",
                   help="ms by row count, 1..8, that the loop's cost model sees instead of "
                        "--row-cost (e.g. a warm-up's measurements); the estimate still uses "
                        "--step-ms")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--policy", type=policy_settings, default={},
                   help="the loop's policy instead of NgramProposer's defaults, e.g. "
                   "draft_threshold=0.7 (names: " + ", ".join(POLICY) + ")")
    args = p.parse_args()
    step_ms = [float(x) for x in args.step_ms.split(",")]
    torch.set_num_threads(1)

    launched = []  # every launched step's row count
    loop_launch = pipelined._Loop._launch_step

    def launch(self, step):
        launched.append(step.n)
        return loop_launch(self, step)

    pipelined._Loop._launch_step = launch
    if args.policy_ms:
        policy_ms = [float(x) for x in args.policy_ms.split(",")]
        DraftPolicy._ratio = lambda self, n: policy_ms[min(n, len(policy_ms)) - 1] / policy_ms[0]

    folder = default_model_dir()
    model = load_model(folder, dtype=torch.float32, backend="ref", max_len=2048)
    tokenizer = load_tokenizer(folder)
    _, eos = generation_defaults(folder, model.config)
    names = set(args.prompts.split(",")) if args.prompts else None
    for name, kind, text in PROMPTS:
        if names is not None and name not in names:
            continue
        ids = tokenizer.encode(chat_prompt(folder, [ChatMessage("user", text)]),
                               add_special_tokens=False)
        cache = new_cache(model, len(ids) + args.new_tokens + 64)
        runner = ModelRunner(model, cache)
        launched.clear()
        stats, proposer = SpecStats(), NgramProposer(k=7)
        proposer.row_cost = None if args.policy_ms else args.row_cost
        for setting, value in args.policy.items():
            setattr(proposer, setting, value)
        seq = cache.new_sequence()
        out = generate_into(runner, seq, ids, args.new_tokens, SamplingParams(), stop_ids=eos,
                            seed=0, speculative=proposer, spec_stats=stats)
        cache.release(seq)
        spec = args.prefill_ms + sum(step_ms[min(n, len(step_ms)) - 1] for n in launched)
        # Plain pipelined decoding launches a step per token after the first, and one more
        # with the stop token before it reads it (none after the last token asked for).
        plain_steps = len(out) + 1 if len(out) < args.new_tokens else len(out) - 1
        plain = args.prefill_ms + plain_steps * step_ms[0]
        print(json.dumps(dict(prompt=name, kind=kind, generated=len(out),
                              verify_steps=stats.verify_steps, plain_steps=stats.plain_steps,
                              wasted_steps=stats.wasted_steps, drafted=stats.drafted,
                              accepted=stats.accepted,
                              estimated_speedup=round(plain / spec, 3))), flush=True)

if __name__ == "__main__":
    main()
