"""Search backends: SearxNG and Search-R1 /retrieve against the real local web; Brave and
Serper against recorded answers of their real protocol, replayed by a loopback server."""

from __future__ import annotations

import pytest
from web_servers import BRAVE_KEY, SERPER_KEY, FaultServer, small_corpus

from treegym.envs.web.backends import (
    BraveBackend,
    RetrieveBackend,
    SearxngBackend,
    SerperBackend,
    make_backend,
)
from treegym.envs.web.http import Fetcher, FetchError, HttpConfig
from treegym.envs.web.local_web import LocalWeb, slug
from treegym.errors import ConfigError

FAST = HttpConfig(read_timeout_s=2.0, retries=1, backoff_base_s=0.01, backoff_max_s=0.02)


@pytest.fixture(scope="module")
def web():
    with LocalWeb(small_corpus()) as w:
        yield w


@pytest.fixture(scope="module")
def fixtures():
    srv = FaultServer()
    yield srv
    srv.stop()


@pytest.fixture()
def fetcher():
    return Fetcher(FAST)


def test_searxng_backend_searches_the_local_web(web, fetcher):
    results = SearxngBackend(web.url).search(fetcher, "Hamlet tragedy Shakespeare", 3)
    assert results[0].title == "Hamlet" and results[0].url == f"{web.url}/wiki/Hamlet"
    assert "tragedy" in results[0].snippet and len(results) <= 3


def test_retrieve_backend_speaks_search_r1_and_batches_queries(web, fetcher):
    backend = RetrieveBackend(web.url, page_url=web.url + "/doc/{id}")
    before = web.requests
    rows = backend.search_many(fetcher, ["Abraham Lincoln president", "Paris capital"], 2)
    assert web.requests == before + 1
    assert rows[0][0].title == "Abraham Lincoln" and rows[0][0].url.startswith(web.url + "/doc/wiki-")
    assert len(rows) == 2 and all(len(r) <= 2 for r in rows)


def test_local_web_redirects_passage_ids_to_articles(web, fetcher):
    hit = RetrieveBackend(web.url, page_url=web.url + "/doc/{id}").search(fetcher, "Abraham Lincoln", 1)[0]
    resp = fetcher.get(hit.url)
    assert resp.url.endswith("/wiki/Abraham_Lincoln") and "16th president" in resp.text


def test_local_web_links_articles_that_a_passage_mentions(web, fetcher):
    html = fetcher.get(f"{web.url}/wiki/{slug('Hamlet')}").text
    assert '<a href="/wiki/William_Shakespeare">William Shakespeare</a>' in html
    assert 'href="/wiki/Hamlet"' not in html.split("<main>")[1]  # no link to itself


def test_local_web_rejects_bad_retrieve_requests_with_4xx(web, fetcher):
    for body in ({"queries": "not a list"}, {"queries": ["q"], "topk": 0}, {"queries": []}):
        with pytest.raises(FetchError, match="HTTP 400"):
            fetcher.post_json(f"{web.url}/retrieve", body)


def test_brave_backend_reads_recorded_answers_and_sends_its_key(fixtures, fetcher):
    backend = BraveBackend(f"{fixtures.url}/brave/res/v1/web/search", api_key=BRAVE_KEY)
    results = backend.search(fetcher, "who wrote hamlet", 2)
    assert [r.url for r in results] == ["https://en.wikipedia.org/wiki/Hamlet",
                                        "https://www.britannica.com/topic/Hamlet-by-Shakespeare"]
    assert "<strong>" not in results[0].snippet and "written by William Shakespeare" in results[0].snippet
    assert fixtures.seen_headers[-1]["X-Subscription-Token"] == BRAVE_KEY


def test_brave_key_comes_from_the_environment_and_a_bad_one_is_a_clear_failure(fixtures, fetcher, monkeypatch):
    monkeypatch.setenv("BRAVE_API_KEY", "wrong")
    with pytest.raises(FetchError, match="HTTP 422.*SUBSCRIPTION_TOKEN_INVALID"):
        BraveBackend(f"{fixtures.url}/brave/res/v1/web/search").search(fetcher, "q", 3)
    monkeypatch.delenv("BRAVE_API_KEY")
    with pytest.raises(ConfigError, match=r"\$BRAVE_API_KEY"):
        make_backend("brave")


def test_serper_backend_reads_recorded_answers(fixtures, fetcher, monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", SERPER_KEY)
    results = make_backend(f"serper:{fixtures.url}/serper/search").search(fetcher, "who wrote hamlet", 3)
    assert [r.title for r in results][0] == "Hamlet - Wikipedia" and len(results) == 3
    with pytest.raises(FetchError, match="HTTP 403"):
        SerperBackend(f"{fixtures.url}/serper/search", api_key="wrong").search(fetcher, "q", 3)


def test_searxng_backend_reads_a_recorded_public_instance_answer(fixtures, fetcher):
    results = SearxngBackend(f"{fixtures.url}/searxng").search(fetcher, "who wrote hamlet", 5)
    assert len(results) == 3 and results[2].snippet == ""  # null content is an empty snippet


def test_malformed_json_is_a_clear_failure(fixtures, fetcher):
    with pytest.raises(FetchError, match="malformed JSON from SearxNG"):
        SearxngBackend(f"{fixtures.url}/malformed-json").search(fetcher, "q", 3)


def test_an_unknown_backend_spec_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown search backend"):
        make_backend("altavista")


def test_results_with_wrong_field_types_or_lone_surrogates_are_validated(fixtures, fetcher):
    results = SearxngBackend(f"{fixtures.url}/searxng-odd").search(fetcher, "q", 10)
    assert [(r.title, r.url, r.snippet) for r in results] == [
        ("", "http://a.example/1", ""),  # null title, list content: no text, never "None" or "['x']"
        ("T?", "http://a.example/2", "ok ? text"),  # lone surrogates replaced: printable, tokenizable
        ("", "http://a.example/3", "7"),
    ]  # the hits without a URL string are dropped
    for r in results:
        (r.title + r.snippet).encode("utf-8")
