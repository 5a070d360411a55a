"""QA data files of Search-R1 (parquet) and FlashRAG (JSONL): reading them, and writing ours.

Search-R1's ``nq_search.py``-style parquet keeps FlashRAG's ``id``, ``question`` and
``golden_answers`` next to its own ``data_source``, ``prompt``, ``ability``, ``reward_model``
(``{"style": "rule", "ground_truth": {"target": [...]}}``) and ``extra_info``. Files made by
other scripts may lack the FlashRAG columns, so the question falls back to the prompt's text
after "Question:", and the answers to ``reward_model.ground_truth.target``.
FlashRAG JSONL has one ``{"id", "question", "golden_answers", "metadata"?}`` object per line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from treegym.errors import ConfigError, MissingPackageError, TreegymError
from treegym.paths import write_atomically
from treegym.retrieval_index.types import QAItem

FORMATS = ("jsonl", "parquet")
OPEN_TYPE = "open"  # the type of a question from a data file: open-domain QA

# Search-R1's prompt, verbatim: its data files and TreeSearchQA-v0's opening observation both use it.
SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: {question}\n"
)


class QADataError(TreegymError):
    """A QA data file that cannot be read; the message names the file and the line or row."""


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401  (loads the submodule)
    except ImportError as exc:
        raise MissingPackageError("pyarrow", "Reading and writing Search-R1 parquet files", "pip install pyarrow") from exc
    return pyarrow


def read_qa_file(path: Path, split: str = "train") -> list[QAItem]:
    """Read a ``.parquet`` (Search-R1) or ``.jsonl`` (FlashRAG) file; items are labelled ``split``."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return read_search_r1_parquet(path, split)
    if suffix in (".jsonl", ".json"):
        return read_flashrag_jsonl(path, split)
    raise ConfigError(f"{path}: unknown QA file type {suffix!r}; use .parquet (Search-R1) or .jsonl (FlashRAG)")


def _answers(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if hasattr(value, "tolist"):  # numpy arrays from pyarrow's nested columns
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(a, (str, int, float)) for a in value):
        raise QADataError(f"{where}: golden answers must be a non-empty list of strings, got {value!r:.100}")
    return tuple(str(a) for a in value)


def _question(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise QADataError(f"{where}: question must be a non-empty string, got {value!r:.100}")
    return value.strip()


def read_flashrag_jsonl(path: Path, split: str = "train") -> list[QAItem]:
    try:
        return _read_flashrag_jsonl(path, split)
    except UnicodeDecodeError as exc:
        raise QADataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); is it really JSONL?") from exc


def _read_flashrag_jsonl(path: Path, split: str) -> list[QAItem]:
    items = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise QADataError(f"{where}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict) or "question" not in record or "golden_answers" not in record:
                raise QADataError(f'{where}: a FlashRAG record needs "question" and "golden_answers"')
            meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
            try:
                item = QAItem(
                    id=str(record.get("id", f"{path.stem}-{lineno}")),
                    question=_question(record["question"], where),
                    answers=_answers(record["golden_answers"], where),
                    supporting_ids=tuple(str(i) for i in meta.get("supporting_ids", ())),
                    hops=int(meta.get("hops", 1)),
                    type=str(meta.get("type", OPEN_TYPE)),
                    split=split,
                    source=str(meta.get("source", path.stem)),
                )
            except (TypeError, ValueError) as exc:
                raise QADataError(f"{where}: bad metadata ({exc})") from exc
            items.append(item)
    return items


def _prompt_question(prompt: Any) -> str | None:
    """The question inside a Search-R1 chat prompt: the text after its last "Question:"."""
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        content = str(prompt[-1].get("content", ""))
        if "Question:" in content:
            return content.rsplit("Question:", 1)[1].strip()
    return None


def read_search_r1_parquet(path: Path, split: str = "train") -> list[QAItem]:
    pa = _pyarrow()
    try:
        rows = pa.parquet.read_table(path).to_pylist()
    except (pa.ArrowInvalid, OSError) as exc:
        raise QADataError(f"{path}: not a readable parquet file ({exc})") from exc
    items = []
    for row_number, row in enumerate(rows):
        where = f"{path}: row {row_number}"
        question = row.get("question") or _prompt_question(row.get("prompt"))
        answers = row.get("golden_answers")
        if answers is None:
            truth = (row.get("reward_model") or {}).get("ground_truth") or {}
            answers = truth.get("target") if isinstance(truth, dict) else None
        if question is None or answers is None:
            raise QADataError(f"{where}: needs a question (question or prompt) and answers (golden_answers or reward_model.ground_truth.target)")
        extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
        item_id = row.get("id") or extra.get("id") or f"{path.stem}-{extra.get('index', row_number)}"
        supporting = extra.get("supporting_ids") or ()
        items.append(
            QAItem(
                id=str(item_id),
                question=_question(question, where),
                answers=_answers(answers, where),
                supporting_ids=tuple(str(i) for i in supporting),
                hops=int(extra.get("hops") or 1),
                type=str(extra.get("type") or OPEN_TYPE),
                split=split,
                source=str(row.get("data_source") or path.stem),
            )
        )
    return items


# ---- writing ---------------------------------------------------------------------------------


def write_flashrag_jsonl(items: Iterable[QAItem], path: Path) -> Path:
    """FlashRAG JSONL; our extra fields go into ``metadata`` (FlashRAG keeps it as is)."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for it in items:
                record = {"id": it.id, "question": it.question, "golden_answers": list(it.answers), "metadata": _metadata(it)}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")

    return write_atomically(path, write)


def _metadata(it: QAItem) -> dict[str, Any]:
    return {"type": it.type, "hops": it.hops, "supporting_ids": list(it.supporting_ids), "source": it.source}


def write_search_r1_parquet(items: Sequence[QAItem], path: Path, prompt_template: str | None = None) -> Path:
    """Search-R1's training parquet: the columns its ``nq_search.py`` writes, plus FlashRAG's.

    ``prompt_template`` has a ``{question}`` field; by default Search-R1's own prompt, which
    TreeSearchQA-v0 also opens with, so training and the env agree.
    """
    prompt_template = SEARCH_R1_PROMPT if prompt_template is None else prompt_template
    pa = _pyarrow()
    rows = [
        {
            "id": it.id,
            "question": it.question,
            "golden_answers": list(it.answers),
            "data_source": it.source,
            "prompt": [{"role": "user", "content": prompt_template.format(question=it.question)}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": list(it.answers)}},
            "extra_info": {"split": it.split, "index": i, **_metadata(it)},
        }
        for i, it in enumerate(items)
    ]
    return write_atomically(path, lambda tmp: pa.parquet.write_table(pa.Table.from_pylist(rows), tmp))
