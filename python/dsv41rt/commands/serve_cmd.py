"""`dsv41rt serve` (the OpenAI-compatible server) and `dsv41rt config validate|dump`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

from ..errors import Dsv41rtError
from ..serve.config import KEYS, ServeConfig, build_config, dump, load_file

_LIST_KEYS = ("served_model_name", "api_key", "prefill_servers")


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (flags override it)")
    group = p.add_argument_group("config keys (also valid in the YAML file, kebab- or snake_case)")
    for name in KEYS:
        if name == "model":
            continue
        flag = "--" + name.replace("_", "-")
        if name in _LIST_KEYS:
            group.add_argument(flag, dest=name, action="append", default=None, metavar="VALUE")
        else:
            group.add_argument(flag, dest=name, default=None, metavar="VALUE")


def _model_arg(args: argparse.Namespace) -> str | None:
    """The checkpoint given on the command line: positionally or with --model (their own dests:
    sharing one, the positional's None used to override the flag), never two different ones."""
    positional, flag = getattr(args, "model_path", None), getattr(args, "model_flag", None)
    if positional and flag and positional != flag:
        raise Dsv41rtError(f"two models given: {positional!r} (positional) and --model {flag!r}")
    return positional or flag


def _overrides(args: argparse.Namespace) -> dict:
    out = {name: getattr(args, name) for name in KEYS if getattr(args, name, None) is not None}
    model = _model_arg(args)
    if model:
        out["model"] = model
    return out


def _resolve(args: argparse.Namespace) -> ServeConfig:
    file_values = load_file(args.config) if args.config else None
    return build_config(file_values, _overrides(args))


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (built-in tiny model when none is given)")
    s.add_argument("model_path", nargs="?", metavar="MODEL", help="checkpoint directory (overrides `model:`)")
    s.add_argument("--model", dest="model_flag", help=argparse.SUPPRESS)
    _add_config_flags(s)
    s.set_defaults(run=run_serve)
    c = sub.add_parser("config", help="validate a serve config file or print the effective config")
    csub = c.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    v = csub.add_parser("validate", help="check a YAML config; exit 2 naming the first bad key")
    v.add_argument("file")
    v.set_defaults(run=run_validate)
    d = csub.add_parser("dump", help="print the effective config (defaults < file < flags) as YAML")
    d.add_argument("file", nargs="?")
    d.add_argument("model_path", nargs="?", help=argparse.SUPPRESS)
    _add_config_flags(d)
    d.set_defaults(run=run_dump)


def run_validate(args: argparse.Namespace) -> int:
    build_config(load_file(args.file), {})
    print(f"{args.file}: valid")
    return 0


def run_dump(args: argparse.Namespace) -> int:
    if args.file and args.config:
        raise Dsv41rtError("give the config file once (positionally or with --config)")
    args.config = args.config or args.file
    sys.stdout.write(dump(_resolve(args)))
    return 0


def run_serve(args: argparse.Namespace) -> int:
    cfg = _resolve(args)
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("dsv41rt.serve")
    if "DSV41RT_API_KEY" in os.environ and not os.environ["DSV41RT_API_KEY"] and not cfg.api_key:
        log.warning("DSV41RT_API_KEY is set but empty: the server is open to anyone (no API key)")
    try:  # every server package, before a model loads
        import uvicorn  # noqa: F401

        from ..serve.app import create_app  # noqa: F401
        from ..serve.protocol import Tokenizers
    except ImportError as err:
        raise Dsv41rtError(
            f"the server needs its packages ({err.name} is missing): pip install 'dsv41rt[serve]'"
        ) from None
    if cfg.disaggregation_mode != "none" and cfg.handoff_transport == "nixl":
        from ..serve.handoff_transport import import_nixl, import_torch_cuda, resolve_memory

        import_nixl()  # refuses now, naming the package and the extra, rather than after the model loads
        if resolve_memory(cfg.handoff_memory, cfg.runtime.device) is not None:
            import_torch_cuda()
    from ..serve.tiny_model import NAME, ensure_tiny_model

    if cfg.model is not None and not os.path.isdir(cfg.model):
        raise Dsv41rtError(f"model: {cfg.model!r} is not a directory")
    # The port before any model work: a clash is one line at once, not a traceback after the load.
    sock = _listen(cfg.host, cfg.port)
    if cfg.model is None:
        log.info("no model configured: using the built-in tiny V4.1 checkpoint (generated on first use)")
        model_dir, default_name = ensure_tiny_model(cfg.tiny_model_dir), NAME
    else:
        model_dir, default_name = cfg.model, os.path.basename(os.path.normpath(cfg.model))
    try:
        tok = Tokenizers(model_dir)
    except (OSError, ValueError) as err:
        raise Dsv41rtError(str(err)) from None
    log.info("loading %s on %s", model_dir, cfg.runtime.device)
    from ..cp_launch import open_runtime

    # CP worker processes, when configured, live as long as the server.
    with sock, open_runtime(model_dir, cfg.runtime, progress=True, engine_thread=True) as rt:
        return _serve(cfg, rt, tok, model_dir, default_name, log, sock)


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (uvicorn serves on it), or a Dsv41rtError naming the address."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as err:
        raise Dsv41rtError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise Dsv41rtError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return sock


def _serve(
    cfg: ServeConfig, rt, tok, model_dir: str, default_name: str, log: logging.Logger, sock: socket.socket
) -> int:
    import uvicorn

    from ..serve.app import ServerState, create_app
    from ..serve.engine_loop import EngineLoop
    from ..serve.metrics import Metrics
    from ..serve.protocol import ApiError

    log.info("%s", rt.describe_pool())
    names = cfg.model_names(default_name)
    stats = rt.stats()
    capacity = stats["pages_total"] * stats["page_size"]
    limit = cfg.runtime.max_model_len
    context_limit = min(limit, capacity) if limit else capacity
    holder: dict = {}
    metrics = Metrics(names[0], lambda: holder["engine"].stats, cfg.handoff_transport)

    def finished(req, reason: str) -> None:
        metrics.finished(
            reason, len(req.prompt), req.generated, req.arrival, req.first_token, req.last_token, req.token_gaps
        )

    engine = EngineLoop(rt, on_finish=finished)
    holder["engine"] = engine
    state = ServerState(cfg, engine, tok, names, metrics, rt.config.vocab_size, context_limit)
    if state.handoffs.nixl is not None:
        metrics.watch_lent_states(state.handoffs.nixl.registered)
    app = create_app(state)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=cfg.host,
            port=cfg.port,
            log_level=cfg.log_level,
            timeout_graceful_shutdown=max(int(cfg.shutdown_timeout + 0.999), 1),
        )
    )
    state.server = server

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)

        stop_now = asyncio.Event()

        async def reap_handoffs() -> None:  # frees NIXL-lent states once read (their notifications)
            while True:
                await asyncio.sleep(0.5)
                state.handoffs.reap()

        reaper = asyncio.create_task(reap_handoffs()) if state.handoffs.nixl is not None else None

        def drain() -> None:  # SIGTERM / SIGINT: stop accepting, let in-flight requests finish
            if state.draining:
                if stop_now.is_set():
                    server.should_exit = True  # a third signal: exit without waiting for the aborts
                stop_now.set()  # a second signal: abort the in-flight requests now
                return
            state.draining = True
            log.info("draining: %d request(s) in flight, up to %.0f s", state.active, cfg.shutdown_timeout)

            async def wait() -> None:
                deadline = loop.time() + cfg.shutdown_timeout
                while (state.active > 0 or engine.in_flight() > 0) and loop.time() < deadline:
                    if stop_now.is_set():
                        break
                    await asyncio.sleep(0.05)
                if state.active > 0 or engine.in_flight() > 0:
                    why = "second signal" if stop_now.is_set() else "drain timeout"
                    log.info("%s: aborting %d request(s)", why, state.active)
                    engine.cancel_all(ApiError(503, "the server is shutting down: the request was aborted"))
                    # The engine aborts after its current step (a prefill chunk can take seconds): wait
                    # for the streams to end (with the error) before uvicorn's shutdown, whose graceful
                    # timeout would otherwise cancel them mid-response.
                    end = loop.time() + 30
                    while state.active > 0 and loop.time() < end:
                        await asyncio.sleep(0.05)
                server.should_exit = True

            asyncio.ensure_future(wait())

        if server.started:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, drain)
            names_str = ", ".join(names)
            log.info(
                "serving %s on http://%s:%d (model names: %s)", model_dir, cfg.host, _bound_port(server), names_str
            )
        await task
        if reaper is not None:
            reaper.cancel()

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    return 0 if server.started else 1


def _bound_port(server) -> int:
    for s in getattr(server, "servers", []):
        for sock in s.sockets:
            return sock.getsockname()[1]
    return server.config.port
