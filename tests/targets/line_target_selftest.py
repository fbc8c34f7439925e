#!/usr/bin/env python3
"""Self-test for line_target.py (about 1 s).

Starts the target as a subprocess on a free port and checks it with
http.client and raw sockets.  Exits 0 on success, 1 on the first failure.
"""

import http.client
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "line_target.py")
PUSH = "/v2/bot/message/push"
TOKEN = "test-token"
TOKEN2 = "second-token"
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
DAY = 24 * 3600


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def start_server():
    proc = subprocess.Popen([sys.executable, TARGET, "--port", "0",
                             "--token", TOKEN, "--token", TOKEN2],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    if not ready:
        proc.kill()
        raise Failure("no PORT line within 10 s")
    line = proc.stdout.readline()
    if not re.fullmatch(r"PORT \d+\n", line):
        proc.kill()
        raise Failure("unexpected first line %r" % line)
    return proc, int(line.split()[1])


class Client:
    def __init__(self, port):
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def call(self, method, path, body=None, raw=None, headers=None):
        hdrs = dict(headers or {})
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
        if data is not None:
            hdrs.setdefault("Content-Type", "application/json")
        self.conn.request(method, path, body=data, headers=hdrs)
        resp = self.conn.getresponse()
        text = resp.read()
        try:
            doc = json.loads(text) if text else None
        except ValueError:
            doc = text
        return resp.status, doc, resp

    def push(self, body=None, key=None, token=TOKEN, raw=None, headers=None):
        hdrs = dict(headers or {})
        if token is not None:
            hdrs["Authorization"] = "Bearer " + token
        if key is not None:
            hdrs["X-Line-Retry-Key"] = key
        return self.call("POST", PUSH, body=body, raw=raw, headers=hdrs)

    def close(self):
        self.conn.close()


def text_body(to, *texts):
    return {"to": to, "messages": [{"type": "text", "text": t} for t in texts]}


def raw_push(port, body, key=None, timeout=5.0):
    """Send one push on a fresh socket; return the socket (request sent)."""
    data = json.dumps(body).encode()
    head = ("POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
            "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n" % (PUSH, port, TOKEN, len(data)))
    if key is not None:
        head += "X-Line-Retry-Key: %s\r\n" % key
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(head.encode() + b"\r\n" + data)
    return s


def read_until_end(s):
    """Read until EOF.  Returns ("fin", bytes) or ("rst", bytes)."""
    got = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return "rst", got
        if not chunk:
            return "fin", got
        got += chunk


def main():
    t_start = time.monotonic()
    proc, port = start_server()
    c = Client(port)
    steps = []

    def step(name):
        steps.append(name)
        print("  -", name, flush=True)

    def stats():
        st, s, _ = c.call("GET", "/_target/stats")
        check(st == 200, "stats -> %s" % st)
        return s

    def is_uuid(v):
        return isinstance(v, str) and UUID_RE.match(v) is not None

    try:
        # ------------------------------------------------------------ auth
        step("auth: missing / wrong scheme / unknown token -> 401, nothing sent")
        body = text_body("Uauth", "hi")
        st, doc, r = c.push(body, token=None)
        check(st == 401 and doc["message"].startswith("Authorization header required"),
              "no auth -> %s %r" % (st, doc))
        check(is_uuid(r.getheader("X-Line-Request-Id")), "401 has X-Line-Request-Id")
        st, doc, _ = c.push(body, token="nope")
        check(st == 401 and doc["message"].startswith("Authentication failed"),
              "bad token -> %s %r" % (st, doc))
        st, doc, _ = c.call("POST", PUSH, body, headers={"Authorization": "Basic " + TOKEN})
        check(st == 401 and doc["message"].startswith("Authentication failed"),
              "basic scheme -> %s %r" % (st, doc))
        st, doc, _ = c.call("POST", PUSH, body, headers={"Authorization": "Bearer"})
        check(st == 401, "empty bearer -> %s" % st)
        st, doc, _ = c.push(body, token=TOKEN2)
        check(st == 200, "second --token accepted -> %s %r" % (st, doc))
        st, doc, _ = c.call("POST", PUSH, body, headers={"Authorization": "bearer " + TOKEN})
        check(st == 200, "scheme is case-insensitive -> %s" % st)
        s = stats()
        check(s["delivered"] == 2 and s["delivered_by_to"] == {"Uauth": 2},
              "only the authorised pushes delivered: %r" % s["delivered_by_to"])
        c.call("POST", "/_target/reset")

        # ------------------------------------------------------ validation
        step("body validation -> 400 {message, details[{message, property}]}")
        bad = [
            (b"{not json", ""),
            (b"[1,2]", ""),
            (json.dumps({"messages": [{"type": "text", "text": "x"}]}).encode(), "to"),
            (json.dumps({"to": 5, "messages": [{"type": "text", "text": "x"}]}).encode(), "to"),
            (json.dumps({"to": "", "messages": [{"type": "text", "text": "x"}]}).encode(), "to"),
            (json.dumps({"to": "U1"}).encode(), "messages"),
            (json.dumps({"to": "U1", "messages": []}).encode(), "messages"),
            (json.dumps({"to": "U1", "messages": {"type": "text"}}).encode(), "messages"),
            (json.dumps(text_body("U1", *"abcdef")).encode(), "messages"),
            (json.dumps({"to": "U1", "messages": [{"text": "x"}]}).encode(), "messages[0].type"),
            (json.dumps({"to": "U1", "messages": [{"type": "txt", "text": "x"}]}).encode(),
             "messages[0].type"),
            (json.dumps({"to": "U1", "messages": ["x"]}).encode(), "messages[0]"),
            (json.dumps({"to": "U1", "messages": [{"type": "text"}]}).encode(), "messages[0].text"),
            (json.dumps(text_body("U1", "ok", "")).encode(), "messages[1].text"),
            (json.dumps(text_body("U1", "a" * 5001)).encode(), "messages[0].text"),
            (json.dumps(text_body("U1", "\U0001F600" * 2501)).encode(), "messages[0].text"),
            (json.dumps(dict(text_body("U1", "x"), notificationDisabled="yes")).encode(),
             "notificationDisabled"),
        ]
        for raw, prop in bad:
            st, doc, r = c.push(raw=raw, key=str(uuid.uuid4()))
            check(st == 400, "%r -> %s %r" % (raw[:60], st, doc))
            check(isinstance(doc.get("message"), str) and isinstance(doc.get("details"), list)
                  and doc["details"], "400 shape %r" % (doc,))
            check(all(set(d) == {"message", "property"} for d in doc["details"]),
                  "details shape %r" % (doc["details"],))
            check(prop in [d["property"] for d in doc["details"]],
                  "%r: property %r not in %r" % (raw[:60], prop, doc["details"]))
            check(is_uuid(r.getheader("X-Line-Request-Id")), "400 has X-Line-Request-Id")
        st, doc, _ = c.push(raw=json.dumps({"to": 1, "messages": []}).encode())
        check(st == 400 and doc["message"] == "The request body has 2 error(s)"
              and len(doc["details"]) == 2, "two errors -> %r" % (doc,))
        for ok_body in (text_body("Ulen", "a" * 5000), text_body("Ulen", "\U0001F600" * 2500),
                        text_body("Ulen", *"abcde"),
                        {"to": "Ulen", "messages": [{"type": "sticker", "packageId": "1",
                                                     "stickerId": "2"}],
                         "notificationDisabled": True}):
            st, doc, _ = c.push(ok_body)
            check(st == 200, "valid body -> %s %r" % (st, doc))
        s = stats()
        check(s["delivered"] == 8 and s["delivered_by_to"] == {"Ulen": 8},
              "400s delivered nothing: %r" % s["delivered_by_to"])
        check(s["retry_keys"] == [], "a 400 does not accept its retry key: %r" % s["retry_keys"])

        step("retry key format -> 400 unless one canonical hex UUID")
        for key in ("abc", "123e4567e89b12d3a456426614174000",
                    "{123e4567-e89b-12d3-a456-426614174000}",
                    "123e4567-e89b-12d3-a456-42661417400g",
                    "urn:uuid:123e4567-e89b-12d3-a456-426614174000", ""):
            st, doc, _ = c.push(text_body("Ukey", "x"), key=key)
            check(st == 400 and "X-Line-Retry-Key" in doc["message"],
                  "key %r -> %s %r" % (key, st, doc))
        c.conn.putrequest("POST", PUSH)
        data = json.dumps(text_body("Ukey", "x")).encode()
        for h, v in (("Authorization", "Bearer " + TOKEN), ("Content-Length", str(len(data))),
                     ("X-Line-Retry-Key", str(uuid.uuid4())),
                     ("X-Line-Retry-Key", str(uuid.uuid4()))):
            c.conn.putheader(h, v)
        c.conn.endheaders(data)
        resp = c.conn.getresponse()
        resp.read()
        check(resp.status == 400, "two retry-key headers -> %s" % resp.status)
        check(stats()["delivered_by_to"].get("Ukey") is None, "bad keys delivered something")
        for key in ("00000000-0000-0000-0000-000000000000",      # nil: any version
                    "123E4567-E89B-12D3-A456-426614174000",      # upper case hex
                    str(uuid.uuid1()), str(uuid.uuid4())):
            st, doc, _ = c.push(text_body("Ukey", key), key=key)
            check(st == 200, "valid key %r -> %s %r" % (key, st, doc))
        c.call("POST", "/_target/reset")

        # ------------------------------------------------------- 200 shape
        step("200: sentMessages one per message, numeric ids, quoteToken, request ids")
        sock_before = None
        ids = set()
        req_ids = set()
        for i in range(3):
            st, doc, r = c.push(text_body("Ushape", "a%d" % i, "b%d" % i))
            check(st == 200 and set(doc) == {"sentMessages"} and len(doc["sentMessages"]) == 2,
                  "200 body %r" % (doc,))
            for m in doc["sentMessages"]:
                check(set(m) == {"id", "quoteToken"} and isinstance(m["id"], str)
                      and m["id"].isdigit() and isinstance(m["quoteToken"], str)
                      and len(m["quoteToken"]) > 0, "sentMessage %r" % (m,))
                ids.add(m["id"])
            check(r.getheader("Content-Type") == "application/json", "content type")
            check(r.getheader("Connection") == "keep-alive", "keep-alive header")
            rid = r.getheader("X-Line-Request-Id")
            check(is_uuid(rid), "request id %r" % rid)
            req_ids.add(rid)
            if sock_before is None:
                sock_before = c.conn.sock
            check(c.conn.sock is sock_before, "connection was not kept alive")
        check(len(ids) == 6 and len(req_ids) == 3, "ids not unique %r %r" % (ids, req_ids))
        c.call("POST", "/_target/reset")

        # ------------------------------------------------------- retry key
        step("retry key: same key within 24 h -> 409 + X-Line-Accepted-Request-Id, not sent again")
        k1 = str(uuid.uuid4())
        b1 = text_body("Uretry", "hello", "world")
        st, first, r = c.push(b1, key=k1)
        rid1 = r.getheader("X-Line-Request-Id")
        check(st == 200, "first -> %s" % st)
        st, doc, r = c.push(b1, key=k1)
        check(st == 409, "second -> %s %r" % (st, doc))
        check(doc == {"message": "The retry key is already accepted",
                      "sentMessages": first["sentMessages"]}, "409 body %r" % (doc,))
        check(r.getheader("X-Line-Accepted-Request-Id") == rid1,
              "accepted id %r != %r" % (r.getheader("X-Line-Accepted-Request-Id"), rid1))
        rid2 = r.getheader("X-Line-Request-Id")
        check(is_uuid(rid2) and rid2 != rid1, "409 needs its own request id")
        st, doc, r = c.push(text_body("Uretry", "other"), key=k1.upper())
        check(st == 409 and r.getheader("X-Line-Accepted-Request-Id") == rid1,
              "other body, same key (upper case) -> %s" % st)
        st, doc, _ = c.push({"to": "Uretry"}, key=k1)
        check(st == 400, "invalid body with an accepted key -> %s (validation first)" % st)
        st, doc, _ = c.push(b1, key=k1, token="nope")
        check(st == 401, "bad token with an accepted key -> %s (auth first)" % st)
        st, _, _ = c.push(text_body("Unokey", "same"))
        st2, _, _ = c.push(text_body("Unokey", "same"))
        check(st == st2 == 200, "no key: both processed")
        s = stats()
        check(s["delivered"] == 4 and s["delivered_by_to"] == {"Uretry": 2, "Unokey": 2},
              "delivered %r" % s["delivered_by_to"])
        check(s["duplicates"] == 1 and s["conflicts_409"] == 2
              and s["key_reused_with_other_body"] == 1,
              "counters dup=%s 409=%s other=%s" % (s["duplicates"], s["conflicts_409"],
                                                  s["key_reused_with_other_body"]))
        check(len(s["retry_keys"]) == 1 and s["retry_keys"][0]["key"] == k1
              and s["retry_keys"][0]["request_id"] == rid1 and s["retry_keys"][0]["active"],
              "retry_keys %r" % s["retry_keys"])
        reqs = s["requests"]
        check([r_["status"] for r_ in reqs] == [200, 409, 409, 400, 401, 200, 200],
              "statuses %r" % [r_["status"] for r_ in reqs])
        check(reqs[0]["request_id"] == rid1 and reqs[1]["accepted_request_id"] == rid1
              and reqs[1]["retry_key"] == k1 and reqs[2]["retry_key"] == k1.upper()
              and reqs[5]["retry_key"] is None, "request log %r" % reqs[:3])
        check(all(r_["method"] == "POST" and r_["path"] == PUSH and r_["shape"] == "ok"
                  for r_ in reqs), "request log fields %r" % reqs[0])
        check(set(reqs[0]) >= {"seq", "method", "path", "retry_key", "status", "shape",
                               "request_id", "processed_status", "accepted_request_id"},
              "request entry keys %r" % sorted(reqs[0]))

        step("8 parallel requests with one fresh key -> exactly one 200")
        k_par = str(uuid.uuid4())
        results = []
        lock = threading.Lock()

        def worker():
            cl = Client(port)
            try:
                st_, _, _ = cl.push(text_body("Upar", "p"), key=k_par)
            finally:
                cl.close()
            with lock:
                results.append(st_)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(10)
        check(sorted(results) == [200] + [409] * 7, "parallel results %r" % results)
        check(stats()["delivered_by_to"]["Upar"] == 1, "parallel delivered more than once")

        # ----------------------------------------------------------- clock
        step("clock: 409 until 24 h of simulated time, then the key is new")
        st, doc, _ = c.call("POST", "/_target/clock", {"advance_seconds": DAY - 5})
        check(st == 200 and doc["offset_seconds"] == DAY - 5, "advance -> %s %r" % (st, doc))
        st, doc, r = c.push(b1, key=k1)
        check(st == 409 and r.getheader("X-Line-Accepted-Request-Id") == rid1,
              "just inside the window -> %s" % st)
        c.call("POST", "/_target/clock", {"advance_seconds": 5})
        st, again, r = c.push(b1, key=k1)
        rid3 = r.getheader("X-Line-Request-Id")
        check(st == 200, "after 24 h -> %s %r" % (st, again))
        check(not ({m["id"] for m in again["sentMessages"]}
                   & {m["id"] for m in first["sentMessages"]}), "new message ids expected")
        st, doc, r = c.push(b1, key=k1)
        check(st == 409 and r.getheader("X-Line-Accepted-Request-Id") == rid3
              and doc["sentMessages"] == again["sentMessages"],
              "window restarts with the new accept -> %s" % st)
        s = stats()
        check(s["delivered_by_to"]["Uretry"] == 4 and s["duplicates"] == 3,
              "after window: %r dup=%s" % (s["delivered_by_to"], s["duplicates"]))
        st, doc, _ = c.call("GET", "/_target/clock")
        check(st == 200 and doc == {"offset_seconds": DAY}, "GET clock %r" % (doc,))
        for badc in ({"advance_seconds": -1}, {"advance_seconds": True},
                     {"advance_seconds": "5"}, {"advance": 5}, {"advance_seconds": 1, "x": 1}, []):
            st, doc, _ = c.call("POST", "/_target/clock", badc)
            check(st == 400, "clock %r -> %s" % (badc, st))
        check(c.call("GET", "/_target/clock")[1] == {"offset_seconds": DAY},
              "bad clock posts changed the clock")
        c.call("POST", "/_target/reset")

        # ---------------------------------------------------------- faults
        step("faults: validation, queue order, GET")
        st, doc, _ = c.call("POST", "/_target/faults", {"next": ["ok", "nope"]})
        check(st == 400, "unknown shape -> %s" % st)
        for badf in ({"next": "ok"}, {"other": 1}, {"stall_ms": -1}, {"retry_after_s": 1.5},
                     {"stall_ms": True}):
            check(c.call("POST", "/_target/faults", badf)[0] == 400, "faults %r accepted" % badf)
        st, doc, _ = c.call("GET", "/_target/faults")
        check(doc == {"next": [], "stall_ms": 5000, "retry_after_s": 1}, "faults %r" % (doc,))
        st, doc, _ = c.call("POST", "/_target/faults",
                            {"next": ["status_500", "status_429", "status_500"],
                             "retry_after_s": 0, "stall_ms": 400})
        check(st == 200 and doc["next"] == ["status_500", "status_429", "status_500"],
              "set faults %r" % (doc,))

        step("status_500 / status_429: answered, not processed, key not accepted")
        k5 = str(uuid.uuid4())
        b5 = text_body("Ufault", "five")
        st, doc, r = c.push(b5, key=k5)
        check(st == 500 and isinstance(doc.get("message"), str)
              and is_uuid(r.getheader("X-Line-Request-Id")), "500 -> %s %r" % (st, doc))
        st, doc, r = c.push(b5, key=k5)
        check(st == 429 and r.getheader("Retry-After") == "0", "429 -> %s %s"
              % (st, r.getheader("Retry-After")))
        st, doc, _ = c.push(b5, token=None)
        check(st == 500, "a queued 500 is answered before auth -> %s" % st)
        check(c.call("GET", "/_target/faults")[1]["next"] == [], "queue not drained")
        check(stats()["delivered"] == 0, "500/429 delivered something")
        st, doc, _ = c.push(b5, key=k5)
        check(st == 200, "retry after 500/429 with the same key -> %s (must be new)" % st)
        c.call("POST", "/_target/faults", {"next": ["status_429"], "retry_after_s": 7})
        st, doc, r = c.push(b5)
        check(st == 429 and r.getheader("Retry-After") == "7", "Retry-After 7")
        c.call("POST", "/_target/faults", {"retry_after_s": 0})

        def lost_answer(shape, expect_end, min_wait=0.0):
            key = str(uuid.uuid4())
            body = text_body("Ulost", shape)
            c.call("POST", "/_target/faults", {"next": [shape]})
            before = stats()["delivered"]
            t = time.monotonic()
            s_ = raw_push(port, body, key)
            end, got = read_until_end(s_)
            dt = time.monotonic() - t
            s_.close()
            check(got == b"", "%s sent bytes %r" % (shape, got[:80]))
            check(end == expect_end, "%s ended with %s, expected %s" % (shape, end, expect_end))
            check(dt >= min_wait, "%s ended after %.3f s, expected >= %.3f" % (shape, dt, min_wait))
            s2 = stats()
            check(s2["delivered"] == before + 1, "%s: delivery not counted" % shape)
            entry = s2["requests"][-1]
            check(entry["shape"] == shape and entry["status"] is None
                  and entry["processed_status"] == 200 and entry["retry_key"] == key,
                  "%s log entry %r" % (shape, entry))
            st_, doc_, r_ = c.push(body, key=key)
            check(st_ == 409, "%s: retry with the same key -> %s" % (shape, st_))
            check(r_.getheader("X-Line-Accepted-Request-Id") == entry["request_id"],
                  "%s: accepted id %r, log says %r"
                  % (shape, r_.getheader("X-Line-Accepted-Request-Id"), entry["request_id"]))
            check(doc_["sentMessages"][0]["id"] == s2["deliveries"][-1]["message_id"],
                  "%s: 409 sentMessages %r" % (shape, doc_))
            check(stats()["delivered"] == before + 1, "%s: retry delivered again" % shape)
            return dt

        step("accept_then_reset: delivered, RST with no bytes, retry -> 409")
        lost_answer("accept_then_reset", "rst")
        step("accept_then_close: delivered, FIN with no bytes, retry -> 409")
        lost_answer("accept_then_close", "fin")
        step("accept_then_stall (400 ms): delivered, silence, FIN, retry -> 409")
        dt = lost_answer("accept_then_stall", "fin", min_wait=0.38)
        check(dt < 2.0, "stall took %.3f s" % dt)

        step("accept_then_close on a duplicate key: the 409 is decided, then the answer is lost")
        k6 = str(uuid.uuid4())
        check(c.push(text_body("Ulost", "six"), key=k6)[0] == 200, "k6 first")
        c.call("POST", "/_target/faults", {"next": ["accept_then_close", "ok"]})
        s_ = raw_push(port, text_body("Ulost", "six"), k6)
        end, got = read_until_end(s_)
        s_.close()
        check(end == "fin" and got == b"", "close after 409: %s %r" % (end, got[:80]))
        s = stats()
        check(s["requests"][-1]["processed_status"] == 409
              and s["requests"][-1]["status"] is None, "log %r" % s["requests"][-1])
        check(c.push(text_body("Ulost", "six"), key=k6)[0] == 409, "ok shape after queue")

        # ----------------------------------------------------------- stats
        step("stats: delivered_by_to, duplicates, conflicts, other-body reuse")
        c.call("POST", "/_target/reset")
        kA = str(uuid.uuid4())
        c.push(text_body("U1", "a", "b"), key=kA)
        c.push(text_body("U1", "a"))                       # duplicate (U1, a)
        c.push(text_body("U2", "a"))                       # other recipient: not a dup
        c.push(text_body("U1", "a", "b"), key=kA)          # 409 same body
        c.push(text_body("U1", "zzz"), key=kA)             # 409 other body
        c.push(text_body("U1", "zzz"), key=kA)             # 409 other body again
        s = stats()
        check(s["delivered"] == 4 and s["delivered_by_to"] == {"U1": 3, "U2": 1},
              "delivered %r %r" % (s["delivered"], s["delivered_by_to"]))
        check(s["duplicates"] == 1 and s["conflicts_409"] == 3
              and s["key_reused_with_other_body"] == 2,
              "dup=%s 409=%s other=%s" % (s["duplicates"], s["conflicts_409"],
                                          s["key_reused_with_other_body"]))
        check(s["requests_total"] == 6 and len(s["requests"]) == 6
              and [e["seq"] for e in s["requests"]] == [1, 2, 3, 4, 5, 6],
              "request log %r" % s["requests"])
        check([d["text"] for d in s["deliveries"]] == ["a", "b", "a", "a"]
              and s["deliveries"][0]["retry_key"] == kA, "deliveries %r" % s["deliveries"])

        # ---------------------------------------------------- other routes
        step("other routes: 404 / 405 (recorded, never faulted); control routes not recorded")
        c.call("POST", "/_target/faults", {"next": ["status_500"]})
        st, doc, r = c.call("GET", "/v2/bot/info", headers={"Authorization": "Bearer " + TOKEN})
        check(st == 404 and is_uuid(r.getheader("X-Line-Request-Id")), "404 -> %s" % st)
        st, doc, r = c.call("GET", PUSH, headers={"Authorization": "Bearer " + TOKEN})
        check(st == 405 and r.getheader("Allow") == "POST", "GET push -> %s" % st)
        check(c.call("GET", "/_target/nope")[0] == 404, "unknown control route")
        check(c.call("DELETE", "/_target/stats")[0] == 405, "wrong control method")
        check(c.call("GET", "/_target/faults")[1]["next"] == ["status_500"],
              "faults applied to a non-push request")
        s = stats()
        check(s["requests_total"] == 8 and [e["status"] for e in s["requests"][-2:]] == [404, 405]
              and s["requests"][-1]["shape"] is None, "log %r" % s["requests"][-2:])

        # ----------------------------------------------------------- reset
        step("reset clears everything, clock offset included")
        c.call("POST", "/_target/clock", {"advance_seconds": 100})
        c.call("POST", "/_target/faults", {"next": ["status_500"], "stall_ms": 10})
        st, doc, _ = c.call("POST", "/_target/reset")
        check(st == 200, "reset -> %s" % st)
        s = stats()
        check(s["requests"] == [] and s["requests_total"] == 0 and s["delivered"] == 0
              and s["delivered_by_to"] == {} and s["duplicates"] == 0
              and s["conflicts_409"] == 0 and s["key_reused_with_other_body"] == 0
              and s["retry_keys"] == [] and s["deliveries"] == []
              and s["clock"] == {"offset_seconds": 0.0}
              and s["faults"] == {"next": [], "stall_ms": 5000, "retry_after_s": 1},
              "stats after reset %r" % s)
        st, doc, _ = c.push(text_body("U1", "a", "b"), key=kA)
        check(st == 200, "key accepted before reset is new after it -> %s" % st)

        # ---------------------------------------------------------- framing
        step("framing: Transfer-Encoding, bad request line -> 400 + close; Connection: close honoured")
        s_ = socket.create_connection(("127.0.0.1", port), timeout=5)
        s_.sendall(b"POST " + PUSH.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        end, got = read_until_end(s_)
        s_.close()
        check(got.startswith(b"HTTP/1.1 400") and b"X-Line-Request-Id:" in got, "TE -> %r" % got[:60])
        s_ = socket.create_connection(("127.0.0.1", port), timeout=5)
        s_.sendall(b"GARBAGE\r\n\r\n")
        end, got = read_until_end(s_)
        s_.close()
        check(got.startswith(b"HTTP/1.1 400") and b"X-Line-Request-Id:" in got
              and got.endswith(b"}"), "bad request line -> %r" % got[:200])
        st, doc, r = c.push(text_body("U9", "x"), headers={"Connection": "close"})
        check(st == 200 and r.getheader("Connection") == "close", "Connection: close")

        # --------------------------------------------------------- shutdown
        step("SIGTERM -> exit 0")
        c.close()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=5)
        check(rc == 0, "exit status %s" % rc)
        out = proc.stdout.read()
        check(out == "", "extra stdout %r" % out[:200])
        err = proc.stderr.read()
        check(err.strip() == "", "stderr not empty: %r" % err[:500])
    except Failure as e:
        print("FAIL in step %r: %s" % (steps[-1] if steps else "?", e), flush=True)
        return 1
    except Exception as e:   # an unexpected error is a failure too
        print("FAIL in step %r: %s: %s" % (steps[-1] if steps else "?",
                                           type(e).__name__, e), flush=True)
        return 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print("line_target selftest OK (%.1f s)" % (time.monotonic() - t_start), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
