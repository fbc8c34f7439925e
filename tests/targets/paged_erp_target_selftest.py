#!/usr/bin/env python3
"""Self-test for paged_erp_target.py.

Starts the target as a subprocess on port 0, checks every route, fault shape
and stats field from the outside (http.client and raw sockets), stops it with
SIGTERM and expects exit status 0.  Run:

    python3 tests/targets/paged_erp_target_selftest.py

Exits 0 on success; on failure prints the failed check and exits 1.
"""

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "paged_erp_target.py")
PORT = None


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def eq(got, want, what):
    if got != want:
        raise Failure("%s: got %r, want %r" % (what, got, want))


def call(method, path, body=None, headers=None, conn=None):
    """One request; returns (status, headers dict (lower-case), parsed JSON)."""
    own = conn is None
    if own:
        conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=headers or {})
    resp = conn.getresponse()
    raw = resp.read()
    hdrs = {k.lower(): v for k, v in resp.getheaders()}
    if own:
        conn.close()
    eq(hdrs.get("content-type"), "application/json", "%s %s content-type" % (method, path))
    eq(hdrs.get("content-length"), str(len(raw)), "%s %s content-length" % (method, path))
    return resp.status, hdrs, (json.loads(raw) if raw else None)


def ok(method, path, body=None, headers=None):
    status, _, doc = call(method, path, body, headers)
    eq(status, 200, "%s %s status" % (method, path))
    return doc


def settings(**kw):
    return ok("POST", "/_target/settings", kw)


def stats():
    return ok("GET", "/_target/stats")


def create(ref, **extra):
    return ok("POST", "/api/orders", dict(extra, ref=ref))


def refs(items):
    return [i["ref"] for i in items]


# ---------------------------------------------------------------------------

def test_cli_and_errors():
    eq(settings(reset=True), {"dedupe": False, "search_lag_ms": 0, "create_faults": []},
       "settings after reset")
    eq(call("GET", "/nope")[0], 404, "unknown path")
    eq(call("GET", "/_target/nope")[0], 404, "unknown control path")
    eq(call("GET", "/api/orders/")[0], 404, "trailing slash")
    status, hdrs, _ = call("DELETE", "/api/orders")
    eq((status, hdrs.get("allow")), (405, "GET, POST"), "DELETE /api/orders")
    eq(call("GET", "/api/orders/SO-1/cancel")[0], 405, "GET cancel")
    eq(call("POST", "/api/v2/orders", {})[0], 405, "POST v2")
    eq(call("PUT", "/_target/stats")[0], 405, "PUT stats")
    eq(call("GET", "/_target/seed")[0], 405, "GET seed")
    # keep-alive: several requests on one connection
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
    for _ in range(3):
        eq(call("GET", "/_target/stats", conn=conn)[0], 200, "keep-alive request")
    conn.close()
    st = stats()
    eq([(r["method"], r["path"]) for r in st["requests"]],
       [("GET", "/nope"), ("GET", "/api/orders/"), ("DELETE", "/api/orders"),
        ("GET", "/api/orders/SO-1/cancel"), ("POST", "/api/v2/orders")],
       "requests record business paths only")


def test_create_validation_and_dedupe():
    settings(reset=True)
    for body in (b"not json", b"[1,2]", b"{}", b'{"ref": 5}', b'{"ref": null}'):
        status, _, doc = call("POST", "/api/orders", body)
        eq(status, 200, "validation status for %r" % body)
        eq((doc["status"], doc["code"]), ("ERROR", "VALIDATION"), "validation for %r" % body)
        check(isinstance(doc.get("message"), str), "validation message")
    st = stats()
    eq((st["creates_received"], st["orders"], st["orders_by_ref"]), (5, 0, {}),
       "nothing committed on validation errors")

    doc = create("A-1", amount=12.5)
    eq(doc, {"status": "OK", "data": {"order_no": "SO-1", "ref": "A-1", "amount": 12.5}},
       "first create")
    doc = ok("POST", "/api/orders", {"ref": "A-1"}, {"Idempotency-Key": "k-1"})
    eq(doc["data"], {"order_no": "SO-2", "ref": "A-1", "amount": None},
       "same ref without dedupe is a new order (key not honoured)")
    doc = ok("POST", "/api/orders", {"ref": "A-1"}, {"Idempotency-Key": "k-1"})
    eq(doc["data"]["order_no"], "SO-3", "same Idempotency-Key is not honoured")

    eq(settings(dedupe=True)["dedupe"], True, "dedupe on")
    doc = create("A-1")
    eq(doc, {"status": "ERROR", "code": "DUPLICATE", "message": "order with ref A-1 exists",
             "data": {"order_no": "SO-1"}}, "dedupe answer points at the oldest order")
    eq(create("A-10")["data"]["order_no"], "SO-4", "dedupe is exact match, not substring")
    st = stats()
    eq(st["creates_received"], 10, "creates_received counts all outcomes")
    eq(st["orders"], 4, "orders")
    eq(st["orders_by_ref"], {"A-1": 3, "A-10": 1}, "orders_by_ref")
    eq(st["duplicate_orders"], 2, "duplicate_orders")
    keys = [r["idempotency_key"] for r in st["requests"]]
    eq(keys, [None] * 6 + ["k-1", "k-1", None, None], "idempotency keys recorded")
    eq(st["requests"][6], {"method": "POST", "path": "/api/orders", "query": "",
                           "idempotency_key": "k-1", "shape": None}, "request entry")


