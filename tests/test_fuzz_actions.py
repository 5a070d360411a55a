"""No action raises out of step(), in any env: families of bad turns that an LLM can emit (or an
attacker can write), against all three envs, each over real backends on 127.0.0.1."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from web_servers import small_corpus

from treegym.envs.household.env import TextHouseholdEnv
from treegym.envs.tree_search_qa import TreeSearchQAEnv
from treegym.envs.web.http import HttpConfig
from treegym.envs.web.local_web import LocalWeb
from treegym.envs.web_search_qa import WebSearchQAEnv

QA = str(Path(__file__).parent / "web_fixtures" / "qa.jsonl")
FAST = HttpConfig(connect_timeout_s=1.0, read_timeout_s=2.0, retries=0)


def families(rng: random.Random) -> dict[str, list[object]]:
    """Bad actions by family; every family is wrapped in each tool tag as well as bare."""
    noise = "".join(chr(rng.randrange(1, 0x2FFFF)) for _ in range(200))
    surrogates = "".join(chr(rng.randrange(0xD800, 0xE000)) for _ in range(20))
    return {
        "empty": ["", " ", "\n\t\r", "<think></think>"],
        "huge": ["x" * (1 << 20), "<search>" + "q " * 200_000 + "</search>"],
        "lone surrogates": [surrogates, f"<search>{surrogates}</search>", "<answer>\udcff</answer>"],
        "control characters": ["\x00\x01\x02\x7f", "go\x00 to cabinet 1", "<search>\x00</search>", "\u202eevil\u202c"],
        "random unicode": [noise, f"<think>{noise}</think><search>{noise}</search>"],
        "broken markup": ["<search>", "</search>", "<search><search>a</search>", "<think>unclosed<answer>x",
                          "<<<>>>", "<search>a</answer>", "<action></action>", "<think>" * 5000],
        "nested": ["[" * 10_000 + "]" * 10_000, "{" * 5000, "<search>" * 2000 + "q" + "</search>" * 2000],
        "non-text": [None, 42, 3.5, b"<search>bytes</search>", ["<search>x</search>"], {"a": 1}],
        "huge numbers": ["<browse>x#page=" + "9" * 5000 + "</browse>", "<browse>next#page=1</browse>",
                         "take apple " + "9" * 5000 + " from fridge 1", "<search>" + "9" * 5000 + "</search>"],
        "odd urls": ["<browse>http://x:99999/</browse>", "<browse>http://[::1</browse>", "<browse>file:///etc/passwd</browse>",
                     "<browse>http://169.254.169.254/latest/meta-data/</browse>", "<browse>javascript:alert(1)</browse>",
                     "<browse>http://%zz/</browse>", "<browse>" + "http://a.example/" + "a" * 100_000 + "</browse>"],
        "injection": ["<search>'; DROP TABLE docs; --</search>", "<search>{{7*7}} ${jndi:ldap://x}</search>",
                      "<answer><script>alert(1)</script></answer>", "<search>../../../etc/passwd</search>"],
    }  # fmt: skip


@pytest.fixture(scope="module")
def web():
    with LocalWeb(small_corpus()) as w:
        yield w


def _envs(web: LocalWeb, tmp: Path) -> dict[str, object]:
    return {
        "TreeSearchQA": TreeSearchQAEnv(corpus_limit=300, index="bm25", max_turns=3),
        "WebSearchQA": WebSearchQAEnv(dataset=QA, search_url=web.url, cache_path=str(tmp / "c.sqlite"), http=FAST,
                                      max_turns=3),
        "TextHousehold": TextHouseholdEnv(max_steps=3),
    }  # fmt: skip


@pytest.mark.parametrize("name", ["TreeSearchQA", "WebSearchQA", "TextHousehold"])
def test_no_bad_action_raises_out_of_step(name: str, web: LocalWeb, tmp_path: Path) -> None:
    env = _envs(web, tmp_path)[name]
    rng = random.Random(0)
    tags = ["{}", "<search>{}</search>", "<browse>{}</browse>", "<answer>{}</answer>", "<action>{}</action>",
            "<think>r</think><search>{}</search>"]  # fmt: skip
    count = 0
    for family, actions in families(rng).items():
        for action in actions:
            variants = [action] + ([t.format(action) for t in tags[1:]] if isinstance(action, str) else [])
            for variant in variants:
                env.reset(seed=count)
                obs, reward, terminated, truncated, info = env.step(variant)  # type: ignore[arg-type]
                count += 1
                assert isinstance(obs, str) and isinstance(reward, float), (family, repr(variant)[:80])
                obs.encode("utf-8")  # printable and tokenizable: no lone surrogate reached it
                assert isinstance(info, dict) and isinstance(terminated, bool) and isinstance(truncated, bool)
    assert len(families(rng)) >= 10 and count > 150
