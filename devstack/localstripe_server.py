"""Serve localstripe on loopback with a fresh, memory-only store.

The stock `localstripe` command listens on every interface and pickles its
whole store to /tmp/localstripe.pickle on every write, reloading it at the next
start: runs leak into each other and every write gets slower as the store grows.
Here the app listens on 127.0.0.1 only and the dump is a no-op, so each start
is an empty provider.

    python -m devstack.localstripe_server --port 8420
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

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


async def _serve(port: int, edge_mode: str) -> None:
    """localstripe alone on `port`, or localstripe on a private port behind the Stripe edge."""
    from devstack.stripe_edge import Edge, EdgeConfig

    runners = []
    inner = web.AppRunner(build_app(), access_log=None)
    await inner.setup()
    runners.append(inner)
    if edge_mode == "off":
        await web.TCPSite(inner, HOST, port).start()
    else:
        private = web.TCPSite(inner, HOST, 0)
        await private.start()
        inner_port = private._server.sockets[0].getsockname()[1]
        edge = web.AppRunner(Edge(f"http://{HOST}:{inner_port}", EdgeConfig(mode=edge_mode)).app(),
                             access_log=None)
        await edge.setup()
        runners.append(edge)
        await web.TCPSite(edge, HOST, port).start()
    print(f"localstripe listening on http://{HOST}:{port} (edge {edge_mode})", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devstack.localstripe_server")
    parser.add_argument("--port", type=int, default=8420)
    parser.add_argument("--edge-mode", choices=["dedupe", "passthrough", "off"], default="dedupe",
                        help="serve through the Stripe edge (dedupe: keys as Stripe; passthrough: keys ignored)")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        asyncio.run(_serve(args.port, args.edge_mode))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
