"""``treegym serve-env``: serve a treegym env over OpenEnv's protocol (needs ``treegym[openenv]``)."""

from __future__ import annotations

import argparse
import sys

from treegym.options import json_object_option


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve-env",
        help="serve an env over OpenEnv's HTTP/WebSocket protocol, with fork/snapshot/restore",
        description=(
            "Serve a treegym env with OpenEnv's server (openenv 0.10): WebSocket /ws (reset, step, state), "
            "HTTP POST /reset, POST /step, GET /state, /schema, /health; plus POST /fork, "
            "POST /snapshot, POST /restore, GET /tasks, GET /episodes and DELETE /episodes/ID. A fork is a new episode "
            "id in its parent's state; a session drives it with reset(attach=ID, session=TOKEN); every route that names an episode takes the "
            "calling session's token (X-Treegym-Session). "
            "Needs `pip install 'treegym[openenv]'`."
        ),
    )
    parser.add_argument("env_id", metavar="ID", help="env id (e.g. TextHousehold-v0, TreeSearchQA-v0) or module:Class")
    parser.add_argument("--env-kwargs", default=None, help='JSON object of gym.make kwargs, e.g. \'{"index": "bm25"}\'')
    parser.add_argument("--split", default=None, help="the env's task split (default: its own default)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8002, help="port to bind; 0 picks a free one (default: 8002)")
    parser.add_argument("--max-episodes", type=int, default=64,
                        help="live episodes (sessions and forks) at most; past it, a clear error (default: 64)")
    parser.add_argument("--max-forks", type=int, default=16,
                        help="live forks per session at most; they count against it and are freed with it (default: 16)")
    parser.add_argument("--max-snapshots", type=int, default=1024, help="live snapshots at most (default: 1024)")
    parser.add_argument("--max-session-snapshots", type=int, default=128,
                        help="live snapshots per session at most, so no session takes them all (default: 128)")
    parser.add_argument("--idle-timeout", type=float, default=600.0,
                        help="seconds after which an unused episode, session or snapshot expires (default: 600)")
    parser.add_argument("--max-body-bytes", type=int, default=4 << 20,
                        help="largest HTTP request body or WebSocket message; past it, a 413 (default: 4 MiB)")
    parser.add_argument("--mcp", action="store_true",
                        help="serve openenv's MCP routes too (off by default: treegym envs have no MCP tools)")
    parser.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from treegym.hosts import check_port, warn_if_exposed

    check_port(args.port)
    kwargs = json_object_option(args.env_kwargs)
    from treegym.integrations.openenv import serve

    warn_if_exposed(args.host, "the env server")
    server = serve(args.env_id, kwargs, split=args.split, host=args.host, port=args.port, max_episodes=args.max_episodes,
                   max_forks=args.max_forks, max_snapshots=args.max_snapshots,
                   max_session_snapshots=args.max_session_snapshots, idle_timeout_s=args.idle_timeout,
                   mcp=args.mcp, max_body_bytes=args.max_body_bytes)
    print(f"serving {args.env_id} over OpenEnv at {server.url} (WebSocket {server.url}/ws; Ctrl-C to stop)",
          file=sys.stderr, flush=True)
    server.serve_forever()
    return 0
