"""``treegym serve-model``: serve a local model over the OpenAI protocol."""

from __future__ import annotations

import argparse
import re
import sys

from treegym.errors import ConfigError


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve-model",
        help="serve a local model over an OpenAI-compatible HTTP API",
        description=(
            "Serve a local causal LM over an OpenAI-compatible API: POST /v1/chat/completions "
            "(chat template applied; OpenAI tool messages and tool calls), POST /v1/completions and "
            "GET /v1/models. Point "
            "`treegym eval --agent openai:http://HOST:PORT/v1` or any OpenAI client at it."
        ),
    )
    parser.add_argument(
        "--model", default="smollm2", help="'smollm2' (the embedded default) or a local HF model folder"
    )
    parser.add_argument("--name", default=None, help="model id reported by /v1/models (default: --model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8001, help="port to bind (default: 8001)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.set_defaults(func=_serve)


def check_device(device: str | None) -> None:
    """``--device`` is cpu, cuda, cuda:N or mps (None: the model loader picks); checked before a model loads."""
    if device is not None and not re.fullmatch(r"cpu|mps|cuda(:\d{1,3})?", device):
        raise ConfigError(f"--device must be cpu, cuda, cuda:N or mps, got {device[:40]!r}")


def _serve(args: argparse.Namespace) -> int:
    from treegym.agents.hf_policy import HFPolicy
    from treegym.agents.serve_model import ModelServer, ModelService
    from treegym.hosts import check_port, warn_if_exposed

    check_port(args.port)
    check_device(args.device)
    warn_if_exposed(args.host, "the model API")
    policy = HFPolicy.from_pretrained(args.model, device=args.device)
    try:
        server = ModelServer(ModelService(policy, args.name or args.model), args.host, args.port)
    except OSError as exc:
        raise ConfigError(f"cannot bind {args.host}:{args.port} ({exc.strerror or exc}); pick another --port") from None
    print(f"serving {args.model} at {server.url}/v1 (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        server.httpd.server_close()
    return 0