def test_search_v1():
    settings(reset=True)
    for ref in ("t:crm:1", "t:crm:10", "x", "t:crm:11", "t:crm:2"):
        create(ref)
    doc = ok("GET", "/api/orders?q=t:crm:1")
    eq(doc["status"], "OK", "v1 status")
    eq(doc["page"], 1, "v1 default page")
    eq(doc["data"], [{"order_no": "SO-1", "ref": "t:crm:1", "state": "open"},
                     {"order_no": "SO-2", "ref": "t:crm:10", "state": "open"}],
       "v1 first page (substring match, default per_page 2, oldest first)")
    nxt = doc["next"]
    check(isinstance(nxt, str) and nxt.startswith("/api/orders?"), "next link: %r" % nxt)
    doc = ok("GET", nxt)
    eq((doc["page"], refs(doc["data"]), doc["next"]), (2, ["t:crm:11"], None),
       "v1 last page via next link")
    doc = ok("GET", "/api/orders?q=t%3Acrm%3A&per_page=3")
    eq(refs(doc["data"]), ["t:crm:1", "t:crm:10", "t:crm:11"], "per_page=3")
    doc = ok("GET", doc["next"])
    eq((doc["page"], refs(doc["data"]), doc["next"]), (2, ["t:crm:2"], None),
       "next keeps q and per_page")
    doc = ok("GET", "/api/orders?q=t:crm:&per_page=4")
    eq((len(doc["data"]), doc["next"]), (4, None), "exactly full last page has no next")
    doc = ok("GET", "/api/orders?q=t:crm:1&page=9")
    eq((doc["data"], doc["page"], doc["next"]), ([], 9, None), "page past the end")
    doc = ok("GET", "/api/orders?q=a+b%2B")
    eq(doc["data"], [], "no match")
    doc = ok("GET", "/api/orders?q=&per_page=50")
    eq(len(doc["data"]), 5, "empty q matches all")
    create("a b+c")
    doc = ok("GET", "/api/orders?q=a+b%2B&per_page=1")
    eq(refs(doc["data"]), ["a b+c"], "+ is a space, %2B a plus")
    for bad in ("", "?page=1", "?q=x&page=0", "?q=x&page=-1", "?q=x&page=a",
                "?q=x&per_page=0", "?q=x&per_page=51", "?q=x&per_page=2.5"):
        status, _, doc = call("GET", "/api/orders" + bad)
        eq(status, 400, "v1 bad query %r" % bad)
        eq(doc["status"], "ERROR", "v1 400 body")
    st = stats()
    eq(st["searches"], {"v1": 17, "v2": 0}, "searches counts all v1 requests")
    eq(st["pages_served"], 9, "pages_served counts 200 answers")


