"""Branching rules: which nodes of a rollout forest the tree sampler expands next.

A rule is a plain function ``rule(forest) -> [(tree, node_id), ...]``. ``forest.trees`` is every
tree of the batch grown so far (all prompts, all earlier rounds: nodes, their turns' info flags
and log-probs, the rewards of finished leaves); the rule returns which nodes to fork, as
(position in ``forest.trees``, node id) pairs, at most ``forest.budget`` of them. A node may
appear more than once (it then grows that many branches). Returning fewer than the budget is
allowed: tokens not spent here are spent on later steps, since runs stop at a token budget.

Rules are registered by name (``@branching_rule("name")``); ``sampler.expansion`` takes a name
or, for a rule in a user's own file, a ``module:function`` spec. A new rule is one function and
no change to the sampler or the loop::

    from treegym.agents.rollout.branching import Forest, branching_rule

    @branching_rule("deepest")
    def deepest(forest: Forest) -> list[tuple[int, int]]:
        return [(t, max(candidates(tree), key=lambda i: tree.nodes[i].depth))
                for t, tree in enumerate(forest.trees) for _ in range(forest.per_tree)]

The built-in rules:

- the reference and its variants, each choosing ``per_tree`` nodes in every tree:
  ``with_replacement`` (Tree-GRPO's reference code), ``without_replacement``, ``no_root``,
  ``mixed``, ``entropy`` and ``depth``;
- ``pivot``: variance-targeted (PivotRL's signal ∝ √Var(R)), with the budget spread across
  prompts by what they can still teach;
- ``restart``: fork the state just before a step that the env flagged as failed;
- ``pivot+restart``: pivot in prompts whose outcomes already differ, restarts in the others;
- ``after_tool``: fork the states where a tool result just arrived (ARPO), so that the branches
  reuse the call; the rest of the budget as ``pivot+restart``;
- ``adaptive``: per prompt and round, branch (as pivot) where the prompt's outcomes differ, and
  draw fresh chains from the prompt where they are all alike: GRPO's behaviour where forks
  cannot pay.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from treegym.agents.rollout.types import Tree, Turn
from treegym.errors import ConfigError
from treegym.specs import load_object

Choice = tuple[int, int]  # (position of the tree in the forest, node id)


@dataclass(frozen=True)
class Forest:
    """What a rule sees: the trees grown so far, the round, the budget, and a seeded rng."""

    trees: Sequence[Tree]
    per_tree: int  # n: the even share of one tree in this round
    round: int  # 1 for the first expansion round
    rng: random.Random

    @property
    def budget(self) -> int:
        """Branches this round may grow in all: n per tree."""
        return self.per_tree * len(self.trees)

    def prompts(self) -> dict[int, list[int]]:
        """Prompt index -> positions of its trees."""
        out: dict[int, list[int]] = {}
        for t, tree in enumerate(self.trees):
            out.setdefault(tree.prompt_index, []).append(t)
        return out


BranchRule = Callable[[Forest], list[Choice]]
RULES: dict[str, BranchRule] = {}


def branching_rule(name: str) -> Callable[[BranchRule], BranchRule]:
    """Register ``fn`` under ``name`` for ``sampler.expansion``."""

    def register(fn: BranchRule) -> BranchRule:
        RULES[name] = fn
        return fn

    return register


def get_rule(spec: str | BranchRule) -> BranchRule:
    """A registered rule by name, a ``module:function`` spec of a user's rule, or the callable itself."""
    if callable(spec):
        return spec
    if spec in RULES:
        return RULES[spec]
    if ":" in spec:
        try:
            fn = load_object(spec)  # a user-supplied spec
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"branching rule {spec!r}: cannot import it ({exc})") from None
        if not callable(fn):
            raise ConfigError(f"branching rule {spec!r} is not a function")
        return fn
    raise ConfigError(f"branching rule {spec!r} is not one of {', '.join(RULES)} (or a module:function spec)")


# ---- what rules read off a tree -----------------------------------------------------------------


def candidates(tree: Tree) -> list[int]:
    """The root and every node whose episode had not ended (Tree-GRPO's non-leaf nodes)."""
    return [node.node_id for node in tree.nodes if node.turn is None or not node.terminal]


def leaves_under(tree: Tree, node_id: int) -> list[int]:
    """The finished nodes in the subtree of ``node_id`` (itself included)."""
    out, stack = [], [node_id]
    while stack:
        node = tree.nodes[stack.pop()]
        if node.terminal:
            out.append(node.node_id)
        stack.extend(node.children)
    return out


