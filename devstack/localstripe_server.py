"""Serve localstripe on loopback, behind the Stripe edge, with a store of our choosing.

The stock `localstripe` command listens on every interface and pickles its
whole store to /tmp/localstripe.pickle on every write, reloading it at the next
start: runs leak into each other and every write gets slower as the store grows.
Here the app listens on 127.0.0.1 only and the per-write dump is a no-op: each
start is an empty provider, or with --store the records saved at the last clean
stop (the local stack keeps them beside Temporal's history and the ledger).

    python -m devstack.localstripe_server --port 8420 [--edge-mode passthrough] [--store FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import pickle
import signal
from pathlib import Path

from aiohttp import web

HOST = "127.0.0.1"


def disable_disk_dump() -> None:
    """Make localstripe's store memory-only (it never reads the pickle unless asked)."""
    from localstripe import resources

    resources.Store.dump_to_disk = lambda self: None  # type: ignore[method-assign]


def build_app() -> web.Application:
    """Return localstripe's aiohttp app with the disk dump off.

    localstripe keeps one module-level app and store, so this is the same object
    on every call: wrap it (sub-app, middleware, proxy) rather than running it twice.
    """
    disable_disk_dump()
    from localstripe.server import app

    return app


def load_store(path: Path) -> None:
    from localstripe import resources

    if path.exists():
        with path.open("rb") as f:
            resources.store.clear()
            dict.update(resources.store, pickle.load(f))


def save_store(path: Path) -> None:
    from localstripe import resources

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        pickle.dump(dict(resources.store), f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)


async def _serve(port: int, edge_mode: str, store: Path | None, host: str = HOST) -> None:
    """localstripe alone on `port`, or localstripe on a private port behind the Stripe edge."""
    from devstack.stripe_edge import Edge, EdgeConfig

    build_app()
    if store is not None:
        load_store(store)
    runners = []
    inner = web.AppRunner(build_app(), access_log=None)
    await inner.setup()
    runners.append(inner)
    if edge_mode == "off":
        await web.TCPSite(inner, host, port).start()
    else:
        private = web.TCPSite(inner, HOST, 0)
        await private.start()
        inner_port = private._server.sockets[0].getsockname()[1]
        edge = web.AppRunner(Edge(f"http://{HOST}:{inner_port}", EdgeConfig(mode=edge_mode)).app(),
                             access_log=None)
        await edge.setup()
        runners.append(edge)
        await web.TCPSite(edge, host, port).start()
    print(f"localstripe listening on http://{host}:{port} (edge {edge_mode})", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
        if store is not None:
            save_store(store)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devstack.localstripe_server")
    parser.add_argument("--port", type=int, default=8420)
    parser.add_argument("--edge-mode", choices=["dedupe", "passthrough", "off"], default="dedupe",
                        help="serve through the Stripe edge (dedupe: keys as Stripe; passthrough: keys ignored)")
    parser.add_argument("--host", default=HOST, help="127.0.0.1 unless inside a container")
    parser.add_argument("--store", type=Path, help="load the provider's records from here; save them at stop")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        asyncio.run(_serve(args.port, args.edge_mode, args.store, args.host))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
