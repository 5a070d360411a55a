"""Write a synthetic world to a folder: corpus.jsonl, questions.jsonl and manifest.json.

Everything streams: passages are generated and written one at a time and questions are checked
in small batches, so memory stays flat whatever the corpus size. Files are written to temp
names and renamed, the manifest last, so a folder with a manifest is complete. No clock or
path goes into any file, so the same arguments always give the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from itertools import chain
from pathlib import Path

from treegym.errors import ConfigError
from treegym.retrieval_index.synthetic.passages import iter_passages
from treegym.retrieval_index.synthetic.questions import Question, iter_questions
from treegym.retrieval_index.synthetic.world import plan_world
from treegym.retrieval_index.types import QAItem

GENERATOR_VERSION = "synthetic-world-1"
CORPUS_FILE, QUESTIONS_FILE, MANIFEST_FILE = "corpus.jsonl", "questions.jsonl", "manifest.json"
VALIDATORS = ("none", "bm25", "flat", "hnsw", "ivfpq", "hybrid")
AUTO_VALIDATE_LIMIT = 200_000  # above this, "auto" skips validation: the index would hold the corpus in RAM
VALIDATE_BATCH = 512


def default_questions(passages: int) -> int:
    return max(50, min(passages // 2, 20_000))


@dataclass(frozen=True)
class Manifest:
    """What a folder holds and how it was made; ``validation`` says what was dropped and why."""

    generator: str
    seed: int
    passages: int
    questions: int
    entities: dict[str, int]
    families: list[str]
    hops: list[int]
    holdout_templates: list[str]
    splits: dict[str, int]
    by_family: dict[str, int]
    by_hops: dict[str, int]
    validation: dict = field(default_factory=dict)
    corpus_sha256: str = ""
    questions_sha256: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        try:
            return cls(**json.loads((folder / MANIFEST_FILE).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigError(f"{folder / MANIFEST_FILE}: not a synthetic-world manifest ({exc})") from exc


class _AtomicWriter:
    """A text file written under a temp name, hashed as it goes, renamed into place on close."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd, self.tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        self.file = os.fdopen(fd, "w", encoding="utf-8")
        self.sha = hashlib.sha256()

    def write_record(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False) + "\n"
        self.sha.update(line.encode())
        self.file.write(line)

    def commit(self) -> str:
        self.file.close()
        _publish(self.tmp, self.path)
        return self.sha.hexdigest()

    def abort(self) -> None:
        self.file.close()
        Path(self.tmp).unlink(missing_ok=True)


def _publish(tmp: str, path: Path) -> None:
    """Rename into place with ordinary file permissions (mkstemp makes files owner-only)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, path)


def _progress(total: int, desc: str, enabled: bool):  # noqa: ANN202 - a tqdm bar
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=" passages" if desc == "corpus" else " questions",
                unit_scale=True, disable=not enabled, mininterval=0.5)


def _batches(items: Iterator[Question], size: int) -> Iterator[list[Question]]:
    batch: list[Question] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def resolve_validator(validate: str, passages: int) -> str:
    if validate == "auto":
        return "bm25" if passages <= AUTO_VALIDATE_LIMIT else "none"
    if validate not in VALIDATORS:
        raise ConfigError(f"validate={validate!r}: choose auto or one of {', '.join(VALIDATORS)}")
    return validate


def write_world(
    out: Path | str,
    passages: int,
    seed: int = 0,
    questions: int | None = None,
    families: Sequence[str] | None = None,
    hops: Sequence[int] | int | None = None,
    holdout: Sequence[str] = (),
    validate: str = "auto",
    k: int = 3,
    progress: bool = True,
) -> Manifest:
    """Generate a world into ``out``; returns its manifest.

    ``validate`` names a retriever ("bm25", "hybrid", ...) over the new corpus that the oracle
    searches with; questions it cannot answer at depth ``k`` are dropped (their ids stay
    unused, so ids do not depend on the validator). "auto" uses BM25 up to 200k passages.
    """
    world = plan_world(passages, seed)
    count = default_questions(passages) if questions is None else questions
    if not isinstance(count, int) or count < 1:
        raise ConfigError(f"questions={questions!r}: ask for at least 1 question")
    validator = resolve_validator(validate, passages)
    generated = iter_questions(world, count, families, hops, holdout)  # validates its arguments now
    first = next(generated, None)
    folder = Path(out).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST_FILE).unlink(missing_ok=True)  # an incomplete folder must not look complete

    corpus = _AtomicWriter(folder / CORPUS_FILE)
    try:
        with _progress(passages, "corpus", progress) as bar:
            for n, doc in enumerate(iter_passages(world), 1):
                corpus.write_record(doc.to_record())
                if n % 10_000 == 0:
                    bar.update(10_000)
            bar.update(passages - bar.n)
    except BaseException:
        corpus.abort()
        raise
    corpus_sha = corpus.commit()

    retriever = None
    if validator != "none":
        from treegym.retrieval_index import open_retriever

        retriever = open_retriever(str(folder / CORPUS_FILE), validator, progress=progress)
    from treegym.retrieval_index.synthetic.oracle import ChainOracle

    splits: Counter[str] = Counter()
    families_kept: Counter[str] = Counter()
    hops_kept: Counter[int] = Counter()
    dropped: Counter[str] = Counter()
    out_q = _AtomicWriter(folder / QUESTIONS_FILE)
    try:
        with _progress(count, "questions", progress) as bar:
            for batch in _batches(chain([first] if first else [], generated), VALIDATE_BATCH):
                ok = [True] * len(batch)
                if retriever is not None:
                    answers = ChainOracle(retriever, k).answer([q.item for q in batch])
                    ok = [a.correct for a in answers]
                for question, good in zip(batch, ok):
                    if good:
                        out_q.write_record(question.to_record())
                        splits[question.item.split] += 1
                        families_kept[question.item.type] += 1
                        hops_kept[question.item.hops] += 1
                    else:
                        dropped[question.template] += 1
                bar.update(len(batch))
    except BaseException:
        out_q.abort()
        raise
    questions_sha = out_q.commit()

    manifest = Manifest(
        generator=GENERATOR_VERSION,
        seed=seed,
        passages=passages,
        questions=sum(splits.values()),
        entities=dict(world.counts),
        families=sorted(families_kept),
        hops=sorted(hops_kept),
        holdout_templates=sorted(holdout),
        splits=dict(sorted(splits.items())),
        by_family=dict(sorted(families_kept.items())),
        by_hops={str(h): n for h, n in sorted(hops_kept.items())},
        validation={"retriever": validator, "k": k, "generated": sum(splits.values()) + sum(dropped.values()),
                    "dropped": sum(dropped.values()), "dropped_by_template": dict(sorted(dropped.items()))},
        corpus_sha256=corpus_sha,
        questions_sha256=questions_sha,
    )
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{MANIFEST_FILE}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(manifest.to_json())
    _publish(tmp, folder / MANIFEST_FILE)
    return manifest


def read_questions(path: Path) -> Iterator[QAItem]:
    """QA items from a questions.jsonl (extra keys such as ``template`` are ignored)."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                yield QAItem(
                    id=r["id"], question=r["question"], answers=tuple(r["answers"]),
                    supporting_ids=tuple(r.get("supporting_ids", ())), hops=int(r.get("hops", 1)),
                    type=r.get("type", "unknown"), split=r.get("split", "train"), source=r.get("source", "synthetic"),
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}:{lineno}: not a question record: {exc}") from exc