def step_failed(turn: Turn | None) -> bool:
    """The env flagged this step as failed: an invalid action, or ``info["failed_step"]`` (a blocked
    move, "Nothing happens", an empty search). The one place the contract's flags are read."""
    return turn is not None and (turn.invalid or bool(turn.info.get("failed_step", False)))


def _rewards(tree: Tree, node_id: int) -> list[float]:
    return [float(tree.nodes[i].reward or 0.0) for i in leaves_under(tree, node_id)]


def _weighted(rng: random.Random, scored: list[tuple[Choice, float]], k: int) -> list[Choice]:
    """k draws ∝ score: first without replacement, so the budget spreads, then with it."""
    pool = [(c, w) for c, w in scored if w > 0]
    out: list[Choice] = []
    while pool and len(out) < k:
        i = rng.choices(range(len(pool)), weights=[w for _, w in pool], k=1)[0]
        out.append(pool.pop(i)[0])
    positive = [(c, w) for c, w in scored if w > 0]
    if positive and len(out) < k:
        out += rng.choices([c for c, _ in positive], weights=[w for _, w in positive], k=k - len(out))
    return out


# ---- the reference and its per-tree variants -----------------------------------------------------


def per_tree(choose: Callable[[Tree, int, random.Random], list[int]]) -> BranchRule:
    """A forest rule from a per-tree one: ``choose(tree, n, rng)`` in every tree, in order."""

    def rule(forest: Forest) -> list[Choice]:
        return [(t, node) for t, tree in enumerate(forest.trees) for node in choose(tree, forest.per_tree, forest.rng)]

    rule.__doc__ = choose.__doc__
    return rule


def _uniform(tree: Tree, n: int, rng: random.Random) -> list[int]:
    """Uniform over the candidates, with replacement: the reference code's rule."""
    nodes = candidates(tree)
    return [rng.choice(nodes) for _ in range(n)]


def _without_replacement(tree: Tree, n: int, rng: random.Random) -> list[int]:
    """Uniform, and never a node already expanded in this search."""
    done = set(tree.expanded)
    fresh = [c for c in candidates(tree) if c not in done]
    return rng.sample(fresh, min(n, len(fresh)))


def _no_root(tree: Tree, n: int, rng: random.Random) -> list[int]:
    """Uniform with replacement over the candidates but the root (unless it is the only one)."""
    inner = [c for c in candidates(tree) if c != 0] or candidates(tree)
    return [rng.choice(inner) for _ in range(n)]


def _by_weight(weight: Callable[[Tree, int], float]) -> Callable[[Tree, int, random.Random], list[int]]:
    def choose(tree: Tree, n: int, rng: random.Random) -> list[int]:
        nodes = candidates(tree)
        weights = [weight(tree, c) for c in nodes]
        if not any(w > 0 for w in weights):
            weights = [1.0] * len(nodes)
        return rng.choices(nodes, weights=weights, k=n)

    return choose


def _mixed_weight(tree: Tree, node_id: int) -> float:
    """4 where the subtree's leaves already differ (more samples separate good turns), else 1."""
    return 4.0 if len(set(_rewards(tree, node_id))) > 1 else 1.0


def _entropy_weight(tree: Tree, node_id: int) -> float:
    """The mean surprisal of the turn that followed the node: branch before uncertain decisions."""
    child = next((tree.nodes[c] for c in tree.nodes[node_id].children if tree.nodes[c].turn is not None), None)
    lps = child.turn.action_logprobs if child is not None and child.turn is not None else ()
    return -sum(lps) / len(lps) if lps else 0.0


def _depth_weight(tree: Tree, node_id: int) -> float:
    """The node's depth + 1: deeper nodes share more and cost less."""
    return float(tree.nodes[node_id].depth + 1)


for _name, _choose in (("with_replacement", _uniform), ("without_replacement", _without_replacement),
                       ("no_root", _no_root), ("mixed", _by_weight(_mixed_weight)),
                       ("entropy", _by_weight(_entropy_weight)), ("depth", _by_weight(_depth_weight))):
    branching_rule(_name)(per_tree(_choose))


# ---- fork-native rules ---------------------------------------------------------------------------


def success_estimate(tree: Tree, node_id: int, prior: float, lo: float, hi: float) -> float:
    """p̂ of a node: its leaves' mean reward, scaled to [0, 1] by the prompt's range, with one
    pseudo-leaf at the prompt's mean ``prior`` (so a node with one leaf is not certain)."""
    span = (hi - lo) or 1.0
    scaled = [(r - lo) / span for r in _rewards(tree, node_id)]
    return (sum(scaled) + prior) / (len(scaled) + 1)


