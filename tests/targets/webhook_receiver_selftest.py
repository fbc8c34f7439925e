#!/usr/bin/env python3
"""Self-test of webhook_receiver.py (Python 3.11 standard library only).

Starts the receiver as a subprocess on an ephemeral loopback port and checks:
delivery, deduplication on Webhook-Id (sequential and concurrent), 400
without an id or with a non-JSON body, 413 over 1 MiB, every fault shape
(including that accept_then_reset delivers while the client sees a
connection reset), the stats shape, reset, control-route 404/405, refusal of
a non-loopback host and a clean exit 0 on SIGTERM.

Usage:  python3 webhook_receiver_selftest.py      (exit status 0 = pass)
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "webhook_receiver.py")
STATS_KEYS = {"requests_total", "delivered", "duplicates_seen", "by_id",
              "deliveries", "delivered_by_recipient"}


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


class Receiver:
    """The receiver subprocess and small HTTP helpers around it."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, TARGET, "--port", "0"],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        check(line.startswith("PORT ") and line.endswith("\n"), "PORT line: %r" % line)
        self.port = int(line.split()[1])

    def request(self, method, path, body=None, headers=None):
        """One request on a fresh connection: (status, headers, parsed JSON)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            conn.request(method, path, body=data, headers=headers or {})
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, resp.headers, (json.loads(raw) if raw else None)
        finally:
            conn.close()

    def hook(self, msg_id, body, path="/hooks/in"):
        headers = {"Content-Type": "application/json"}
        if msg_id is not None:
            headers["Webhook-Id"] = msg_id
        return self.request("POST", path, body, headers)

    def raw_hook(self, msg_id, body, path="/hooks/in"):
        """Send one webhook on a raw socket and read until the server ends the
        connection.  Returns ("reset"|"eof", bytes received, seconds taken)."""
        data = json.dumps(body).encode()
        req = ("POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               "Webhook-Id: %s\r\nContent-Length: %d\r\n\r\n"
               % (path, msg_id, len(data))).encode() + data
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(req)
            got = b""
            try:
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        return "eof", got, time.monotonic() - t0
                    got += chunk
            except ConnectionResetError:
                return "reset", got, time.monotonic() - t0

    def control(self, method, path, body=None):
        status, _, doc = self.request(method, path, body)
        return status, doc

    def stats(self):
        status, doc = self.control("GET", "/_target/stats")
        check(status == 200, "stats status %s" % status)
        return doc

    def faults(self, shapes, **extra):
        status, doc = self.control("POST", "/_target/faults", dict(next=shapes, **extra))
        check(status == 200 and doc["next"] == shapes, "set faults: %s %r" % (status, doc))

    def reset(self):
        check(self.control("POST", "/_target/reset")[0] == 200, "reset")

    def stop(self):
        """SIGTERM; returns the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def test_delivery_and_dedup(r):
    st, _, doc = r.hook("msg_1", {"type": "invoice.paid", "recipient": "alice"})
    check(st == 200 and doc == {"id": "msg_1", "delivered": True, "duplicate": False},
          "first delivery %s %r" % (st, doc))
    st, _, doc = r.hook("msg_1", {"type": "invoice.paid", "recipient": "alice"})
    check(st == 200 and doc["delivered"] is False and doc["duplicate"] is True,
          "duplicate ack %s %r" % (st, doc))
    st, _, _ = r.hook("msg_2", {"type": "x", "recipient": "bob"}, path="/other")
    check(st == 200, "second id")
    s = r.stats()
    check(set(s) == STATS_KEYS, "stats keys %r" % sorted(s))
    check(s["requests_total"] == 3 and s["delivered"] == 2 and s["duplicates_seen"] == 1,
          "counters %r" % s)
    check(s["by_id"] == {"msg_1": 2, "msg_2": 1}, "by_id %r" % s["by_id"])
    check(s["deliveries"] == [
        {"id": "msg_1", "path": "/hooks/in", "seq": 1,
         "body": {"type": "invoice.paid", "recipient": "alice"}},
        {"id": "msg_2", "path": "/other", "seq": 3,
         "body": {"type": "x", "recipient": "bob"}}], "deliveries %r" % s["deliveries"])
    check(s["delivered_by_recipient"] == {"alice": 1, "bob": 1}, "by recipient %r" % s)


def test_bad_requests(r):
    st, _, doc = r.hook(None, {"a": 1})
    check(st == 400, "no Webhook-Id -> %s" % st)
    st, _, _ = r.request("POST", "/hooks/in", b"not json", {"Webhook-Id": "msg_bad"})
    check(st == 400, "non-JSON -> %s" % st)
    # Headers only: the receiver must refuse on Content-Length alone (sending
    # the body too could make an unread-data RST race the 413 answer).
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        s.sendall(b"POST /hooks/in HTTP/1.1\r\nHost: x\r\nWebhook-Id: big\r\n"
                  b"Content-Length: %d\r\n\r\n" % (1024 * 1024 + 1))
        head = s.recv(65536)
    check(head.startswith(b"HTTP/1.1 413 "), "over 1 MiB -> %r" % head[:40])
    st, hdrs, _ = r.request("GET", "/hooks/in")
    check(st == 405 and hdrs["Allow"] == "POST", "GET business path -> %s" % st)
    s = r.stats()
    check(s["delivered"] == 0 and s["deliveries"] == [], "nothing delivered %r" % s)
    check(s["by_id"] == {"msg_bad": 1}, "by_id counts bad bodies %r" % s["by_id"])
    # A message whose first attempt was rejected can still be delivered.
    check(r.hook("msg_bad", {"ok": True})[2]["delivered"] is True, "delivery after 400")


