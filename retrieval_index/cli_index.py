"""``treegym index build|query|serve``: build an index, try a query, or serve it over HTTP."""

from __future__ import annotations

import argparse
import json

from treegym.errors import ConfigError
from treegym.options import float_in, int_in
from treegym.retrieval_index.build import INDEX_TYPES, build_index, open_retriever
from treegym.retrieval_index.embedders import DEFAULT_EMBEDDER
from treegym.retrieval_index.retrievers import MAX_K
from treegym.retrieval_index.store import read_manifest


def _index_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", default="wiki", help="'wiki' (built-in, 10,033 Wikipedia leads) or a FlashRAG JSONL file")
    parser.add_argument("--type", dest="index", default="flat", choices=INDEX_TYPES,
                        help="index kind (default: flat). ivfpq keeps only PQ codes in RAM and re-scores its top 200 "
                        "candidates from the embeddings on disk: for corpora too large for flat (see README, Scaling)")
    parser.add_argument(
        "--embedder",
        default=DEFAULT_EMBEDDER,
        help="'minilm' (default: offline all-MiniLM-L6-v2 on each text's first 24 tokens; 'minilm@256' reads 256), "
        "a local model folder, or 'e5:<folder>' for e5 prefixes; '@N' reads N tokens",
    )
    parser.add_argument("--limit", type=int_in(1), default=None, help="index only the first N documents (a test slice)")


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    index = subparsers.add_parser(
        "index",
        help="build, query or serve a retrieval index",
        description="Indexes are cached under $TREEGYM_HOME/indexes (default ~/.cache/treegym).",
    )
    sub = index.add_subparsers(dest="index_command", metavar="ACTION", required=True)

    build = sub.add_parser("build", help="build (or rebuild with --force) an index and print its manifest")
    _index_options(build)
    build.add_argument("--force", action="store_true", help="rebuild even if a cached index exists")
    build.add_argument("--quiet", action="store_true", help="no progress bars")
    build.set_defaults(func=run_build)

    query = sub.add_parser("query", help="print the top-k titles and scores for a query")
    query.add_argument("text", nargs="+", help="the query (several words are joined)")
    _index_options(query)
    query.add_argument("-k", "--topk", type=int_in(1, MAX_K), default=5, help="how many hits (default: 5)")
    query.add_argument("--url", default=None, help="ask a running `treegym index serve` instead of a local index")
    query.set_defaults(func=run_query)

    serve = sub.add_parser("serve", help="serve an index over HTTP with Search-R1's POST /retrieve API")
    _index_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1; the API has no auth)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    serve.add_argument("--topk", type=int_in(1, MAX_K), default=3, help="topk when a request gives none (default: 3)")
    serve.add_argument("--max-topk", type=int_in(1, MAX_K), default=100, help="largest topk accepted (default: 100)")
    serve.add_argument("--max-queries", type=int_in(1, 1 << 20), default=512, help="most queries per request (default: 512)")
    serve.add_argument("--max-client-connections", type=int_in(1, 1 << 16), default=256,
                       help="live connections of one client address at most, of 512 in all (default: 256)")
    serve.add_argument("--request-deadline", type=float_in(0.0, 3600.0, above=True), default=60.0,
                       help="seconds to wait for a request and read all of it, body included (default: 60)")
    serve.add_argument("--quiet", action="store_true", help="do not log requests")
    serve.set_defaults(func=run_serve)


def run_build(args: argparse.Namespace) -> int:
    folders = build_index(args.corpus, args.index, args.embedder, args.limit, force=args.force, progress=not args.quiet)
    for folder in folders:
        manifest = read_manifest(folder)
        size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        print(f"{folder}  ({size / 1e6:.1f} MB)")
        print(json.dumps({k: v for k, v in json.loads(manifest.to_json()).items() if k != "files"}, indent=2))
    return 0


def run_query(args: argparse.Namespace) -> int:
    text = " ".join(args.text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # argv bytes that are not UTF-8 arrive as lone surrogates
        raise ConfigError("the query is not valid UTF-8 text; pass it in UTF-8") from None
    retriever = open_retriever(args.corpus, args.index, args.embedder, url=args.url, limit=args.limit)
    hits = retriever.search([text], args.topk)[0]
    if not hits:
        print("no results")
    for rank, hit in enumerate(hits, 1):
        print(f"{rank:>3}. {hit.score:8.4f}  {hit.title}  [{hit.doc_id}]")
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from treegym.retrieval_index.server import ServerLimits, check_port, serve_forever

    check_port(args.port)  # before the index loads
    retriever = open_retriever(args.corpus, args.index, args.embedder, limit=args.limit)
    limits = ServerLimits(default_topk=args.topk, max_topk=args.max_topk, max_queries=args.max_queries,
                          max_client_connections=args.max_client_connections,
                          request_deadline_s=args.request_deadline)
    serve_forever(retriever, args.host, args.port, limits, verbose=not args.quiet)
    return 0
