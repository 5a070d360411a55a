"""``treegym web``: serve the local web, and try a search or a page from the command line."""

from __future__ import annotations

import argparse
import sys

from treegym.errors import ConfigError
from treegym.options import float_in, int_in
from treegym.retrieval_index.retrievers import MAX_K


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    web = subparsers.add_parser(
        "web", help="the local web (offline search + browse) and quick web tool checks",
        description="Serve a corpus as a local web site, or run one search / browse through the web tools.",
    )
    sub = web.add_subparsers(dest="web_command", metavar="SUBCOMMAND")

    serve = sub.add_parser(
        "serve", help="serve a corpus as linked HTML pages with a search endpoint, on 127.0.0.1",
        description="Serve the built-in Wikipedia corpus (or a FlashRAG JSONL corpus, e.g. a synthetic world) as "
                    "HTML articles linked to each other, with GET /search?q=...&format=json (SearxNG JSON) and "
                    "POST /retrieve (Search-R1). Point WebSearchQA-v0 at it with search_url=URL.",
        epilog="example: treegym web serve --port 8765 --latency-ms 50",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8765, help="port (0 picks a free one; default 8765)")
    serve.add_argument("--corpus", default="wiki",
                       help="'wiki' (built-in), 'synthetic' (the generated world), a FlashRAG JSONL file, or a folder "
                            "holding corpus.jsonl")
    serve.add_argument("--limit", type=int_in(1), default=None, help="serve only the first N documents")
    serve.add_argument("--latency-ms", type=float_in(0.0, 60_000.0), default=0.0, help="delay every response, to mimic a real network")
    serve.set_defaults(func=_serve)

    search = sub.add_parser("search", help="run one query through a search backend and print the results",
                            epilog="example: treegym web search 'who wrote Hamlet' --backend local:http://127.0.0.1:8765")
    search.add_argument("query")
    search.add_argument("--backend", default="local", help="local (in-process local web), local:URL, searxng:URL, "
                                                          "retrieve:URL, brave or serper")
    search.add_argument("-k", type=int_in(1, MAX_K), default=5, help="results to show")
    search.set_defaults(func=_search)

    browse = sub.add_parser("browse", help="fetch a page and print it as the agent reads it (first part)")
    browse.add_argument("url")
    browse.add_argument("--page-chars", type=int_in(1), default=2000, help="characters per part")
    browse.add_argument("--part", type=int_in(1), default=1, help="which part to print")
    browse.set_defaults(func=_browse)
    web.set_defaults(func=lambda args: (web.print_help(), 0)[1])


def _serve(args: argparse.Namespace) -> int:
    from treegym.envs.web.local_web import LocalWeb, load_docs
    from treegym.hosts import check_port, warn_if_exposed

    check_port(args.port)
    warn_if_exposed(args.host, "the local web")
    docs = load_docs(args.corpus, args.limit)
    try:
        web = LocalWeb(docs, host=args.host, port=args.port, latency_s=args.latency_ms / 1000)
    except (OSError, OverflowError, UnicodeError, TypeError, ValueError) as exc:
        raise ConfigError(f"cannot bind {args.host}:{args.port} ({getattr(exc, 'strerror', None) or exc}); pick another --port") from exc
    # The first line names the URL, so scripts can start it with --port 0 and read where it is.
    print(f"serving {len(docs)} articles on {web.url}  (search: {web.url}/search?q=...&format=json)", flush=True)
    try:
        web.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        web.stop()
    return 0


def _backend(spec: str):  # noqa: ANN202 (a SearchBackend)
    from treegym.envs.web.backends import make_backend

    if spec == "local":
        from treegym.envs.web.local_web import default_local_web

        spec = f"local:{default_local_web().url}"
    return make_backend(spec)


def _search(args: argparse.Namespace) -> int:
    from treegym.envs.web.http import Fetcher, FetchError

    backend = _backend(args.backend)
    try:
        results = backend.search(Fetcher(), args.query, args.k)
    except FetchError as exc:
        print(f"Search failed: {exc.reason}", file=sys.stderr)
        return 1
    for i, r in enumerate(results, 1):
        print(f"{i}. {r.title}\n   {r.url}\n   {r.snippet}\n")
    if not results:
        print("no results")
    return 0


def _browse(args: argparse.Namespace) -> int:
    from treegym.envs.web.http import Fetcher
    from treegym.envs.web.pages import paginate
    from treegym.envs.web.tools import BrowseTool, ToolError
    from treegym.envs.web_search_qa import format_page

    page = BrowseTool(Fetcher(), None).call_batch([args.url])[0]
    if isinstance(page, ToolError):
        print(page.message, file=sys.stderr)
        return 1
    parts = paginate(page.text, args.page_chars)
    if not 1 <= args.part <= len(parts):
        raise ConfigError(f"the page has {len(parts)} part(s); --part {args.part} is out of range")
    print(format_page(page, args.part, parts).strip())
    return 0