def test_control_routes(r):
    check(r.control("GET", "/_target/nope")[0] == 404, "unknown control 404")
    check(r.control("GET", "/_target/reset")[0] == 405, "GET reset 405")
    check(r.control("DELETE", "/_target/stats")[0] == 405, "DELETE stats 405")
    check(r.control("POST", "/_target/faults", {"next": ["bogus"]})[0] == 400, "bad shape 400")
    r.faults(["status_500", "ok"], stall_ms=250)
    st, doc = r.control("GET", "/_target/faults")
    check(st == 200 and doc == {"next": ["status_500", "ok"], "stall_ms": 250,
                                "retry_after_s": 1}, "GET faults %r" % doc)
    r.reset()
    check(r.control("GET", "/_target/faults")[1]["next"] == [], "reset clears queue")


def test_status_faults(r):
    r.faults(["status_500", "status_503"])
    st, _, _ = r.hook("m5", {"n": 1})
    check(st == 500, "status_500 -> %s" % st)
    st, hdrs, _ = r.hook("m5", {"n": 1})
    check(st == 503 and hdrs["Retry-After"] == "1", "status_503 -> %s %s" % (st, hdrs))
    check(r.stats()["delivered"] == 0, "5xx not delivered")
    st, _, doc = r.hook("m5", {"n": 1})        # queue empty -> ok
    check(st == 200 and doc["delivered"] is True, "retry after 5xx delivers")
    s = r.stats()
    check(s["by_id"] == {"m5": 3} and s["duplicates_seen"] == 0 and s["delivered"] == 1,
          "after 5xx retries %r" % s)


def test_drop_faults(r):
    r.faults(["accept_then_reset", "accept_then_close", "close_before", "accept_then_stall"],
             stall_ms=300)
    how, got, _ = r.raw_hook("d1", {"recipient": "carol"})
    check(how == "reset" and got == b"", "accept_then_reset seen as %s %r" % (how, got))
    check(r.stats()["delivered"] == 1, "accept_then_reset delivered")
    how, got, _ = r.raw_hook("d2", {"recipient": "carol"})
    check(how == "eof" and got == b"", "accept_then_close seen as %s %r" % (how, got))
    check(r.stats()["delivered"] == 2, "accept_then_close delivered")
    how, got, _ = r.raw_hook("d3", {"recipient": "carol"})
    check(how == "eof" and got == b"", "close_before seen as %s %r" % (how, got))
    check(r.stats()["delivered"] == 2, "close_before not delivered")

    result = {}
    t = threading.Thread(target=lambda: result.update(r=r.raw_hook("d4", {"recipient": "dan"})))
    t.start()
    time.sleep(0.15)
    check("d4" in [d["id"] for d in r.stats()["deliveries"]], "stall delivers before stalling")
    t.join(10)
    how, got, took = result["r"]
    check(how == "eof" and got == b"" and took >= 0.28, "accept_then_stall %s %r %.3f"
          % (how, got, took))

    # Retries of the lost answers are acknowledged but not delivered again.
    for mid in ("d1", "d2", "d4"):
        st, _, doc = r.hook(mid, {"recipient": "carol"})
        check(st == 200 and doc["duplicate"] is True, "retry of %s %r" % (mid, doc))
    st, _, doc = r.hook("d3", {"recipient": "carol"})
    check(doc["delivered"] is True, "retry after close_before delivers")
    s = r.stats()
    check(s["delivered"] == 4 and s["duplicates_seen"] == 3, "drop faults totals %r" % s)
    check(s["delivered_by_recipient"] == {"carol": 3, "dan": 1}, "by recipient %r" % s)
    check(s["by_id"] == {"d1": 2, "d2": 2, "d3": 2, "d4": 2}, "by_id %r" % s["by_id"])


def test_concurrent_dedup(r):
    results = []
    lock = threading.Lock()

    def worker():
        st, _, doc = r.hook("same", {"recipient": "eve"})
        with lock:
            results.append((st, doc["delivered"]))

    threads = [threading.Thread(target=worker) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    check(len(results) == 12 and all(st == 200 for st, _ in results), "concurrent statuses")
    check(sum(1 for _, d in results if d) == 1, "exactly one concurrent delivery")
    s = r.stats()
    check(s["delivered"] == 1 and s["duplicates_seen"] == 11 and s["by_id"] == {"same": 12},
          "concurrent stats %r" % s)


def test_refuses_non_loopback():
    p = subprocess.run([sys.executable, TARGET, "--host", "0.0.0.0"],
                       capture_output=True, text=True, timeout=10)
    check(p.returncode != 0 and "PORT" not in p.stdout, "non-loopback host refused")


TESTS = [test_delivery_and_dedup, test_bad_requests, test_control_routes,
         test_status_faults, test_drop_faults, test_concurrent_dedup]


def main():
    failures = 0
    r = Receiver()
    try:
        for test in TESTS:
            r.reset()
            try:
                test(r)
                print("ok   %s" % test.__name__)
            except Exception as e:             # report and carry on
                failures += 1
                print("FAIL %s: %s: %s" % (test.__name__, type(e).__name__, e))
    finally:
        rc = r.stop()
    if rc != 0:
        failures += 1
        print("FAIL exit status on SIGTERM: %s" % rc)
    else:
        print("ok   SIGTERM exit 0")
    try:
        test_refuses_non_loopback()
        print("ok   test_refuses_non_loopback")
    except Exception as e:
        failures += 1
        print("FAIL test_refuses_non_loopback: %s" % e)
    print("%s (%d failure(s))" % ("PASS" if not failures else "FAILED", failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