def _remaining_turns(tree: Tree, node_id: int) -> float:
    """What a branch from the node costs, in turns: the mean depth left to its leaves."""
    depth = tree.nodes[node_id].depth
    left = [tree.nodes[i].depth - depth for i in leaves_under(tree, node_id)]
    return max(1.0, statistics.fmean(left)) if left else 1.0


def _outcomes(forest: Forest, positions: Sequence[int]) -> dict[int, list[float]]:
    """Prompt index -> the rewards of its finished leaves, over the given trees."""
    out: dict[int, list[float]] = {}
    for t in positions:
        tree = forest.trees[t]
        out.setdefault(tree.prompt_index, []).extend(_rewards(tree, 0))
    return out


def _pivot_scores(forest: Forest, positions: Sequence[int]) -> list[tuple[Choice, float]]:
    """p̂(1 - p̂) per turn a branch costs, over the candidates of the given trees.

    A prompt whose leaves differ is scored against its own mean; a prompt with one leaf so far
    (one tree, one chain: it cannot tell yet) against the forest's mean; a prompt whose several
    leaves all agree is not scored. Only nodes whose subtrees hold different outcomes are kept
    while any such node exists."""
    by_prompt = _outcomes(forest, range(len(forest.trees)))
    every = [r for rewards in by_prompt.values() for r in rewards]
    f_lo, f_hi = min(every, default=0.0), max(every, default=0.0)
    scored: list[tuple[Choice, float, bool]] = []
    for t in positions:
        tree = forest.trees[t]
        rewards = by_prompt[tree.prompt_index]
        if len(rewards) == 1 and f_hi > f_lo:
            lo, hi, pool = f_lo, f_hi, every
        elif len(set(rewards)) > 1:
            lo, hi, pool = min(rewards), max(rewards), rewards
        else:
            continue  # the prompt's first wave agrees: nothing here to tell apart
        prior = (statistics.fmean(pool) - lo) / (hi - lo)
        for c in candidates(tree):
            p = success_estimate(tree, c, prior, lo, hi)
            mixed = len(set(_rewards(tree, c))) > 1
            scored.append(((t, c), p * (1.0 - p) / _remaining_turns(tree, c), mixed))
    if any(m for _, _, m in scored):
        scored = [s for s in scored if s[2]]
    return [(c, w) for c, w, _ in scored]


@branching_rule("pivot")
def pivot(forest: Forest) -> list[Choice]:
    """Variance-targeted expansion (``sampler.expansion=pivot``).

    Each candidate's success probability p̂ is estimated from the leaves already below it (all
    earlier rounds included; see ``success_estimate``), and branches go where p̂(1 - p̂), per
    turn a branch costs, is largest (drawn ∝ that score, without replacement first). No branch
    goes under an all-0 or all-1 subtree while a mixed one exists anywhere in the forest. The
    budget is the forest's, not a tree's: a prompt whose trees all ended alike gets no branch,
    and its share goes to prompts that can still teach (a prompt with a single chain so far is
    judged against the forest's mean). A forest with nothing to tell apart spends nothing.
    """
    return _weighted(forest.rng, _pivot_scores(forest, range(len(forest.trees))), forest.budget)


def restart_points(tree: Tree) -> list[int]:
    """The states just before each failed step (the parent of a flagged turn), shallowest first,
    each once."""
    points: list[int] = []
    for node in sorted(tree.nodes, key=lambda n: n.depth):
        if step_failed(node.turn) and node.parent is not None and node.parent not in points:
            points.append(node.parent)
    return points


def _restarts(forest: Forest, positions: Sequence[int], k: int) -> list[Choice]:
    """Up to k restarts spread over the trees in turn, each tree's unexpanded points first."""
    queues = []
    for t in positions:
        tree = forest.trees[t]
        points = restart_points(tree)
        done = set(tree.expanded)
        fresh = [p for p in points if p not in done]
        queues.append([(t, p) for p in fresh + [p for p in points if p in done]])
    out: list[Choice] = []
    while len(out) < k and any(queues):
        for q in queues:
            if q and len(out) < k:
                out.append(q.pop(0))
    return out


