#!/usr/bin/env python3
"""Self-test for erp_target.py.

Starts the target as a subprocess and checks its behaviour from the outside
with raw sockets (and urllib where convenient).  Run:

    python3 tests/targets/erp_target_selftest.py
"""

import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import unittest
import urllib.error
import urllib.request
from urllib.parse import quote

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "erp_target.py")

POST_COMMIT_SHAPES = ["ok", "close_before_bytes", "reset", "partial_status",
                      "partial_headers", "partial_body", "late",
                      "status_500", "status_502", "status_504"]


def start_server(seed=7):
    proc = subprocess.Popen([sys.executable, SERVER, "--port", "0", "--seed", str(seed)],
                            stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    if not ready:
        proc.kill()
        raise RuntimeError("server did not announce its port")
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError("unexpected first line %r" % line)
    return proc, int(line.split()[1])


def wait_exit(proc, seconds=5):
    """The exit status, or None (and the process killed) when it outlives `seconds`."""
    try:
        return proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def stop_server(proc, sig=signal.SIGTERM):
    proc.send_signal(sig)
    return wait_exit(proc)


def signal_a_connection_thread(proc, sig):
    """Sends sig to one of proc's threads other than its main thread, as the
    kernel may do with any process-directed signal.  Returns False when proc
    has no other thread."""
    tids = sorted(int(t) for t in os.listdir("/proc/%d/task" % proc.pid))
    others = [t for t in tids if t != proc.pid]
    if not others:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.tgkill(proc.pid, others[0], sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")
    return True


class Resp:
    def __init__(self, status, reason, headers, body, raw_head):
        self.status = status
        self.reason = reason
        self.headers = headers      # lower-case name -> value (last wins)
        self.body = body
        self.raw_head = raw_head

    def json(self):
        return json.loads(self.body)


def build_request(method, target, body=None, headers=None, version="HTTP/1.1",
                  host="127.0.0.1", chunks=None):
    """Bytes of one request.  body may be a dict (JSON-encoded) or bytes;
    chunks (a list of bytes) sends the body with chunked encoding."""
    hdrs = []
    if host is not None:
        hdrs.append(("Host", host))
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        hdrs.append(("Content-Type", "application/json"))
    if chunks is not None:
        hdrs.append(("Transfer-Encoding", "chunked"))
        payload = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    else:
        payload = body or b""
        if body is not None:
            hdrs.append(("Content-Length", str(len(payload))))
    hdrs.extend((headers or {}).items())
    head = "%s %s %s\r\n" % (method, target, version)
    head += "".join("%s: %s\r\n" % kv for kv in hdrs) + "\r\n"
    return head.encode("latin-1") + payload


class RawClient:
    def __init__(self, port, timeout=5.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data)

    def request(self, method, target, body=None, headers=None, **kw):
        self.send(build_request(method, target, body, headers, **kw))
        return self.read_response()

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("connection closed")
        self.buf += data

    def read_response(self):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        _version, status, reason = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            self._fill()
        body, self.buf = self.buf[:length], self.buf[length:]
        return Resp(int(status), reason, headers, body, head)

    def read_until_eof(self):
        data = self.buf
        self.buf = b""
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                return data
            data += chunk

    def close(self):
        self.sock.close()


class ErpTargetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proc, cls.port = start_server()

    @classmethod
    def tearDownClass(cls):
        rc = stop_server(cls.proc)
        cls.proc.stdout.close()
        assert rc == 0, "server exit status %r" % rc

    def setUp(self):
        self.assertEqual(self.call("POST", "/_target/reset").status, 200)

    # ---- helpers -----------------------------------------------------------

    def client(self, timeout=5.0):
        c = RawClient(self.port, timeout)
        self.addCleanup(c.close)
        return c

    def call(self, method, target, body=None, headers=None, **kw):
        """One request on a fresh connection with Connection: close."""
        h = {"Connection": "close"}
        h.update(headers or {})
        c = RawClient(self.port)
        try:
            return c.request(method, target, body, h, **kw)
        finally:
            c.close()

    def stats(self):
        r = self.call("GET", "/_target/stats")
        self.assertEqual(r.status, 200)
        return r.json()

    def faults(self, settings):
        r = self.call("POST", "/_target/faults", settings)
        self.assertEqual(r.status, 200, r.body)
        return r.json()

    def expect_eof(self, c):
        """After a teardown shape: EOF without more data, or a reset."""
        try:
            return c.read_until_eof()
        except ConnectionResetError:
            return b""

    # ---- connection handling -----------------------------------------------

    def test_keepalive_reuse(self):
        c = self.client()
        r1 = c.request("POST", "/erp/orders", {"ref": "A"})
        r2 = c.request("POST", "/erp/orders", {"ref": "B"})
        self.assertEqual((r1.status, r2.status), (201, 201))
        self.assertEqual(r1.headers["connection"], "keep-alive")
        self.assertEqual(r1.headers["content-type"], "application/json")
        reqs = self.stats()["requests"]
        self.assertEqual(len(reqs), 2)
        self.assertEqual(reqs[0]["connection"], reqs[1]["connection"])
        self.assertEqual([q["request_on_connection"] for q in reqs], [1, 2])
        self.assertEqual([q["seq"] for q in reqs], [1, 2])
        other = self.client()
        other.request("GET", "/erp/orders/ORD-1")
        s = self.stats()
        self.assertNotEqual(s["requests"][2]["connection"], reqs[0]["connection"])
        self.assertEqual(s["requests"][2]["request_on_connection"], 1)
        # "connections" counts every accept since the reset, including the two
        # connections the stats() calls used; "connections_used" only those
        # that carried recorded requests.
        self.assertEqual(s["connections"], 4)
        self.assertEqual(s["connections_used"], 2)

    def test_connection_close_header(self):
        c = self.client()
        r = c.request("GET", "/erp/orders?ref=x", headers={"Connection": "close"})
        self.assertEqual(r.status, 200)
        self.assertEqual(r.headers["connection"], "close")
        self.assertEqual(c.read_until_eof(), b"")

    def test_http10_closes(self):
        c = self.client()
        r = c.request("GET", "/erp/orders?ref=x", version="HTTP/1.0", host=None,
                      headers={"Connection": "keep-alive"})
        self.assertEqual(r.status, 200)
        self.assertEqual(r.headers["connection"], "close")
        self.assertEqual(c.read_until_eof(), b"")

    def test_pipelined_requests(self):
        c = self.client()
        c.send(build_request("POST", "/erp/orders", {"ref": "P1"}) +
               build_request("POST", "/erp/orders", {"ref": "P2"}))
        r1, r2 = c.read_response(), c.read_response()
        self.assertEqual(r1.json()["id"], "ORD-1")
        self.assertEqual(r2.json()["id"], "ORD-2")

    def test_chunked_body(self):
        body = json.dumps({"ref": "CH-1", "amount": 12, "note": "x" * 40}).encode()
        c = self.client()
        r = c.request("POST", "/erp/orders", chunks=[body[:5], body[5:17], body[17:]])
        self.assertEqual(r.status, 201)
        self.assertEqual(r.json(), {"id": "ORD-1", "ref": "CH-1", "state": "open",
                                    "request": {"amount": 12, "note": "x" * 40}})
        # Upper-case hex, chunk extensions and a trailer, on the same connection.
        raw = (b"POST /erp/orders HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"A;ext=1\r\n" + body[:10] + b"\r\n" +
               b"%X ; name=\"v\"\r\n" % (len(body) - 10) + body[10:] + b"\r\n"
               b"0\r\nX-Trailer: yes\r\n\r\n")
        c.send(raw)
        r = c.read_response()
        self.assertEqual(r.status, 201)
        self.assertEqual(r.json()["id"], "ORD-2")
        self.assertEqual(self.stats()["requests"][1]["request_on_connection"], 2)

    def test_expect_100_continue(self):
        c = self.client()
        body = json.dumps({"ref": "E"}).encode()
        c.send(b"POST /erp/orders HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body))
        interim = c.read_response()
        self.assertEqual(interim.status, 100)
        c.send(body)
        self.assertEqual(c.read_response().status, 201)

    def test_bad_framing_400_and_close(self):
        cases = [
            b"POST /erp/orders HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"POST /erp/orders HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\nabXX",
            b"POST /erp/orders HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"POST /erp/orders HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n",
            b"POST /erp/orders HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n"
            b"Content-Length: 3\r\n\r\nabc",
            b"POST /erp/orders HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"GET /erp/orders?ref=a HTTP/1.1\r\n\r\n",                    # no Host
            b"GET /erp/orders?ref=a HTTP/1.1\r\nHost : t\r\n\r\n",        # space before colon
            b"GET /erp/orders?ref=a HTTP/1.1\r\nHost: t\r\n folded\r\n\r\n",
            b"GET  /erp/orders HTTP/1.1\r\nHost: t\r\n\r\n",
        ]
        for raw in cases:
            with self.subTest(raw=raw):
                c = self.client()
                c.send(raw)
                r = c.read_response()
                self.assertEqual(r.status, 400)
                self.assertEqual(r.headers["connection"], "close")
                self.assertEqual(c.read_until_eof(), b"")
        self.assertEqual(self.stats()["orders"], 0)

    def test_size_limits(self):
        c = self.client()
        c.send(b"POST /erp/orders HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
               % (2 * 1024 * 1024))
        r = c.read_response()
        self.assertEqual(r.status, 413)
        self.assertEqual(c.read_until_eof(), b"")

        c = self.client()
        c.send(b"POST /erp/orders HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"100001\r\n")
        self.assertEqual(c.read_response().status, 413)

        c = self.client()
        c.send(b"GET /erp/orders?ref=a HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 70000 +
               b"\r\n\r\n")
        self.assertEqual(c.read_response().status, 431)

        # Exactly 1 MiB is accepted (and is not JSON -> 400, but not 413).
        c = self.client()
        c.send(b"POST /erp/orders HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
               % (1024 * 1024) + b"x" * (1024 * 1024))
        self.assertEqual(c.read_response().status, 400)

    def test_absolute_form_and_encoded_id(self):
        self.call("POST", "/erp/orders", {"ref": "abs"})
        r = self.call("GET", "http://127.0.0.1:%d/erp/orders?ref=abs" % self.port)
        self.assertEqual(r.json()["items"][0]["id"], "ORD-1")
        r = self.call("GET", "/erp/orders/ORD%2D1")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["id"], "ORD-1")

    def test_404_and_405(self):
        r = self.call("GET", "/nope")
        self.assertEqual(r.status, 404)
        self.assertEqual(r.headers["content-type"], "application/json")
        self.assertIn("error", r.json())
        self.assertEqual(self.call("GET", "/erp/orders/ORD-9").status, 404)
        self.assertEqual(self.call("GET", "/_target/nope").status, 404)
        r = self.call("DELETE", "/erp/orders")
        self.assertEqual(r.status, 405)
        self.assertEqual(r.headers["allow"], "GET, POST")
        self.assertEqual(self.call("GET", "/notify/messages").status, 405)
        self.assertEqual(self.call("GET", "/erp/orders/ORD-1/cancel").status, 405)
        self.assertEqual(self.call("POST", "/_target/stats").status, 405)

    # ---- business routes ---------------------------------------------------

    def test_create_order_validation(self):
        r = self.call("POST", "/erp/orders", {"amount": 1})
        self.assertEqual((r.status, r.json()), (422, {"error": "ref required"}))
        self.assertEqual(self.call("POST", "/erp/orders", {"ref": 5}).status, 422)
        self.assertEqual(self.call("POST", "/erp/orders", b"not json").status, 400)
        self.assertEqual(self.call("POST", "/erp/orders", b"").status, 400)
        self.assertEqual(self.stats()["orders"], 0)

    def test_orders_ignore_idempotency_key(self):
        h = {"Idempotency-Key": "k-1"}
        r1 = self.call("POST", "/erp/orders", {"ref": "R", "qty": 2}, h)
        r2 = self.call("POST", "/erp/orders", {"ref": "R", "qty": 2}, h)
        self.assertEqual(r1.status, 201)
        self.assertEqual(r1.json(), {"id": "ORD-1", "ref": "R", "state": "open",
                                     "request": {"qty": 2}})
        self.assertEqual(r2.json()["id"], "ORD-2")
        s = self.stats()
        self.assertEqual(s["orders"], 2)
        self.assertEqual(s["orders_by_ref"], {"R": 2})
        self.assertEqual(s["duplicate_orders"], 1)
        self.assertEqual([q["idempotency_key"] for q in s["requests"]], ["k-1", "k-1"])
        self.assertEqual(s["by_route"]["create_order"], 2)
        o = self.call("GET", "/erp/orders/ORD-1").json()
        self.assertEqual(o["idempotency_key"], "k-1")

    def test_find_by_ref_special_chars(self):
        ref = "crm:A&B #7"
        self.call("POST", "/erp/orders", {"ref": ref})
        self.call("POST", "/erp/orders", {"ref": "crm:A"})
        self.call("POST", "/erp/orders", {"ref": ref})
        target = "/erp/orders?ref=" + quote(ref, safe="")
        r = self.call("GET", target)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json(), {"items": [
            {"id": "ORD-1", "ref": ref, "state": "open"},
            {"id": "ORD-3", "ref": ref, "state": "open"}]})
        self.assertEqual(self.call("GET", "/erp/orders?ref=crm%3AA").json()["items"][0]["id"],
                         "ORD-2")
        self.assertEqual(self.call("GET", "/erp/orders?ref=zzz").json(), {"items": []})
        self.assertEqual(self.call("GET", "/erp/orders").status, 400)
        # Raw target is recorded verbatim.
        self.assertEqual(self.stats()["requests"][3]["target"], target)
        # parse_qs semantics: '+' is a space, %2B is a plus.
        self.call("POST", "/erp/orders", {"ref": "a b"})
        self.assertEqual(len(self.call("GET", "/erp/orders?ref=a+b").json()["items"]), 1)
        self.assertEqual(len(self.call("GET", "/erp/orders?ref=a%2Bb").json()["items"]), 0)

    def test_get_and_cancel(self):
        self.call("POST", "/erp/orders", {"ref": "C"})
        r = self.call("POST", "/erp/orders/ORD-1/cancel")
        self.assertEqual((r.status, r.json()), (200, {"id": "ORD-1", "state": "cancelled"}))
        r = self.call("POST", "/erp/orders/ORD-1/cancel", {})
        self.assertEqual(r.status, 200)
        self.assertEqual(self.call("POST", "/erp/orders/ORD-7/cancel").status, 404)
        self.assertEqual(self.call("GET", "/erp/orders/ORD-1").json()["state"], "cancelled")
        self.assertEqual(self.call("GET", "/erp/orders?ref=C").json()["items"][0]["state"],
                         "cancelled")
        s = self.stats()
        self.assertEqual(s["cancels"], {"ORD-1": 2})
        self.assertEqual(s["duplicate_cancels"], 1)
        self.assertEqual(s["by_route"]["cancel_order"], 3)

    def test_message_idempotency(self):
        body = {"to": "ops", "text": "hello"}
        r1 = self.call("POST", "/notify/messages", body, {"Idempotency-Key": "m-1"})
        self.assertEqual((r1.status, r1.json()), (201, {"id": "MSG-1"}))
        self.assertNotIn("idempotent-replayed", r1.headers)
        # Same key, same JSON (different key order) -> replay.
        r2 = self.call("POST", "/notify/messages", {"text": "hello", "to": "ops"},
                       {"Idempotency-Key": "m-1"})
        self.assertEqual((r2.status, r2.json()), (200, {"id": "MSG-1"}))
        self.assertEqual(r2.headers["idempotent-replayed"], "true")
        r3 = self.call("POST", "/notify/messages", {"to": "ops", "text": "other"},
                       {"Idempotency-Key": "m-1"})
        self.assertEqual((r3.status, r3.json()), (422, {"error": "key reused with another body"}))
        self.assertEqual(self.stats()["messages"], 1)
        # Without a key every request creates a message.
        r4 = self.call("POST", "/notify/messages", body)
        r5 = self.call("POST", "/notify/messages", body)
        self.assertEqual((r4.json()["id"], r5.json()["id"]), ("MSG-2", "MSG-3"))
        self.assertEqual(self.call("POST", "/notify/messages", {"to": "x"}).status, 422)
        self.assertEqual(self.call("POST", "/notify/messages", b"{").status, 400)
        s = self.stats()
        self.assertEqual(s["messages"], 3)
        self.assertEqual(s["duplicate_messages"], 2)
        self.assertEqual(s["messages_by_content"], [{"to": "ops", "text": "hello", "count": 3}])

    def test_urllib_roundtrip(self):
        base = "http://127.0.0.1:%d" % self.port
        req = urllib.request.Request(base + "/erp/orders", method="POST",
                                     data=json.dumps({"ref": "crm:A&B #7"}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            self.assertEqual(resp.status, 201)
            oid = json.loads(resp.read())["id"]
        with urllib.request.urlopen(base + "/erp/orders?ref=" + quote("crm:A&B #7", safe=""),
                                    timeout=5) as resp:
            self.assertEqual(json.loads(resp.read())["items"][0]["id"], oid)
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen(base + "/erp/orders/NOPE", timeout=5)
        self.assertEqual(cm.exception.code, 404)

    # ---- observation -------------------------------------------------------

    def test_target_requests_not_recorded_and_reset(self):
        self.call("POST", "/erp/orders", {"ref": "X"})
        self.call("POST", "/notify/messages", {"to": "a", "text": "b"})
        self.call("POST", "/erp/orders/ORD-1/cancel")
        self.faults({"get_order": {"next": ["status_500"]}})
        self.call("GET", "/_target/faults")
        s = self.stats()
        self.assertEqual([q["route"] for q in s["requests"]],
                         ["create_order", "send_message", "cancel_order"])
        self.assertEqual(s["by_route"], {"create_order": 1, "find_orders": 0, "get_order": 0,
                                         "cancel_order": 1, "send_message": 1})
        self.assertEqual(self.call("POST", "/_target/reset").status, 200)
        s = self.stats()
        self.assertEqual((s["requests"], s["orders"], s["messages"], s["cancels"]),
                         ([], 0, 0, {}))
        self.assertEqual(self.call("GET", "/_target/faults").json(), {"faults": {}})
        r = self.call("POST", "/erp/orders", {"ref": "Y"})
        self.assertEqual(r.json()["id"], "ORD-1")

    # ---- fault injection ---------------------------------------------------

    def test_fault_settings_api(self):
        r = self.faults({"create_order": {"next": ["close_before_bytes", "ok"], "rate": 0.3,
                                          "shape": "close_before_bytes", "delay_ms": 1500}})
        self.assertEqual(r, {"faults": {"create_order": {
            "next": ["close_before_bytes", "ok"], "rate": 0.3,
            "shape": "close_before_bytes", "delay_ms": 1500, "retry_after_s": 0}}})
        for bad in [b"{", b"[]", {"create_order": {"shape": "explode", "rate": 1}},
                    {"create_order": {"next": ["ok", "nope"]}}, {"nosuch_route": {}},
                    {"create_order": {"rate": 2, "shape": "reset"}},
                    {"create_order": {"rate": 0.5}}, {"create_order": {"bogus": 1}},
                    {"create_order": {"retry_after_s": -1}},
                    {"create_order": {"retry_after_s": 1.5}}]:
            with self.subTest(bad=bad):
                self.assertEqual(self.call("POST", "/_target/faults", bad).status, 400)
        # Rejected posts changed nothing; replacing a route replaces its settings.
        r = self.faults({"create_order": {"next": ["reset"]}})
        self.assertEqual(r["faults"]["create_order"]["next"], ["reset"])
        self.assertEqual(r["faults"]["create_order"]["rate"], 0)
        self.assertEqual(self.faults({"reset": True}), {"faults": {}})

    def test_queue_then_rate(self):
        self.faults({"get_order": {"next": ["status_504", "ok", "status_500"],
                                   "rate": 1.0, "shape": "status_502"}})
        c = self.client()
        statuses = [c.request("GET", "/erp/orders/ORD-1").status for _ in range(5)]
        self.assertEqual(statuses, [504, 404, 500, 502, 502])
        shapes = [q["shape"] for q in self.stats()["requests"]]
        self.assertEqual(shapes, ["status_504", "ok", "status_500", "status_502", "status_502"])

    def test_rate_is_seeded(self):
        def run():
            self.call("POST", "/_target/reset")
            self.faults({"find_orders": {"rate": 0.5, "shape": "status_502"}})
            c = self.client()
            return [c.request("GET", "/erp/orders?ref=a").status for _ in range(24)]
        first, second = run(), run()
        self.assertEqual(first, second)
        self.assertEqual(set(first), {200, 502})

    def test_fault_shapes_on_the_wire(self):
        self.faults({"create_order": {"next": POST_COMMIT_SHAPES, "delay_ms": 300}})
        seen = {}
        for i, shape in enumerate(POST_COMMIT_SHAPES):
            c = self.client()
            c.send(build_request("POST", "/erp/orders", {"ref": "F-%d" % i}))
            if shape == "close_before_bytes":
                self.assertEqual(c.sock.recv(65536), b"")
            elif shape == "reset":
                try:
                    data = c.sock.recv(65536)
                    self.assertEqual(data, b"")
                except ConnectionResetError:
                    data = "rst"
                seen["reset"] = data
            elif shape == "partial_status":
                self.assertEqual(c.read_until_eof(), b"HTTP/1.1 20")
            elif shape == "partial_headers":
                data = c.read_until_eof()
                self.assertTrue(data.startswith(b"HTTP/1.1 201 "), data)
                self.assertNotIn(b"\r\n\r\n", data)
                self.assertEqual(data.count(b"\r\n"), 2, data)
            elif shape == "partial_body":
                data = c.read_until_eof()
                head, body = data.split(b"\r\n\r\n", 1)
                length = int([l for l in head.split(b"\r\n")
                              if l.lower().startswith(b"content-length:")][0].split(b":")[1])
                self.assertEqual(len(body), length // 2)
                self.assertGreater(length, len(body))
            elif shape == "late":
                c.sock.settimeout(0.1)
                with self.assertRaises(socket.timeout):
                    c.sock.recv(1)
                # Effect is already committed while the answer is still pending.
                self.assertEqual(self.stats()["orders"], i + 1)
                c.sock.settimeout(5)
                self.assertEqual(c.read_response().status, 201)
            elif shape.startswith("status_"):
                r = c.read_response()
                self.assertEqual(r.status, int(shape[-3:]))
                self.assertEqual(r.json()["shape"], shape)
                self.assertEqual(r.headers["connection"], "keep-alive")
            else:
                self.assertEqual(c.read_response().status, 201)
            # Every post-commit shape commits the order first.
            self.assertEqual(self.stats()["orders"], i + 1, shape)
        s = self.stats()
        self.assertEqual([q["shape"] for q in s["requests"]], POST_COMMIT_SHAPES)
        self.assertEqual([q["status"] for q in s["requests"]],
                         [201, None, None, None, 201, 201, 201, 500, 502, 504])
        self.assertEqual(s["orders"], len(POST_COMMIT_SHAPES))

    def test_late_times_out_client(self):
        self.faults({"create_order": {"next": ["late"], "delay_ms": 400}})
        c = self.client(timeout=0.15)
        t0 = time.monotonic()
        with self.assertRaises(socket.timeout):
            c.request("POST", "/erp/orders", {"ref": "L"})
        self.assertEqual(self.stats()["orders"], 1)
        c.sock.settimeout(5)
        r = c.read_response()
        self.assertGreaterEqual(time.monotonic() - t0, 0.35)
        self.assertEqual(r.status, 201)
        # The connection stays usable afterwards.
        self.assertEqual(c.request("GET", "/erp/orders/ORD-1").status, 200)

    def test_refuse_503_carries_the_retry_after_set(self):
        self.faults({"create_order": {"next": ["refuse_503"], "retry_after_s": 120}})
        r = self.client().request("POST", "/erp/orders", {"ref": "R"})
        self.assertEqual((r.status, r.headers["retry-after"]), (503, "120"))
        self.assertEqual(self.stats()["orders"], 0)

    def test_pre_commit_shapes(self):
        self.faults({"create_order": {"next": ["refuse_503", "reject_422_before"]},
                     "send_message": {"next": ["refuse_503"]},
                     "cancel_order": {"next": ["reject_422_before"]}})
        c = self.client()
        r = c.request("POST", "/erp/orders", {"ref": "N"})
        self.assertEqual(r.status, 503)
        self.assertEqual(r.headers["retry-after"], "0")
        self.assertEqual(c.request("POST", "/erp/orders", {"ref": "N"}).status, 422)
        self.assertEqual(self.stats()["orders"], 0)
        r = c.request("POST", "/notify/messages", {"to": "a", "text": "b"},
                      {"Idempotency-Key": "pre"})
        self.assertEqual(r.status, 503)
        self.assertEqual(self.stats()["messages"], 0)
        # The key was not consumed: the retry creates the message.
        r = c.request("POST", "/notify/messages", {"to": "a", "text": "b"},
                      {"Idempotency-Key": "pre"})
        self.assertEqual((r.status, r.json()), (201, {"id": "MSG-1"}))
        self.assertEqual(c.request("POST", "/erp/orders", {"ref": "N"}).status, 201)
        self.assertEqual(c.request("POST", "/erp/orders/ORD-1/cancel").status, 422)
        s = self.stats()
        self.assertEqual((s["orders"], s["cancels"]), (1, {}))
        self.assertEqual([q["shape"] for q in s["requests"]],
                         ["refuse_503", "reject_422_before", "refuse_503", "ok", "ok",
                          "reject_422_before"])

    def test_post_commit_on_other_routes(self):
        self.call("POST", "/erp/orders", {"ref": "K"})
        self.faults({"cancel_order": {"next": ["close_before_bytes", "reset"]},
                     "send_message": {"next": ["partial_body"]}})
        for _ in range(2):
            c = self.client()
            c.send(build_request("POST", "/erp/orders/ORD-1/cancel"))
            self.assertEqual(self.expect_eof(c), b"")
        c = self.client()
        c.send(build_request("POST", "/notify/messages", {"to": "a", "text": "b"},
                             {"Idempotency-Key": "pb"}))
        data = c.read_until_eof()
        self.assertIn(b"\r\n\r\n", data)
        s = self.stats()
        self.assertEqual((s["cancels"], s["duplicate_cancels"], s["messages"]),
                         ({"ORD-1": 2}, 1, 1))
        # The retry of the damaged message answer is a replay.
        r = self.call("POST", "/notify/messages", {"to": "a", "text": "b"},
                      {"Idempotency-Key": "pb"})
        self.assertEqual((r.status, r.headers.get("idempotent-replayed")), (200, "true"))
        self.assertEqual(self.stats()["messages"], 1)


class SignalTest(unittest.TestCase):
    def test_exit_zero_on_sigterm_and_sigint(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            with self.subTest(sig=sig):
                proc, port = start_server()
                idle = RawClient(port)           # an idle keep-alive connection
                r = idle.request("GET", "/erp/orders?ref=a")
                self.assertEqual(r.status, 200)
                self.assertEqual(stop_server(proc, sig), 0)
                self.assertEqual(proc.stdout.read(), "")   # only the PORT line
                proc.stdout.close()
                idle.close()

    def test_a_stop_signal_taken_by_a_connection_thread_still_stops_the_server(self):
        # A process-directed signal goes to any thread that does not block
        # it.  The server must stop even when the kernel picks the thread
        # that serves an idle keep-alive connection, not the one in accept().
        for sig in (signal.SIGTERM, signal.SIGINT):
            with self.subTest(sig=sig):
                proc, port = start_server()
                idle = RawClient(port)
                r = idle.request("GET", "/erp/orders?ref=a")
                self.assertEqual(r.status, 200)
                self.assertTrue(signal_a_connection_thread(proc, sig))
                self.assertEqual(wait_exit(proc), 0)
                proc.stdout.close()
                idle.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
