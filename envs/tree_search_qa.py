"""TreeSearchQA-v0: question answering by searching a local Wikipedia index, forkable per turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from treegym.envs.core import ForkableEnv, StepResult, ToolCall, ToolError
from treegym.envs.qa_tasks import answer_turn, end_turn, pick_item, require_running, shared
from treegym.envs.react import INVALID_ACTION_MESSAGE, format_information, parse_action
from treegym.errors import ConfigError
from treegym.retrieval_index.qa import SPLITS as QA_SPLITS
from treegym.retrieval_index.qa_files import SEARCH_R1_PROMPT
from treegym.retrieval_index.types import Hit, QAItem, Retriever


class SearchTool:
    """The ``search`` tool: one batched retriever call for every pending query."""

    def __init__(self, retriever: Retriever, k: int) -> None:
        self.retriever = retriever
        self.k = k
        self.batch_key = ("search", id(retriever), k)

    def call_batch(self, payloads: Sequence[Any]) -> list[Any]:
        try:
            return self.retriever.search([str(p) for p in payloads], self.k)
        except Exception as exc:  # a backend failure is an observation, not a crash
            return [ToolError(f"Search failed: {exc}")] * len(payloads)


@dataclass(frozen=True)
class QAState:
    """Everything that changes during an episode. Immutable: a step builds a new one."""

    item: QAItem
    turn: int = 0
    done: bool = False
    retrieved_ids: tuple[str, ...] = ()
    invalid_actions: int = 0
    format_valid: bool = True
    answer: str | None = None
    tool_calls: int = 0


class TreeSearchQAEnv(ForkableEnv[QAState]):
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

    splits = (*QA_SPLITS, "all")  # the env owns its tasks: trainers, eval and SFT ask it
    eval_split = "dev"

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
        super().__init__(render_mode=render_mode)
        if reward not in ("em", "f1"):
            raise ConfigError(f"reward must be 'em' or 'f1', got {reward!r}")
        if not 1 <= topk <= 50:
            raise ConfigError(f"topk must be between 1 and 50, got {topk}")
        if max_turns < 1:
            raise ConfigError(f"max_turns must be at least 1, got {max_turns}")
        self.topk, self.max_turns, self.reward_kind = topk, max_turns, reward
        self.format_score, self.max_action_chars = format_score, max_action_chars
        self.config = {"corpus": corpus, "index": index, "split": split, "corpus_limit": corpus_limit}

        corpus_path: str = corpus
        if corpus == "synthetic":
            from treegym.retrieval_index.synthetic import synthetic_world

            world = shared(("synthetic", synthetic_passages, seed or 0), lambda: synthetic_world(passages=synthetic_passages, seed=seed or 0))
            corpus_path = str(world.corpus_path)
            if items is None and dataset is None:
                items = world.questions(split, hops=hops)
        if retriever is None:
            from treegym.retrieval_index import open_retriever

            key = ("retriever", corpus_path, index, embedder, retriever_url, corpus_limit)
            retriever = shared(key, lambda: open_retriever(corpus=corpus_path, index=index, embedder=embedder, url=retriever_url, limit=corpus_limit))
        self.retriever = retriever
        self.tools = {"search": SearchTool(retriever, topk)}

        if items is None:
            from treegym.retrieval_index.qa import load_qa

            items = shared(("qa", dataset or "wiki", split, tuple(question_types or ())), lambda: load_qa(dataset or "wiki", split=split, types=question_types))
        items = list(items)
        if hops is not None and corpus != "synthetic":
            items = [it for it in items if it.hops == hops]
        titles: dict[str, str] = {}
        if retriever_url is None:
            from treegym.retrieval_index import load_corpus_docs

            docs = shared(("docs", corpus_path, corpus_limit), lambda: load_corpus_docs(corpus_path, corpus_limit))
            titles = {d.id: d.title for d in docs}
            if corpus_limit is not None:
                items = [it for it in items if it.supporting_ids and set(it.supporting_ids) <= titles.keys()]
        if not items:
            raise ConfigError(
                f"no questions left for split={split!r}, question_types={question_types}, hops={hops}, "
                f"corpus_limit={corpus_limit}: widen the selection"
            )
        self.items: tuple[QAItem, ...] = tuple(items)
        self._by_id = {it.id: it for it in self.items}
        self._titles = {i: titles[i] for it in self.items for i in it.supporting_ids if i in titles}

    # ---- episode ------------------------------------------------------------------------------

    def task_ids(self) -> list[str]:
        return [it.id for it in self.items]

    def _reset_state(self, options: dict[str, Any]) -> tuple[QAState, str, dict[str, Any]]:
        item = pick_item(self.items, self._by_id, options, self.np_random)
        state = QAState(item=item)
        return state, SEARCH_R1_PROMPT.format(question=item.question), self._info(state, invalid=False)

    def plan(self, action: str) -> list[ToolCall]:
        require_running(self.state)
        parsed = parse_action(action, ("search", "answer"), self.max_action_chars)
        calls = [ToolCall("search", parsed.argument)] if parsed.kind == "search" else []
        return self._remember(calls, parsed)

    def resolve(self, results: Sequence[Any]) -> StepResult:
        _, parsed = self._take_pending()
        s = self.state
        s = replace(s, turn=s.turn + 1, format_valid=s.format_valid and parsed.well_formed)
        reward, terminated, obs, extra = 0.0, False, "", {}
        if parsed.kind == "answer":
            s, reward, extra = answer_turn(self, s, parsed.argument)
            terminated = True
        elif parsed.kind == "search":
            s = replace(s, tool_calls=s.tool_calls + 1)
            result = results[0]
            if isinstance(result, ToolError):
                obs = f"\n\n<information>{result.message}</information>\n\n"
                extra = {"tool_error": result.message}
            else:
                hits: list[Hit] = list(result)
                s = replace(s, retrieved_ids=s.retrieved_ids + tuple(h.doc_id for h in hits))
                obs = format_information(hits)
        else:
            s = replace(s, invalid_actions=s.invalid_actions + 1, format_valid=False)
            obs = INVALID_ACTION_MESSAGE
            extra = {"error": parsed.error}
        return end_turn(self, s, obs, reward, terminated, parsed.kind == "invalid", extra)

    def _info(self, s: QAState, invalid: bool) -> dict[str, Any]:
        return {
            "task_id": s.item.id,
            "answers": list(s.item.answers),
            "supporting_ids": list(s.item.supporting_ids),
            "supporting_titles": [self._titles.get(i, "") for i in s.item.supporting_ids],
            "question_type": s.item.type,
            "hops": s.item.hops,
            "retrieved_ids": list(s.retrieved_ids),
            "turn": s.turn,
            "tool_calls": s.tool_calls,
            "invalid_action": invalid,
        }

    def render(self) -> str:
        s = self.state
        if s is None:
            return "(not reset)"
        return f"[{s.item.id}] turn {s.turn}/{self.max_turns} answer={s.answer!r} question={s.item.question!r}"