@branching_rule("restart")
def restart(forest: Forest) -> list[Choice]:
    """Restart at failure (``sampler.expansion=restart``): fork the state just before a step the
    env flagged as failed (``step_failed``: ``invalid_action`` or ``info["failed_step"]``), so the
    branch retries that decision with the rest of the episode's budget intact. Each tree gets its
    n; a tree with no flagged step takes the reference's uniform choice. Works through the env
    contract, for any env that sets the flags."""
    out: list[Choice] = []
    for t, tree in enumerate(forest.trees):
        picks = _restarts(forest, [t], forest.per_tree)
        out += picks + [(t, c) for c in _uniform(tree, forest.per_tree - len(picks), forest.rng)]
    return out


@branching_rule("pivot+restart")
def pivot_restart(forest: Forest) -> list[Choice]:
    """Pivot where a prompt's outcomes already differ (or its lone chain did better than the
    forest's worst); restarts at failure in the prompts whose trees all ended alike or whose lone
    chain failed, and their unused share back to pivot. Without failure flags, this is pivot."""
    by_prompt = _outcomes(forest, range(len(forest.trees)))
    floor = min((r for rewards in by_prompt.values() for r in rewards), default=0.0)
    uniform, mixed = [], []
    for prompt, positions in forest.prompts().items():
        rewards = by_prompt[prompt]
        # Alike, or a lone chain that failed as badly as anything in the forest: restart there.
        alike = len(set(rewards)) <= 1 and (len(rewards) > 1 or not rewards or rewards[0] <= floor)
        (uniform if alike else mixed).extend(positions)
    out = _restarts(forest, uniform, forest.per_tree * len(uniform))
    return out + _weighted(forest.rng, _pivot_scores(forest, mixed), forest.budget - len(out))


def tool_points(tree: Tree) -> list[int]:
    """The states just after a tool result: nodes whose turn made a tool call and whose episode
    goes on, shallowest first."""
    return [n.node_id for n in sorted(tree.nodes, key=lambda n: n.depth)
            if n.turn is not None and n.turn.tool_calls > 0 and not n.terminal]


@branching_rule("after_tool")
def after_tool(forest: Forest) -> list[Choice]:
    """Fork after tool results (``sampler.expansion=after_tool``; ARPO's observation that the
    model's uncertainty spikes right after a tool returns).

    A branch from the state just after a call reuses the result that call paid for: in tool
    calls, it costs only what its own continuation calls, against a whole chain's calls for a
    fresh sample. Each such state gets up to n branches (the ones whose leaves disagree, or
    that have a single leaf, first: drawn ∝ 0.05 + p̂(1 - p̂)); the budget left over, and every
    forest without a tool call, goes to ``pivot+restart``. On an env without tools this is
    ``pivot+restart``."""
    scored: list[tuple[Choice, float]] = []
    for t, tree in enumerate(forest.trees):
        rewards = _rewards(tree, 0)
        lo, hi = min(rewards, default=0.0), max(rewards, default=0.0)
        prior = (statistics.fmean(rewards) - lo) / (hi - lo) if hi > lo else 0.5
        for c in tool_points(tree):
            p = success_estimate(tree, c, prior, lo, hi) if hi > lo else 0.5
            scored += [((t, c), 0.05 + p * (1.0 - p))] * forest.per_tree
    out = _weighted(forest.rng, scored, min(forest.budget, len(scored)))
    left = forest.budget - len(out)
    return out + pivot_restart(forest)[:left] if left > 0 else out


@branching_rule("adaptive")
def adaptive(forest: Forest) -> list[Choice]:
    """Branch or draw fresh chains, decided per prompt and round from the within-group reward
    variance (``sampler.expansion=adaptive``).

    A prompt whose finished leaves differ in reward has a signal that forks can localise: its share
    of the budget goes to pivot's choices in its trees. A prompt whose leaves all agree (an all-0
    group on a sparse task) gives a fork nothing to compare against, and a branch from a failed
    trajectory shares its prefix and mostly its failure; there the share goes to the root, so each
    branch is a fresh, independent chain from the prompt, as GRPO would draw. Every prompt spends
    its whole share (pivot's unspent choices become fresh chains too), so the rule costs what the
    reference costs.
    """
    by_prompt = _outcomes(forest, range(len(forest.trees)))
    out: list[Choice] = []
    for prompt, positions in forest.prompts().items():
        share = forest.per_tree * len(positions)
        picks = []
        if len(set(by_prompt.get(prompt, []))) > 1:
            picks = _weighted(forest.rng, _pivot_scores(forest, positions), share)
        fresh = share - len(picks)
        out += picks + [(positions[i % len(positions)], 0) for i in range(fresh)]
    return out
