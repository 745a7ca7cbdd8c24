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
import logging

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devstack.localstripe_server")
    parser.add_argument("--port", type=int, default=8420)
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = build_app()
    print(f"localstripe listening on http://{HOST}:{args.port}", flush=True)
    web.run_app(app, host=HOST, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
