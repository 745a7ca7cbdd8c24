"""Serve localstripe on loopback, behind the Stripe edge, with a store of our choosing.

The stock `localstripe` command listens on every interface and pickles its
whole store to /tmp/localstripe.pickle on every write, reloading it at the next
start: runs leak into each other and every write gets slower as the store grows.
Here the app listens on 127.0.0.1 only and the per-write dump is a no-op: each
start is an empty provider, or with --store the records saved at the last clean
stop (the local stack keeps them beside Temporal's history and the ledger).

localstripe also lists objects by scanning its whole store, and it lists a
charge's refunds each time it shows a charge (every payment and every event):
each order cost more than the last, 80 ms at 2,500 orders. Here the store keeps
an index by object type, so a list reads only its own type, as Stripe's does.

    python -m devstack.localstripe_server --port 8420 [--edge-mode passthrough] [--store FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import pickle
import signal
from pathlib import Path
from typing import Any

from aiohttp import web

HOST = "127.0.0.1"


def disable_disk_dump() -> None:
    """Make localstripe's store memory-only (it never reads the pickle unless asked)."""
    from localstripe import resources

    resources.Store.dump_to_disk = lambda self: None  # type: ignore[method-assign]


def index_store_by_type() -> None:
    """Keep localstripe's store indexed by object type ("refund:re_1" is filed under "refund") and
    list from the index. Same objects, same order (insertion), same errors as the scan it replaces."""
    from localstripe import resources

    Store = resources.Store
    if getattr(Store, "_indexed", False):
        return

    def by_type(store: dict) -> dict[str, dict[str, Any]]:
        index = store.__dict__.get("_by_type")
        if index is None:  # first use, or after clear(): build it from what the store holds
            index = store.__dict__["_by_type"] = {}
            for key, value in dict.items(store):
                kind, sep, _ = key.partition(":")
                if sep:
                    index.setdefault(kind, {})[key] = value
        return index

    def setitem(self: dict, key: str, value: Any) -> None:
        dict.__setitem__(self, key, value)
        kind, sep, _ = key.partition(":")
        if sep:
            by_type(self).setdefault(kind, {})[key] = value

    def delitem(self: dict, key: str) -> None:
        dict.__delitem__(self, key)
        by_type(self).get(key.partition(":")[0], {}).pop(key, None)

    def clear(self: dict) -> None:
        dict.clear(self)
        self.__dict__.pop("_by_type", None)
        self.__dict__.pop("_refunds_by_charge", None)

    def list_all(cls: Any, url: str, limit: Any = None, starting_after: Any = None, **kwargs: Any) -> Any:
        if kwargs:
            raise resources.UserError(400, "Unexpected " + ", ".join(kwargs.keys()))
        page = resources.List(url, limit=limit, starting_after=starting_after)
        page._list = list(by_type(resources.store).get(cls.object, {}).values())
        return page

    Store.__setitem__, Store.__delitem__, Store.clear = setitem, delitem, clear  # type: ignore[method-assign]
    resources.StripeObject._api_list_all = classmethod(list_all)  # type: ignore[method-assign,assignment]
    Store._indexed = True  # type: ignore[attr-defined]