def test_search_v2():
    settings(reset=True)
    for ref in ("t:crm:1", "t:crm:10", "t:crm:11"):
        create(ref)
    eq(ok("GET", "/api/v2/orders?q=t:crm:1"),
       {"items": [{"order_no": "SO-1", "ref": "t:crm:1", "state": "open"},
                  {"order_no": "SO-2", "ref": "t:crm:10", "state": "open"}]}, "v2 page 1")
    eq(ok("GET", "/api/v2/orders?q=t:crm:1&page=2"),
       {"items": [{"order_no": "SO-3", "ref": "t:crm:11", "state": "open"}]}, "v2 page 2")
    eq(ok("GET", "/api/v2/orders?q=t:crm:1&page=3"), {"items": []}, "v2 past the end")
    eq(len(ok("GET", "/api/v2/orders?q=t&per_page=50")["items"]), 2, "v2 ignores per_page")
    for bad in ("", "?q=x&page=0", "?q=x&page=z"):
        eq(call("GET", "/api/v2/orders" + bad)[0], 400, "v2 bad query %r" % bad)
    st = stats()
    eq((st["searches"], st["pages_served"]), ({"v1": 0, "v2": 7}, 4), "v2 counters")


def test_lag_and_seed():
    settings(reset=True)
    eq(settings(search_lag_ms=400)["search_lag_ms"], 400, "lag set")
    doc = ok("POST", "/_target/seed", {"orders": [{"ref": "L-1"},
                                                 {"ref": "L-2", "state": "shipped"}]})
    eq(doc["data"], [{"order_no": "SO-1", "ref": "L-1", "state": "open"},
                     {"order_no": "SO-2", "ref": "L-2", "state": "shipped"}], "seed answer")
    eq(create("L-3")["data"]["order_no"], "SO-3", "seeded orders share the sequence")
    eq(refs(ok("GET", "/api/orders?q=L-&per_page=10")["data"]), ["L-1", "L-2"],
       "fresh API order hidden by lag, seeded visible")
    eq(refs(ok("GET", "/api/v2/orders?q=L-3")["items"]), [], "v2 also lags")
    time.sleep(0.45)
    eq(refs(ok("GET", "/api/orders?q=L-&per_page=10")["data"]), ["L-1", "L-2", "L-3"],
       "visible after the lag")
    eq(refs(ok("GET", "/api/v2/orders?q=L-3")["items"]), ["L-3"], "v2 visible after lag")
    for bad in ({"orders": [{"ref": 1}]}, {"orders": [{"ref": "x", "state": 3}]},
                {"orders": [{"ref": "x", "extra": 1}]}, {"orders": {}}, {},
                {"orders": [], "more": 1}, [1]):
        eq(call("POST", "/_target/seed", bad)[0], 400, "bad seed %r" % (bad,))
    eq(call("POST", "/_target/seed", b"{bad")[0], 400, "seed bad json")
    settings(dedupe=True)
    eq(create("L-1")["data"], {"order_no": "SO-1"}, "dedupe sees seeded orders")
    settings(dedupe=False)
    create("L-1")
    st = stats()
    eq((st["seeded"], st["orders"], st["creates_received"]), (2, 2, 3), "seed counters")
    eq(st["orders_by_ref"], {"L-1": 2, "L-2": 1, "L-3": 1}, "orders_by_ref incl. seeded")
    eq(st["duplicate_orders"], 1, "duplicate over a seeded order")
    ok("POST", "/_target/seed", {"orders": [{"ref": "L-2"}]})
    eq(stats()["duplicate_orders"], 2, "seeded duplicates count too")


def test_cancel():
    settings(reset=True)
    create("C-1")
    eq(ok("POST", "/api/orders/SO-1/cancel"),
       {"status": "OK", "data": {"order_no": "SO-1", "state": "cancelled"}}, "cancel")
    ok("POST", "/api/orders/SO-1/cancel")
    doc = ok("POST", "/api/orders/SO-9/cancel")
    eq((doc["status"], doc["code"]), ("ERROR", "NOT_FOUND"), "cancel unknown")
    eq(ok("GET", "/api/orders?q=C-1")["data"][0]["state"], "cancelled", "state in search")
    eq(stats()["cancels"], {"SO-1": 2}, "cancels per order")


