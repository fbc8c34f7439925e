#!/usr/bin/env python3
"""Self-test for fragile_target.py (about 4 s).

Starts the target as a subprocess on a free port and checks it with
http.client and raw sockets.  Exits 0 on success, 1 on the first failure.
"""

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "fragile_target.py")


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def start_server():
    proc = subprocess.Popen([sys.executable, TARGET, "--port", "0", "--service-ms", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    if not ready:
        proc.kill()
        raise Failure("no PORT line within 10 s")
    line = proc.stdout.readline().strip()
    if not line.startswith("PORT "):
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
            hdrs["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=hdrs)
        resp = self.conn.getresponse()
        text = resp.read()
        try:
            doc = json.loads(text) if text else None
        except ValueError:
            doc = text
        return resp.status, doc, resp

    def close(self):
        self.conn.close()


def main():
    t_start = time.monotonic()
    proc, port = start_server()
    c = Client(port)
    steps = []

    def step(name):
        steps.append(name)
        print("  -", name, flush=True)

    try:
        # ---------------------------------------------------------------- ok
        step("ok mode stores orders")
        st, cfg, _ = c.call("GET", "/_target/config")
        check(st == 200 and cfg == {"mode": "ok", "fail_status": 503, "slow_ms": 0,
                                     "service_ms": 20}, "initial config %r" % (cfg,))
        ids = []
        for ref in ("a", "a", "b"):
            st, doc, _ = c.call("POST", "/erp/orders", {"ref": ref})
            check(st == 201 and doc["ref"] == ref, "create %s -> %s %r" % (ref, st, doc))
            ids.append(doc["id"])
        check(ids == ["ORD-1", "ORD-2", "ORD-3"], "ids %r" % ids)
        st, doc, _ = c.call("GET", "/erp/orders?ref=a")
        check(st == 200 and [o["id"] for o in doc["items"]] == ["ORD-1", "ORD-2"],
              "find a -> %r" % (doc,))
        _, s, _ = c.call("GET", "/_target/stats")
        check(s["requests"] == 4 and s["orders"] == 3 and s["failed"] == 0,
              "stats after ok %r" % s)
        check(s["by_mode"] == {"ok": 4, "fail": 0, "slow": 0}, "by_mode %r" % s["by_mode"])
        check(s["by_status"] == {"201": 3, "200": 1}, "by_status %r" % s["by_status"])
        check(len(s["arrivals"]) == 4 and s["arrivals"] == sorted(s["arrivals"]),
              "arrivals %r" % s["arrivals"])
        check(s["in_flight"] == 0 and s["in_flight_max"] == 1, "in_flight %r" % s)

        # -------------------------------------------------------------- fail
        step("fail mode answers 503 and stores nothing")
        st, cfg, _ = c.call("POST", "/_target/config", {"mode": "fail"})
        check(st == 200 and cfg["mode"] == "fail", "set fail %s %r" % (st, cfg))
        st, doc, _ = c.call("POST", "/erp/orders", {"ref": "c"})
        check(st == 503 and doc == {"error": "unavailable"}, "fail create %s %r" % (st, doc))
        st, doc, _ = c.call("GET", "/erp/orders?ref=a")
        check(st == 503, "fail find %s" % st)
        c.call("POST", "/_target/config", {"fail_status": 500})
        st, doc, _ = c.call("POST", "/erp/orders", {"ref": "c"})
        check(st == 500 and doc == {"error": "unavailable"}, "fail_status 500 -> %s" % st)
        st, doc, _ = c.call("POST", "/erp/orders", raw=b"{not json")
        check(st == 500, "fail mode wins over bad JSON -> %s" % st)
        c.call("POST", "/_target/config", {"mode": "ok", "fail_status": 503})
        st, doc, _ = c.call("GET", "/erp/orders?ref=c")
        check(st == 200 and doc["items"] == [], "c stored in fail mode: %r" % (doc,))
        _, s, _ = c.call("GET", "/_target/stats")
        check(s["orders"] == 3 and s["failed"] == 4 and s["requests"] == 9,
              "stats after fail %r" % {k: s[k] for k in ("orders", "failed", "requests")})
        check(s["by_mode"] == {"ok": 5, "fail": 4, "slow": 0}, "by_mode %r" % s["by_mode"])

        # -------------------------------------------------------------- slow
        step("slow mode adds slow_ms")
        c.call("POST", "/_target/config", {"mode": "slow", "slow_ms": 150, "service_ms": 0})
        t = time.monotonic()
        st, doc, _ = c.call("POST", "/erp/orders", {"ref": "s"})
        dt = time.monotonic() - t
        check(st == 201 and 0.15 <= dt < 1.0, "slow create %s in %.3f s" % (st, dt))
        c.call("POST", "/_target/config", {"mode": "ok", "slow_ms": 0})
        t = time.monotonic()
        c.call("POST", "/erp/orders", {"ref": "s"})
        check(time.monotonic() - t < 0.15, "ok mode after slow still slow")

        # ------------------------------------------------------- validation
        step("config validation: 400 and nothing changes")
        _, before, _ = c.call("GET", "/_target/config")
        bad = [{"mode": "broken"}, {"bogus": 1}, {"fail_status": "503"},
               {"fail_status": 200}, {"fail_status": True}, {"slow_ms": -1},
               {"service_ms": 1.5}, {"slow_ms": 600001},
               {"mode": "fail", "slow_ms": -5}, [1], "fail"]
        for b in bad:
            st, doc, _ = c.call("POST", "/_target/config", b)
            check(st == 400 and "error" in doc, "config %r -> %s" % (b, st))
        st, doc, _ = c.call("POST", "/_target/config", raw=b"{oops")
        check(st == 400, "config bad JSON -> %s" % st)
        _, after, _ = c.call("GET", "/_target/config")
        check(after == before, "config changed by bad posts: %r -> %r" % (before, after))
        for b in ({"label": ""}, {"label": 3}, {"label": "x", "t": 1}, {}):
            st, _, _ = c.call("POST", "/_target/mark", b)
            check(st == 400, "mark %r -> %s" % (b, st))

        # ------------------------------------------------------- HTTP errors
        step("404 / 405 / 400 / 422 / Connection: close")
        check(c.call("GET", "/nope")[0] == 404, "business 404")
        check(c.call("GET", "/_target/nope")[0] == 404, "control 404")
        st, _, resp = c.call("PUT", "/erp/orders", {"ref": "x"})
        check(st == 405 and resp.getheader("Allow") == "GET, POST", "PUT orders")
        st, _, resp = c.call("GET", "/_target/reset")
        check(st == 405 and resp.getheader("Allow") == "POST", "GET reset")
        check(c.call("DELETE", "/_target/stats")[0] == 405, "DELETE stats")
        check(c.call("POST", "/erp/orders", raw=b"{bad")[0] == 400, "bad JSON create")
        check(c.call("POST", "/erp/orders", [1])[0] == 400, "non-object create")
        check(c.call("POST", "/erp/orders", {"ref": 5})[0] == 422, "ref not str")
        check(c.call("GET", "/erp/orders")[0] == 400, "find without ref")
        check(c.call("POST", "/_target/mark", raw=b"nope")[0] == 400, "mark bad JSON")
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        payload = b'{"ref":"z"}'
        s.sendall(b"POST /erp/orders HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(payload), payload))
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        head = data.split(b"\r\n\r\n", 1)[0].lower()
        check(data.startswith(b"HTTP/1.1 201") and b"connection: close" in head,
              "Connection: close answer %r" % data[:200])
        check(c.call("POST", "/erp/orders", {"ref": "k"})[0] == 201, "keep-alive reuse")

        # ------------------------------------------------------------- reset
        step("reset clears counters and orders, keeps config")
        c.call("POST", "/_target/config", {"fail_status": 502, "service_ms": 0})
        st, doc, _ = c.call("POST", "/_target/reset")
        check(st == 200 and doc["config"]["fail_status"] == 502, "reset %s %r" % (st, doc))
        _, s, _ = c.call("GET", "/_target/stats")
        check(s["requests"] == 0 and s["orders"] == 0 and s["failed"] == 0
              and s["arrivals"] == [] and s["marks"] == [] and s["in_flight_max"] == 0
              and s["max_per_second_1s"] == 0 and s["by_status"] == {}
              and s["now"] < 1.0, "stats after reset %r" % s)
        check(s["config"]["fail_status"] == 502, "config lost by reset")
        st, doc, _ = c.call("GET", "/erp/orders?ref=a")
        check(doc["items"] == [], "orders survived reset")
        st, doc, _ = c.call("POST", "/erp/orders", {"ref": "a"})
        check(st == 201 and doc["id"] not in ids, "order id reused after reset: %r" % doc)

        # ------------------------------------------------------- concurrency
        step("8 concurrent clients, service_ms 200 -> in_flight_max 8; sequential -> 1")
        c.call("POST", "/_target/config", {"service_ms": 200, "fail_status": 503})
        c.call("POST", "/_target/reset")
        barrier = threading.Barrier(8)
        results = []
        lock = threading.Lock()

        def worker(i):
            cl = Client(port)
            try:
                cl.conn.connect()
                barrier.wait(timeout=5)
                st, _, _ = cl.call("POST", "/erp/orders", {"ref": "p%d" % i})
            except Exception as e:  # noqa: BLE001 - reported below
                st = repr(e)
            finally:
                cl.close()
            with lock:
                results.append(st)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        t = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join(10)
        dt = time.monotonic() - t
        _, s, _ = c.call("GET", "/_target/stats")
        check(results == [201] * 8, "parallel results %r" % results)
        check(s["in_flight_max"] == 8 and s["in_flight"] == 0 and s["orders"] == 8,
              "parallel stats in_flight_max=%s in_flight=%s orders=%s (%.2f s)"
              % (s["in_flight_max"], s["in_flight"], s["orders"], dt))
        c.call("POST", "/_target/reset")
        for i in range(3):
            check(c.call("POST", "/erp/orders", {"ref": "q"})[0] == 201, "sequential")
        _, s, _ = c.call("GET", "/_target/stats")
        check(s["in_flight_max"] == 1 and s["orders"] == 3,
              "sequential in_flight_max=%s" % s["in_flight_max"])

        # ------------------------------------------------- rate + marks
        step("20 requests at 10/s -> max_per_second_1s in 9..12; marks")
        c.call("POST", "/_target/config", {"service_ms": 0})
        c.call("POST", "/_target/reset")
        ctl = Client(port)
        ctl.call("POST", "/_target/mark", {"label": "start"})
        t0 = time.monotonic()
        for i in range(20):
            if i == 10:
                st, m, _ = ctl.call("POST", "/_target/mark", {"label": "half"})
                check(st == 200 and m["label"] == "half", "mark -> %s %r" % (st, m))
            delay = t0 + i * 0.1 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            check(c.call("POST", "/erp/orders", {"ref": "r%d" % i})[0] == 201, "paced")
        ctl.call("POST", "/_target/mark", {"label": "end"})
        _, s, _ = ctl.call("GET", "/_target/stats")
        ctl.close()
        check(9 <= s["max_per_second_1s"] <= 12, "max_per_second_1s=%s arrivals=%r"
              % (s["max_per_second_1s"], s["arrivals"]))
        check(s["arrivals_after"] == {"start": 20, "half": 10, "end": 0},
              "arrivals_after %r" % s["arrivals_after"])
        labels = [m["label"] for m in s["marks"]]
        times = [m["t"] for m in s["marks"]]
        check(labels == ["start", "half", "end"] and times == sorted(times), "marks %r" % s["marks"])
        arr = s["arrivals"]
        check(len(arr) == 20 and s["requests"] == 20, "20 arrivals %r" % arr)
        span = arr[-1] - arr[0]
        check(1.7 <= span <= 2.5, "arrival span %.3f" % span)
        half_t = times[1]
        check(sum(1 for a in arr if a > half_t) == 10, "arrivals vs half mark")
        w = s["rate"]["window_s"]
        check(1.8 <= w <= 5.0 and abs(s["rate"]["per_second"] - 20 / w) < 0.01,
              "rate %r" % s["rate"])

        # --------------------------------------------------------- shutdown
        step("SIGTERM -> exit 0")
        c.close()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=5)
        check(rc == 0, "exit status %s" % rc)
        err = proc.stderr.read()
        check(err.strip() == "", "stderr not empty: %r" % err[:500])
    except Failure as e:
        print("FAIL in step %r: %s" % (steps[-1] if steps else "?", e), flush=True)
        return 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print("fragile_target selftest OK (%.1f s)" % (time.monotonic() - t_start), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
