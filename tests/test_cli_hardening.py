"""The CLI under malformed and nonsense input: one clear line and a nonzero exit, never a
traceback, and no nonsense accepted. The cases the round-three probes found are listed one by
one; a bounded fuzz over every subcommand's options (``benchmarks/fuzz_cli.py``) covers the rest.
All in-process through ``treegym.cli.main``; nothing here starts real work."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from treegym.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import fuzz_cli  # noqa: E402

QA = ["--agent", "heuristic", "--env", "TreeSearchQA-v0", "--no-progress"]
HOUSE = ["--agent", "oracle", "--env", "TextHousehold-v0", "--no-progress"]

MALFORMED = [
    (["train", "--env", "os:getcwd", "--steps", "1"], "getcwd is not a gymnasium Env class"),
    (["eval", *QA[:2], "--env", "os:getcwd"], "getcwd is not a gymnasium Env class"),
    (["serve-env", "os:getcwd", "--port", "0"], "getcwd is not a gymnasium Env class"),
    (["eval", *QA, "--env-kwargs", '{"split": "nope", "index": "bm25"}'], "has no split 'nope'"),
    (["data", "export", "--out", "TMP"], "is a folder; name the file"),
    (["data", "export", "--out", "/dev/null/x"], "its folder /dev/null does not exist, or is not a folder"),
    (["serve-model", "--device", "tpu", "--port", "0"], "--device must be cpu, cuda, cuda:N or mps"),
    (["study", "--out", "/proc/nope"], "cannot make --out /proc/nope"),
    (["eval", *HOUSE, "--n", str(10**12)], "argument --n: must be in 1..100000"),
    (["train", "--env", "ProbeKeys-v0", "--steps", "1", "--out", "TMP", "--name", "n" * 300],
     "has a folder name over 255 bytes"),
    (["train", "--env", "ProbeKeys-v0", "--steps", "1", "--out", "TMP", "--name", "a-file/run"],
     "cannot make run folder .*a-file/run \\(Not a directory\\)"),
]  # fmt: skip

NONSENSE = [
    (["eval", *HOUSE, "--temperature", "nan"], "argument --temperature: must be at least 0"),
    (["eval", *HOUSE, "--temperature", "-1"], "argument --temperature: must be at least 0"),
    (["eval", *HOUSE, "--max-new-tokens", "0"], "argument --max-new-tokens: must be in 1.."),
    (["eval", *HOUSE, "--tree-prompts", "-1"], "argument --tree-prompts: must be at least 1"),
    (["web", "search", "-k", "-1", "paris"], "argument -k: must be in 1..10000"),
]


def _run(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    (tmp_path / "a-file").write_text("")
    argv = [a.replace("TMP", str(tmp_path)) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), MALFORMED, ids=[" ".join(a[:3]) + f" #{i}" for i, (a, _) in enumerate(MALFORMED)])
def test_a_malformed_invocation_is_one_clear_line_never_a_traceback(argv, message, tmp_path, capsys):
    code, err = _run(argv, tmp_path, capsys)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning:")]
    assert code == 2 and "Traceback" not in err
    assert len(lines) == 1 and re.search(message, lines[0]), err


@pytest.mark.parametrize(("argv", "message"), NONSENSE, ids=[" ".join(a[-2:]) for a, _ in NONSENSE])
def test_nonsense_is_refused_before_any_work(argv, message, tmp_path, capsys):
    code, err = _run(argv, tmp_path, capsys)
    assert code == 2 and "Traceback" not in err and message in err.splitlines()[-1]


def test_a_fuzz_over_every_subcommands_options_finds_no_traceback_and_no_accepted_nonsense():
    n, findings = fuzz_cli.sweep(limit_s=10.0, budget_s=40.0)  # + a warm-up of about 20 s: about a minute
    assert n >= len(fuzz_cli.leaf_commands()) * 5  # the budget reached every command several times
    assert not findings, "\n".join(f"{f.kind}: {' '.join(f.argv)[:200]} -> {f.detail}" for f in findings[:10])
