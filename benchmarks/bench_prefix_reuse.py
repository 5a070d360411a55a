"""Tree sampling with KV prefix reuse against re-prefilling every branch's full context.

Workload (the shape of Tree-GRPO sampling, m trees per prompt): a Search-R1 prompt over a real
question; each tree samples a root turn, gets a real Wikipedia ``<information>`` block back,
then is expanded ``--expansions`` times into ``--branches`` branches, each branch taking
``--turns`` turns (every turn answered by another information block). Both policies run the
same calls with the same seeds on SmolLM2-135M (CPU by default):

- reuse: ``HFPolicy`` (shared prefixes prefilled once, each branch's previous turn reused);
- baseline: ``HFPolicy(reuse_prefix=False)``, which prefills each branch's full context every
  turn (what the Tree-GRPO reference code does with ``model.generate``).

Target (issue 3): reuse at least 1.5x faster in wall time.
"""

from __future__ import annotations

import argparse
import time

import torch

from treegym.agents.chat import chat_prompt_ids, text_ids
from treegym.agents.hf_policy import HFPolicy
from treegym.agents.models import load_model
from treegym.agents.policy import SamplingParams
from treegym.envs.react import format_information
from treegym.envs.tree_search_qa import TreeSearchQAEnv
from treegym.retrieval_index.corpus import wiki_documents
from treegym.retrieval_index.qa_files import SEARCH_R1_PROMPT
from treegym.retrieval_index.types import Hit

QUESTION = "Which river flows through the capital city of the country where the Eiffel Tower stands?"


def observations(count: int, words: int) -> list[list[str]]:
    """Real Wikipedia passages grouped into ``count`` information blocks of three."""
    docs = [d for d in wiki_documents()[:200] if len(d.text.split()) >= words][: 3 * count]
    hits = [Hit(str(i), d.title, " ".join(d.text.split()[:words]), 1.0) for i, d in enumerate(docs)]
    return [format_information(hits[3 * i : 3 * i + 3]) for i in range(count)]


def run_tree_workload(policy: HFPolicy, args: argparse.Namespace) -> tuple[float, int]:
    """Sample the whole workload; return (seconds, generated tokens)."""
    tok = policy.tokenizer
    prompt = chat_prompt_ids(tok, [{"role": "user", "content": SEARCH_R1_PROMPT.format(question=QUESTION)}])
    infos = [text_ids(tok, o) for o in observations(args.turns + 1, args.words)]
    seed = 0

    def turn(contexts: list[list[int]], obs: list[int]) -> list[list[int]]:
        nonlocal seed
        seed += 1
        params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, stop=TreeSearchQAEnv.action_stops, seed=seed)
        gens = policy.generate(contexts, params)
        return [c + list(g.token_ids) + obs for c, g in zip(contexts, gens)]

    start = time.perf_counter()
    nodes = turn([prompt] * args.trees, infos[0])  # root turn of every tree
    for _ in range(args.expansions):
        branches = [node for node in nodes for _ in range(args.branches)]
        for t in range(args.turns):
            branches = turn(branches, infos[min(t + 1, len(infos) - 1)])
        # The next expansion forks the first branch of each tree (a node deeper in the tree).
        nodes = branches[:: args.branches]
    return time.perf_counter() - start, policy.stats.generated_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="'smollm2' or a local HF model folder")
    parser.add_argument("--trees", type=int, default=2, help="trees per prompt (m)")
    parser.add_argument("--expansions", type=int, default=2, help="expansion rounds (l)")
    parser.add_argument("--branches", type=int, default=3, help="branches per expanded node")
    parser.add_argument("--turns", type=int, default=1, help="turns each branch takes per expansion")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="tokens per turn at most")
    parser.add_argument("--words", type=int, default=80, help="words per retrieved passage")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_model(args.model)
    results = {}
    for name, reuse in (("baseline (full prefill)", False), ("prefix reuse", True)):
        policy = HFPolicy(model, tokenizer, reuse_prefix=reuse)
        seconds, generated = run_tree_workload(policy, args)
        results[name] = (seconds, policy.stats.prefill_tokens, policy.stats.reused_tokens, generated)

    print(
        f"workload: {args.trees} trees x (root turn + {args.expansions} expansions x {args.branches} branches "
        f"x {args.turns} turn(s)), <= {args.max_new_tokens} new tokens/turn, device {model.device}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"{'policy':<26}{'wall s':>9}{'prefill tok':>13}{'reused tok':>12}{'generated':>11}")
    for name, (seconds, prefill, reused, generated) in results.items():
        print(f"{name:<26}{seconds:>9.2f}{prefill:>13}{reused:>12}{generated:>11}")
    base, reuse = results["baseline (full prefill)"], results["prefix reuse"]
    print(f"prefill tokens: baseline / reuse = {base[1] / max(reuse[1], 1):.2f}x")
    print(f"wall time:      baseline / reuse = {base[0] / reuse[0]:.2f}x  (target >= 1.5x)")


if __name__ == "__main__":
    main()
