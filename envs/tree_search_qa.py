"""TreeSearchQA-v0: question answering by searching a local Wikipedia index, forkable per turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from treegym.envs.core import ToolCall, ToolError
from treegym.envs.qa_env import QAEnv, QAState
from treegym.envs.react import INVALID_ACTION_MESSAGE, ParsedAction, format_information
from treegym.envs.registry import Family, register_family
from treegym.errors import ConfigError
from treegym.retrieval_index.qa_files import SEARCH_R1_PROMPT
from treegym.retrieval_index.types import Hit, QAItem, Retriever


class RetrievalTool:
    """The ``search`` tool: one batched retriever call for every pending query."""

    def __init__(self, retriever: Retriever, k: int) -> None:
        self.retriever = retriever
        self.k = k
        self.batch_key = ("search", id(retriever), k)

    def call_batch(self, payloads: Sequence[Any]) -> list[Any]:
        try:
            return self.retriever.search([str(p) for p in payloads], self.k)
        except Exception as exc:  # a backend failure is an observation, not a crash; and not the agent's doing
            return [ToolError(f"Search failed: {exc}", unreachable=True)] * len(payloads)


@dataclass(frozen=True)
class RetrievalState(QAState):
    """A QA episode plus the passages retrieved so far. Immutable: a step builds a new one."""

    retrieved_ids: tuple[str, ...] = ()


class TreeSearchQAEnv(QAEnv[RetrievalState]):
    """Answer a question by searching a local Wikipedia index (Search-R1's ReAct protocol).

    ## Observation
    Text. ``reset`` returns Search-R1's whole prompt with the question; each ``step`` returns
    the text the env appends: ``<information>Doc 1(Title: t) text …</information>`` after a
    search, Search-R1's invalid-action message after an unusable turn, ``""`` after an answer.

    ## Action
    The model's whole turn as text: ``<think>…</think><search>query</search>`` or
    ``<answer>…</answer>``. The first complete tag counts. A malformed, empty, nested, huge or
    non-text action is never an exception: it yields the invalid-action message and
    ``info["invalid_action"] = True``, and the episode goes on.

    ## Reward
    On the answering step: SQuAD-normalised exact match against the gold aliases (``reward=
    "f1"`` for token F1). With ``format_score=True``, Tree-GRPO's table instead: correct 1.0
    (0.8 if the format was ever invalid), wrong 0.2 (0.1), no answer 0.2 (0). Otherwise 0.

    ## Episode
    Starts with a question drawn by the seeded RNG (or pinned with ``options={"task_id": id}``).
    Terminates on an answer; truncates after ``max_turns`` turns without one.

    ## Arguments
    corpus: ``"wiki"`` (built-in, 10,033 Wikipedia lead paragraphs), ``"synthetic"`` (the
        generated multi-hop world), or a path to a FlashRAG JSONL corpus.
    index: ``flat`` | ``hnsw`` | ``ivfpq`` | ``bm25`` | ``hybrid``.
    embedder: ``minilm`` (default, offline) or a local model folder.
    retriever_url: a Search-R1 ``/retrieve`` server to use instead of a local index.
    dataset: ``"wiki"`` (built-in questions), or a Search-R1 parquet / FlashRAG JSONL file;
        for ``corpus="synthetic"`` the world's own questions.
    split, question_types, hops: which questions.
    corpus_limit: index only the first N documents (a fast slice; questions whose supporting
        passages fall outside it are dropped).
    topk, max_turns, reward, format_score: as above.
    retriever: an already-built Retriever (skips the options above).
    render_mode: None or ``"ansi"`` (``render()`` returns a one-line summary of the episode).
    """

    state_class = RetrievalState
    prompt = SEARCH_R1_PROMPT
    tags = ("search", "answer")
    action_stops = ("</search>", "</answer>")  # a turn ends at its closing tag
    invalid_message = INVALID_ACTION_MESSAGE

    def __init__(
        self,
        corpus: str = "wiki",
        index: str = "flat",
        embedder: str = "minilm",
        retriever_url: str | None = None,
        dataset: str | None = None,
        split: str = "train",
        question_types: Sequence[str] | None = None,
        hops: int | None = None,
        corpus_limit: int | None = None,
        topk: int = 3,
        max_turns: int = 4,
        reward: str = "em",
        format_score: bool = False,
        max_action_chars: int = 16384,
        retriever: Retriever | None = None,
        items: Sequence[QAItem] | None = None,
        synthetic_passages: int = 2000,
        seed: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(max_turns=max_turns, reward=reward, format_score=format_score,
                         max_action_chars=max_action_chars, render_mode=render_mode)
        if not 1 <= topk <= 50:
            raise ConfigError(f"topk must be between 1 and 50, got {topk}")
        self.topk = topk
        self.config = {"corpus": corpus, "index": index, "split": split, "corpus_limit": corpus_limit}

        corpus_path: str = corpus
        if corpus == "synthetic":
            from treegym.retrieval_index.synthetic import synthetic_world

            world = synthetic_world(passages=synthetic_passages, seed=seed or 0)
            corpus_path = str(world.corpus_path)
            if items is None and dataset is None:
                items = world.questions(split, hops=hops)
        if retriever is None:
            from treegym.retrieval_index import open_retriever

            retriever = open_retriever(corpus=corpus_path, index=index, embedder=embedder, url=retriever_url, limit=corpus_limit)
        self.retriever = retriever
        self.tools = {"search": RetrievalTool(retriever, topk)}

        if items is None:
            from treegym.retrieval_index.qa import load_qa

            items = load_qa(dataset or "wiki", split=split, types=question_types)
        items = list(items)
        if hops is not None and corpus != "synthetic":
            items = [it for it in items if it.hops == hops]
        titles: dict[str, str] = {}
        if retriever_url is None:
            from treegym.retrieval_index import load_corpus_docs

            docs = load_corpus_docs(corpus_path, corpus_limit)
            titles = {d.id: d.title for d in docs}
            if corpus_limit is not None:
                items = [it for it in items if it.supporting_ids and set(it.supporting_ids) <= titles.keys()]
        self.set_items(items, f"no questions left for split={split!r}, question_types={question_types}, hops={hops}, "
                              f"corpus_limit={corpus_limit}: widen the selection")
        self._titles = {i: titles[i] for it in self.items for i in it.supporting_ids if i in titles}

    # ---- the QAEnv hooks ------------------------------------------------------------------

    def tool_calls(self, parsed: ParsedAction) -> tuple[list[ToolCall], Any]:
        return [ToolCall("search", parsed.argument)], None

    def observe(self, state: RetrievalState, parsed: ParsedAction, extra: Any, result: Any) -> tuple[RetrievalState, str, dict[str, Any]]:
        hits: list[Hit] = list(result)
        return replace(state, retrieved_ids=state.retrieved_ids + tuple(h.doc_id for h in hits)), format_information(hits), {}

    def episode_info(self, s: RetrievalState) -> dict[str, Any]:
        return {"supporting_titles": [self._titles.get(i, "") for i in s.item.supporting_ids],
                "retrieved_ids": list(s.retrieved_ids)}


# The family's record: what train, sft, eval and play read for this env (``treegym.envs.registry``).
# It trains on BM25 (builds in seconds, no embedder forward per query: what a 2-core run can afford)
# scored with Tree-GRPO's format-aware table. The RL phase on defaults is the one that learns here,
# measured across seeds by benchmarks/rl_real_envs.py (docs/results.md, "Round two: GRPO, Tree-GRPO
# and TreeOPSD at tuned learning rates"): GRPO at lr 5e-6, sampling at temperature 0.7 (at 1.0 the warm start's rollouts are
# right 2% of the time), 22 steps (about 8,000 generated tokens, the benchmark's budget). Each
# learning rate was tuned on a seed no report uses, with the same grid for every algorithm.
# The update forwards its whole mini-batch (6 rollouts, one tree's leaves share a prompt) in one packed
# micro-batch: a step's shared tokens are forwarded once rather than once per 4-row slice
# (benchmarks/bench_rl_step.py: 6.7 s against 9.1 s at 4 rows, fp32). SFT keeps the trainer's 4.
# What the faster step saves goes to scoring 64 held-out prompts in each phase instead of 32, so that
# one run's RL-phase gain has an interval about 1.4x narrower (the 15-minute budget holds it).
register_family(Family(
    id="TreeSearchQA-v0", entry_point="treegym.envs.tree_search_qa:TreeSearchQAEnv",
    max_turns=2, max_new_tokens=48, max_context_tokens=2048, warm_start_episodes=24, steps=22,
    micro_batch_size=6, sft_micro_batch_size=4, eval_n=64,
    algo="grpo", temperature=0.7, lr={"grpo": 5e-6, "tree-grpo": 2e-6, "treeopsd": 2e-6},
    expert="heuristic", score="EM", tools="qa",
    training="TreeSearchQA-Train-v0", training_kwargs={"index": "bm25", "format_score": True},
))
