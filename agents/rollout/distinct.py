"""Sibling branches that differ in their move, not in their first token.

An instruct model's turns all open with the same token (SmolLM2's with ``<``), so forcing
siblings apart on the first token forces a malformed opening, not a different move. Here a
branch's first turn is sampled whole, the env parses it (``ForkableEnv.action_key``: the tool
calls and the parsed action, e.g. the search query, the answer, the household command), and a
turn whose move a sibling at the same node already made is sampled again, up to a bound. The
recorded log-probs are the policy's own for the turn kept; only which draws are kept changes
(rejection of repeats), so the siblings are a sample without replacement over moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from treegym.agents.policy import Generation, Policy, SamplingParams
from treegym.agents.rollout.types import Tree


def distinct_action_turns(policy: Policy, params: SamplingParams, branches: Sequence[Any],
                          retries: int) -> tuple[list[Generation], list[str], int]:
    """First turns for ``branches`` (each with ``env``, ``tree``, ``parent``, ``context``) such
    that no two siblings at a node, old or new, make the same move, where ``retries`` draws
    allow. Returns the turns, their action keys, and how many turns were drawn again."""
    contexts = [b.context for b in branches]
    gens = list(policy.generate(contexts, params))
    keys = [b.env.action_key(g.text) for b, g in zip(branches, gens)]
    redrawn = 0
    for _ in range(retries):
        dup = repeats(branches, keys)
        if not dup:
            break
        redrawn += len(dup)
        for i, g in zip(dup, policy.generate([contexts[i] for i in dup], params)):
            gens[i], keys[i] = g, branches[i].env.action_key(g.text)
    return gens, keys, redrawn


def repeats(branches: Sequence[Any], keys: Sequence[str]) -> list[int]:
    """Indices of branches whose move an earlier sibling (a child already in the tree, or an
    earlier branch at the same node) makes."""
    taken: dict[tuple[int, int], set[str]] = {}
    dup = []
    for i, b in enumerate(branches):
        node = (id(b.tree), b.parent)
        if node not in taken:
            taken[node] = {b.tree.nodes[c].turn.action_key for c in b.tree.nodes[b.parent].children}
        if keys[i] in taken[node]:
            dup.append(i)
        else:
            taken[node].add(keys[i])
    return dup


def distinct_action_share(trees: Sequence[Tree]) -> float:
    """Mean over fork nodes (nodes with two or more children) of distinct moves / children:
    1.0 when every sibling group made different moves (and when there is no fork)."""
    shares = []
    for tree in trees:
        for node in tree.nodes:
            if len(node.children) >= 2:
                moves = [tree.nodes[c].turn.action_key for c in node.children]
                shares.append(len(set(moves)) / len(moves))
    return sum(shares) / len(shares) if shares else 1.0