def index_refunds_by_charge() -> None:
    """localstripe lists a PaymentIntent's refunds by filtering every refund it holds, so each list costs
    more than the last (a tenth of its CPU in a load round; a week holds thousands). Here each charge's
    refunds are kept apart as they are made and a list reads only its own: the same refunds in the same
    order (newest first, ties in the order made), the same errors."""
    from localstripe import resources

    Refund = resources.Refund
    if getattr(Refund, "_indexed", False):
        return
    make = Refund.__init__
    list_every = Refund._api_list_all.__func__  # type: ignore[attr-defined]

    def by_charge(store: dict) -> dict[str, list[Any]]:
        index = store.__dict__.get("_refunds_by_charge")
        if index is None:  # first use, or after clear() (a load, a flush): built from what the store holds
            index = store.__dict__["_refunds_by_charge"] = {}
            for value in dict.values(store):
                if isinstance(value, Refund):
                    index.setdefault(value.charge, []).append(value)
        return index

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        index = by_charge(resources.store)  # before this refund is in the store, so it is filed once
        make(self, *args, **kwargs)
        index.setdefault(self.charge, []).append(self)

    def list_all(cls: Any, url: str, charge: Any = None, payment_intent: Any = None, limit: Any = None,
                 starting_after: Any = None) -> Any:
        if charge is None and payment_intent is None:  # every refund: localstripe's own list
            return list_every(cls, url, limit=limit, starting_after=starting_after)
        if charge is None:
            if not (type(payment_intent) is str and payment_intent.startswith("pi_")):
                raise resources.UserError(400, "Bad request")
            charge = resources.PaymentIntent._api_retrieve(payment_intent).latest_charge.id
        elif not (type(charge) is str and charge.startswith("ch_") and payment_intent is None):
            raise resources.UserError(400, "Bad request")
        page = resources.List(url, limit=limit, starting_after=starting_after)
        resources.Charge._api_retrieve(charge)  # 404 for a charge that does not exist
        page._list = sorted(by_charge(resources.store).get(charge, []), key=lambda r: r.date, reverse=True)
        return page

    Refund.__init__ = init  # type: ignore[method-assign]
    Refund._api_list_all = classmethod(list_all)  # type: ignore[method-assign,assignment]
    Refund._indexed = True  # type: ignore[attr-defined]


def filter_payment_intents_by_customer() -> None:
    """Stripe lists a customer's PaymentIntents (`customer=cus_...`); localstripe refuses the parameter, so
    a payee's payments had to be found by reading every PaymentIntent of the account, page after page, at
    each payment task. Here the list takes it: the same objects in the same order as the full list, only
    the customer's (none for a customer it does not hold); 400 for a value that is not a customer id."""
    from localstripe import resources

    PaymentIntent = resources.PaymentIntent
    if getattr(PaymentIntent, "_by_customer", False):
        return
    list_every = PaymentIntent._api_list_all.__func__  # type: ignore[attr-defined]

    def list_all(cls: Any, url: str, customer: Any = None, limit: Any = None, starting_after: Any = None,
                 **kwargs: Any) -> Any:
        page = list_every(cls, url, limit=limit, starting_after=starting_after, **kwargs)  # 400 for the unknown
        if customer is not None:
            if not (type(customer) is str and customer.startswith("cus_")):
                raise resources.UserError(400, "Bad request")
            page._list = [intent for intent in page._list if intent.customer == customer]
        return page

    PaymentIntent._api_list_all = classmethod(list_all)  # type: ignore[method-assign,assignment]
    PaymentIntent._by_customer = True  # type: ignore[attr-defined]


def compact_json() -> None:
    """localstripe indents and sorts the keys of every answer, which sends each through json's pure-Python
    encoder: a tenth of its CPU per request. The same JSON without the whitespace takes the C encoder."""
    from localstripe import server

    server.json_response = web.json_response


def build_app() -> web.Application:
    """Return localstripe's aiohttp app with the disk dump off.

    localstripe keeps one module-level app and store, so this is the same object
    on every call: wrap it (sub-app, middleware, proxy) rather than running it twice.
    """
    disable_disk_dump()
    index_store_by_type()
    index_refunds_by_charge()
    filter_payment_intents_by_customer()
    compact_json()
    from localstripe.server import app

    return app


def load_store(path: Path) -> None:
    from localstripe import resources

    if path.exists():
        with path.open("rb") as f:
            resources.store.clear()
            for key, value in pickle.load(f).items():
                resources.store[key] = value


def save_store(path: Path) -> None:
    from localstripe import resources

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        pickle.dump(dict(resources.store), f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)


async def _serve(port: int, edge_mode: str, store: Path | None, host: str = HOST) -> None:
    """localstripe on `port`, alone or behind the Stripe edge (its first middleware: devstack/stripe_edge.py)."""
    from devstack.stripe_edge import Edge, EdgeConfig

    app = build_app()
    if store is not None:
        load_store(store)
    if edge_mode != "off":
        Edge(EdgeConfig(mode=edge_mode)).install(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"localstripe listening on http://{host}:{port} (edge {edge_mode})", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
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
