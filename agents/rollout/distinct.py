"""Sibling branches that differ in their move, not in their first token.

An instruct model's turns all open with the same token (SmolLM2's with ``<``), so forcing
siblings apart on the first token forces a malformed opening, not a different move. Here a
branch's first turn is sampled whole, the env parses it (``ForkableEnv.action_key``: the tool
calls and the parsed action, e.g. the search query, the answer, the household command), and a
turn whose move a sibling at the same node already made is sampled again, up to a bound. The
recorded log-probs are the policy's own for the turn kept; only which draws are kept changes
(rejection of repeats), so the siblings are a sample without replacement over moves.

The older rule, ``sampler.distinct=d`` (``distinct_first_turns``), forces siblings apart on
their first d tokens instead; it stays for the study's comparisons.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from treegym.agents.policy import Generation, Policy, SamplingParams
from treegym.agents.rollout.types import Tree
from treegym.agents.sampling import find_stop


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


# ---- distinct first tokens (the older rule: ``sampler.distinct=d``)


def distinct_first_turns(policy: Policy, params: SamplingParams, active: Sequence[Any], d: int, retries: int,
                         exclude: bool = False) -> tuple[list[Generation], int]:
    """First turns for ``active`` whose first ``d`` tokens differ from every sibling's at the same
    node (LATR's forced diversity), and how many heads were drawn again. Heads are resampled up to
    ``retries`` times; with ``exclude``, one that still repeats is drawn without its siblings'
    first tokens. The recorded log-probs stay the policy's own."""
    contexts = [b.context for b in active]
    head_params = replace(params, max_new_tokens=min(d, params.max_new_tokens))
    heads = list(policy.generate(contexts, head_params))
    redrawn = 0
    for attempt in range(retries + 1):
        taken: dict[tuple[int, int], set[tuple[int, ...]]] = {}
        dup = []
        for i, b in enumerate(active):
            key = (id(b.tree), b.parent)
            if key not in taken:
                taken[key] = {tuple(b.tree.nodes[c].turn.action_ids[:d]) for c in b.tree.nodes[b.parent].children
                              if b.tree.nodes[c].turn is not None}
            head = tuple(heads[i].token_ids[:d])
            if head in taken[key]:
                dup.append(i)
            else:
                taken[key].add(head)
        if not dup or attempt == retries:
            break
        redrawn += len(dup)
        for i, g in zip(dup, policy.generate([contexts[i] for i in dup], head_params)):
            heads[i] = g
    if exclude and dup:
        redrawn += _exclude_heads(policy, params, active, heads, dup, taken)
    out = list(heads)
    go_on = [i for i, h in enumerate(heads) if h.finish_reason == "length" and len(h.token_ids) < params.max_new_tokens]
    # Heads are d tokens long, or 1 where exclusion redrew them: one tail call per length left.
    for rest in sorted({params.max_new_tokens - len(heads[i].token_ids) for i in go_on}):
        rows = [i for i in go_on if params.max_new_tokens - len(heads[i].token_ids) == rest]
        tails = policy.generate([contexts[i] + list(heads[i].token_ids) for i in rows],
                                replace(params, max_new_tokens=rest))
        for i, tail in zip(rows, tails):
            ids = list(heads[i].token_ids) + list(tail.token_ids)
            text = policy.tokenizer.decode(ids, skip_special_tokens=True)
            end = find_stop(text, params.stop) if tail.finish_reason == "stop" else -1
            out[i] = Generation(tuple(ids), tuple(heads[i].logprobs) + tuple(tail.logprobs),
                                text[:end] if end >= 0 else text, tail.finish_reason)
    return out, redrawn


def _exclude_heads(policy: Policy, params: SamplingParams, active: Sequence[Any], heads: list[Generation],
                   dup: list[int], taken: dict[tuple[int, int], set[tuple[int, ...]]]) -> int:
    """Redraw each repeated head's first token without the first tokens its node's siblings
    began with, one branch per node at a time (so two redrawn siblings differ too); the
    redrawn head is that one token, continued with the rest of the turn."""
    one = replace(params, max_new_tokens=1)
    left, redrawn = list(dup), 0
    while left:
        batch: dict[tuple[int, int], int] = {}
        for i in left:
            batch.setdefault((id(active[i].tree), active[i].parent), i)
        groups: dict[tuple[int, ...], list[int]] = {}
        for key, i in batch.items():
            groups.setdefault(tuple(sorted({h[0] for h in taken[key] if h})), []).append(i)
        for banned, rows in groups.items():
            gens = policy.generate([active[i].context for i in rows], replace(one, exclude_first=banned))
            for i, g in zip(rows, gens):
                heads[i] = g
                taken[(id(active[i].tree), active[i].parent)].add(tuple(g.token_ids))
        redrawn += len(batch)
        left = [i for i in left if i not in batch.values()]
    return redrawn


def distinct_share(trees: Sequence[Tree], head_tokens: int = 1) -> float:
    """Mean over prompts of distinct kept trajectories / kept trajectories, two trajectories being
    the same when every turn begins with the same ``head_tokens`` tokens (the move)."""
    groups: dict[int, list[tuple]] = {}
    for tree in trees:
        for leaf in tree.kept_leaves:
            key = tuple(tuple(tree.nodes[i].turn.action_ids[:head_tokens]) for i in tree.path(leaf))
            groups.setdefault(tree.prompt_index, []).append(key)
    shares = [len(set(keys)) / len(keys) for keys in groups.values() if keys]
    return sum(shares) / len(shares) if shares else 1.0
