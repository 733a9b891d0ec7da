"""`dsv41rt router`: one OpenAI-compatible endpoint over prefill and decode servers
(dsv41rt.serve.router; docs/design/disaggregation.md)."""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

from ..errors import Dsv41rtError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "router", help="route requests to prefill servers, then decode servers (prefill/decode disaggregation)"
    )
    p.add_argument("--prefill", nargs="+", required=True, metavar="URL", help="`serve --disaggregation-mode prefill`")
    p.add_argument("--decode", nargs="+", required=True, metavar="URL", help="`serve --disaggregation-mode decode`")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a server may take to answer")
    p.add_argument("--log-level", default="info")
    p.set_defaults(run=run)


def _url(value: str, flag: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Dsv41rtError(f"{flag}: {value!r} is not an http(s) URL")
    return value.rstrip("/")


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..serve.router import Router, RouterConfig
    except ImportError as err:
        missing = f"the router needs the server's packages ({err.name} is missing)"
        raise Dsv41rtError(f"{missing}: pip install 'dsv41rt[serve]'") from None
    if args.timeout <= 0:
        raise Dsv41rtError(f"--timeout must be > 0, got {args.timeout}")
    cfg = RouterConfig(
        tuple(_url(u, "--prefill") for u in args.prefill), tuple(_url(u, "--decode") for u in args.decode), args.timeout
    )
    uvicorn.run(Router(cfg).app(), host=args.host, port=args.port, log_level=args.log_level)
    return 0