def lost_create(body):
    """POST /api/orders on a raw socket; return every byte the server sent."""
    s = socket.create_connection(("127.0.0.1", PORT), timeout=5)
    data = json.dumps(body).encode()
    s.sendall(b"POST /api/orders HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    got = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.close()
    return got


def test_faults():
    settings(reset=True)
    for bad in ({"create_faults": ["nope"]}, {"create_faults": "ok"}, {"dedupe": 1},
                {"dedupe": "yes"}, {"search_lag_ms": -1}, {"search_lag_ms": True},
                {"search_lag_ms": 1.5}, {"reset": 1}, {"colour": "red"},
                {"dedupe": True, "bogus": 1}):
        eq(call("POST", "/_target/settings", bad)[0], 400, "bad settings %r" % (bad,))
    eq(call("POST", "/_target/settings", b"[]")[0], 400, "settings not an object")
    eq(ok("GET", "/_target/settings"), {"dedupe": False, "search_lag_ms": 0,
                                        "create_faults": []}, "bad settings change nothing")

    queue = ["rate_limit", "busy_503", "lost", "ok", "lost"]
    eq(settings(create_faults=queue)["create_faults"], queue, "queue set")
    eq(create("F-1"), {"status": "ERROR", "code": "RATE_LIMIT", "message": "try later"},
       "rate_limit")
    status, hdrs, doc = call("POST", "/api/orders", {"ref": "F-1"})
    eq((status, hdrs.get("retry-after"), doc), (503, "0", {"status": "ERROR", "code": "BUSY"}),
       "busy_503")
    eq(stats()["orders"], 0, "rate_limit and busy_503 commit nothing")
    eq(lost_create({"ref": "F-1"}), b"", "lost sends no byte")
    eq(stats()["orders_by_ref"], {"F-1": 1}, "lost commits")
    eq(create("F-1")["data"]["order_no"], "SO-2", "ok shape is normal")
    eq(lost_create([1]), b"", "lost also swallows a validation error")
    eq(ok("GET", "/_target/settings")["create_faults"], [], "queue drained")
    eq(create("F-1")["data"]["order_no"], "SO-3", "empty queue is normal")
    st = stats()
    eq([r["shape"] for r in st["requests"]],
       ["rate_limit", "busy_503", "lost", "ok", "lost", None], "shapes recorded")
    eq((st["creates_received"], st["orders"], st["duplicate_orders"]), (6, 3, 2),
       "fault counters")
    # reset together with other keys: reset first, then the rest
    doc = settings(reset=True, dedupe=True, create_faults=["ok"])
    eq(doc, {"dedupe": True, "search_lag_ms": 0, "create_faults": ["ok"]}, "reset + set")
    st = stats()
    eq((st["orders"], st["requests"], st["orders_by_ref"]), (0, [], {}), "reset clears")
    eq(create("R")["data"]["order_no"], "SO-1", "numbers restart after reset")


def raw_exchange(data):
    """Send raw bytes, read until the server closes; return (head, body)."""
    s = socket.create_connection(("127.0.0.1", PORT), timeout=5)
    s.sendall(data)
    got = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.close()
    head, _, body = got.partition(b"\r\n\r\n")
    return head.decode("latin-1"), body


def test_raw_framing():
    settings(reset=True)
    head, body = raw_exchange(b"BROKEN\r\n\r\n")
    check(head.startswith("HTTP/1.1 400"), "malformed request line: %r" % head)
    check("Content-Type: application/json" in head, "malformed -> JSON")
    eq(json.loads(body)["status"], "ERROR", "malformed body")
    head, body = raw_exchange(b"POST /api/orders HTTP/1.1\r\nHost: t\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    check(head.startswith("HTTP/1.1 400") and "Connection: close" in head,
          "chunked body refused and closed: %r" % head)
    head, body = raw_exchange(b"HEAD /_target/stats HTTP/1.1\r\nHost: t\r\n"
                              b"Connection: close\r\n\r\n")
    check(head.startswith("HTTP/1.1 405") and "Content-Length:" in head, "HEAD: %r" % head)
    eq(body, b"", "HEAD answer has no body")
    st = stats()
    eq((st["creates_received"], st["requests"]), (0, []), "framing errors not recorded")


def main():
    global PORT
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, TARGET, "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    failed = None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 5)
        line = proc.stdout.readline() if ready else ""
        check(line.startswith("PORT "), "expected 'PORT <n>' line, got %r" % line)
        PORT = int(line.split()[1])
        tests = [v for k, v in sorted(globals().items()) if k.startswith("test_")]
        for t in tests:
            try:
                t()
                print("ok   %s" % t.__name__)
            except Exception as e:  # noqa: BLE001 - report and stop
                failed = "%s: %s" % (t.__name__, e)
                if not isinstance(e, Failure):
                    traceback.print_exc()
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
    if failed is None and rc != 0:
        failed = "target exit status after SIGTERM: %r" % rc
    if failed:
        print("FAIL %s" % failed)
        return 1
    print("PASS paged_erp_target selftest (%.1fs)" % (time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
