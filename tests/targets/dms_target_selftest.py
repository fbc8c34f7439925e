#!/usr/bin/env python3
"""Self-test for dms_target.py (standard library only).

Starts the target as a subprocess (--port 0), talks to it with http.client
and raw sockets, and exits non-zero if any check fails.

    python3 tests/targets/dms_target_selftest.py
"""

import ctypes
import hashlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "dms_target.py")
BOUNDARY = "dmsSelfTestB0undary7MA4YWxk"

failures = []


def check(cond, what, detail=None):
    if cond:
        print("ok   " + what)
    else:
        print("FAIL " + what + ("" if detail is None else ": %r" % (detail,)))
        failures.append(what)
    return cond


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------

class Target:
    def __init__(self, *args):
        self.proc = subprocess.Popen([sys.executable, TARGET, "--port", "0"] + list(args),
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise SystemExit("target did not print PORT: %r" % line)
        self.port = int(line.split()[1])

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None


def signal_a_connection_thread(proc, sig):
    """Sends sig to one of proc's threads other than its main thread, as the
    kernel may do with any process-directed signal.  False when there is none."""
    others = [int(t) for t in os.listdir("/proc/%d/task" % proc.pid) if int(t) != proc.pid]
    if not others:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.tgkill(proc.pid, min(others), sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")
    return True


def call(port, method, path, body=None, headers=None, conn=None):
    own = conn is None
    if own:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    raw = resp.read()
    if own:
        conn.close()
    data = None
    if raw:
        try:
            data = json.loads(raw)
        except ValueError:
            data = raw
    return resp.status, resp, data


def multipart(fields=(), files=(), boundary=BOUNDARY):
    """fields: [(name, str)], files: [(name, filename, content_type, bytes)]"""
    out = bytearray()
    b = boundary.encode()
    for name, value in fields:
        out += b"--" + b + b"\r\n"
        out += b'Content-Disposition: form-data; name="' + name.encode() + b'"\r\n\r\n'
        out += value.encode("utf-8") + b"\r\n"
    for name, filename, ctype, data in files:
        out += b"--" + b + b"\r\n"
        out += b'Content-Disposition: form-data; name="' + name.encode() + b'"'
        if filename is not None:
            out += b'; filename="' + filename.encode("utf-8") + b'"'
        out += b"\r\n"
        if ctype is not None:
            out += b"Content-Type: " + ctype.encode() + b"\r\n"
        out += b"\r\n" + data + b"\r\n"
    out += b"--" + b + b"--\r\n"
    return bytes(out)


MP_TYPE = "multipart/form-data; boundary=" + BOUNDARY


def stats(port):
    return call(port, "GET", "/_target/stats")[2]


def reset(port):
    call(port, "POST", "/_target/reset")


def set_faults(port, spec):
    return call(port, "POST", "/_target/faults", json.dumps(spec).encode(),
                {"Content-Type": "application/json"})


def raw_exchange(port, data, timeout=10):
    """Send bytes, read until EOF.  -> (bytes received, "eof" | "reset")."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        got = bytearray()
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return bytes(got), "reset"
            if not chunk:
                return bytes(got), "eof"
            got += chunk
    finally:
        s.close()


def upload_request(body, extra=b"", connection=b"keep-alive"):
    return (b"POST /dms/documents HTTP/1.1\r\nHost: t\r\nContent-Type: " + MP_TYPE.encode()
            + b"\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\nConnection: " + connection + b"\r\n" + extra + b"\r\n" + body)


def sha(data):
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------

def tricky_content():
    """Binary content with CRLFs, '--' runs and near-miss boundaries."""
    b = BOUNDARY.encode()
    rng = random.Random(20240601)
    return b"".join([
        b"\r\n--\r\n", b"--", b"\r\n\r\n",
        b"\r\n" + b + b"\r\n",              # boundary without the dashes
        b"\r\n-" + b + b"\r\n",             # one dash only
        b"\r\n--" + b[:-1] + b"\r\n",       # truncated boundary
        b"\r\n-- " + b + b"\r\n",           # dashes, space, boundary
        b + b"--\r\n",                      # close-delimiter minus dashes
        b"Content-Disposition: form-data; name=\"file\"\r\n\r\n",
        bytes(range(256)), bytes(range(255, -1, -1)),
        rng.randbytes(65536),
        b"\r\n--",                          # ends with CRLF + dashes
    ])


def test_multipart(port):
    reset(port)
    content = tricky_content()
    body = multipart(fields=[("ref", "R-1"), ("note", "Grüße ✓"), ("empty", "")],
                     files=[("file", "Bericht Ä.bin", "application/octet-stream", content)])
    st, resp, data = call(port, "POST", "/dms/documents", body,
                          {"Content-Type": MP_TYPE, "Idempotency-Key": "k-1"})
    check(st == 201, "multipart upload -> 201", (st, data))
    check(data.get("id") == "DOC-1" and data.get("location") == "/dms/documents/DOC-1",
          "multipart: id and location", data)
    check(resp.getheader("Location") == "/dms/documents/DOC-1", "multipart: Location header")
    check(data.get("sha256") == sha(content), "multipart: sha256 of tricky binary content")
    check(data.get("size") == len(content), "multipart: size", (data.get("size"), len(content)))
    check(data.get("filename") == "Bericht Ä.bin", "multipart: UTF-8 filename", data.get("filename"))
    check(data.get("content_type") == "application/octet-stream", "multipart: file content type")
    check(data.get("fields") == {"ref": "R-1", "note": "Grüße ✓", "empty": ""},
          "multipart: fields returned", data.get("fields"))
    st, _, meta = call(port, "GET", "/dms/documents/DOC-1")
    check(st == 200 and meta.get("head_hex") == content[:64].hex()
          and meta.get("idempotency_key") == "k-1" and meta.get("kind") == "multipart",
          "GET document: metadata with first 64 bytes and idempotency key", meta)

    # Edge contents right before the delimiter / right after the headers.
    edges = [b"", b"\r", b"\n", b"\r\n", b"\r\n\r\n", b"-", b"--", b"\r\n--", b"--\r\n",
             b"\n\r", b"x\r", BOUNDARY.encode(), b"\x00" * 1000, b"\r\r\n\n"]
    bad = []
    for content in edges:
        body = multipart(files=[("file", "e.bin", "application/octet-stream", content)])
        st, _, data = call(port, "POST", "/dms/documents", body, {"Content-Type": MP_TYPE})
        if st != 201 or data.get("sha256") != sha(content) or data.get("size") != len(content):
            bad.append((content, st, data))
    check(not bad, "multipart: %d edge-case contents hash correctly" % len(edges), bad)

    # Same content + same Idempotency-Key again: still a NEW document.
    content = b"same bytes"
    body = multipart(fields=[("ref", "dup")], files=[("file", "d.txt", "text/plain", content)])
    ids = [call(port, "POST", "/dms/documents", body,
                {"Content-Type": MP_TYPE, "Idempotency-Key": "same"})[2].get("id") for _ in range(2)]
    check(len(set(ids)) == 2, "repeat upload (same key, same bytes) makes a new document", ids)
    s = stats(port)
    check(s["by_sha256"].get(sha(content)) == 2, "stats.by_sha256 counts both", s["by_sha256"])
    last = s["requests"][-1]
    check(last["idempotency_key"] == "same" and last["chunked"] is False
          and last["size"] == len(body) and last["content_type"] == MP_TYPE,
          "stats.requests records key, chunked, size, content type", last)


def test_multipart_errors(port):
    reset(port)
    good_file = ("file", "a.txt", "text/plain", b"abc")
    cases = [
        ("missing file part", MP_TYPE, multipart(fields=[("ref", "x")]), 400, "missing_file_part"),
        ("duplicate file part", MP_TYPE, multipart(files=[good_file, good_file]), 400,
         "duplicate_file_part"),
        ("missing boundary", "multipart/form-data", multipart(files=[good_file]), 400,
         "missing_boundary"),
        ("no close delimiter", MP_TYPE, multipart(files=[good_file])[:-len(BOUNDARY) - 6], 400,
         "malformed_multipart"),
        ("no parts at all", MP_TYPE, b"just text\r\n", 400, "malformed_multipart"),
        ("file part without filename", MP_TYPE,
         multipart(files=[("file", None, "text/plain", b"abc")]), 400, "missing_filename"),
        ("file part without Content-Type", MP_TYPE,
         multipart(files=[("file", "a.txt", None, b"abc")]), 400, "missing_file_content_type"),
        ("second file under another name", MP_TYPE,
         multipart(files=[good_file, ("other", "b.txt", "text/plain", b"x")]), 400,
         "unexpected_file_part"),
        ("not multipart", "application/json", b"{}", 415, "unsupported_media_type"),
    ]
    for what, ctype, body, want, prob in cases:
        st, _, data = call(port, "POST", "/dms/documents", body, {"Content-Type": ctype})
        check(st == want and isinstance(data, dict) and data.get("problem") == prob
              and data.get("error"), "upload error: %s -> %d %s" % (what, want, prob), (st, data))
    s = stats(port)
    check(s["documents"] == 0 and s["uploads"] == 0, "rejected uploads store nothing", s["documents"])
    check(s["bad_requests"] == len(cases), "stats.bad_requests counts them", s["bad_requests"])


def test_chunked_and_continue(port):
    reset(port)
    content = tricky_content()
    body = multipart(fields=[("ref", "chunky")],
                     files=[("file", "c.bin", "application/pdf", content)])

    def pieces():
        # Small odd-sized chunks first so CRLFs and the delimiter are split.
        i = 0
        for size in (1, 2, 3, 5, 7, 11, 13) * 40:
            yield body[i:i + size]
            i += size
        while i < len(body):
            yield body[i:i + 4099]
            i += 4099
    st, _, data = call(port, "POST", "/dms/documents", pieces(), {"Content-Type": MP_TYPE})
    check(st == 201 and data.get("sha256") == sha(content) and data.get("size") == len(content),
          "chunked multipart upload hashes correctly", (st, data))
    last = stats(port)["requests"][-1]
    check(last["chunked"] is True and last["size"] == len(body),
          "stats.requests: chunked true and decoded size", last)

    # Expect: 100-continue on a raw socket.
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        head = (b"POST /dms/documents HTTP/1.1\r\nHost: t\r\nContent-Type: " + MP_TYPE.encode()
                + b"\r\nContent-Length: %d\r\nExpect: 100-continue\r\n"
                b"Connection: close\r\n\r\n" % len(body))
        s.sendall(head)
        interim = s.recv(25)
        check(interim == b"HTTP/1.1 100 Continue\r\n\r\n", "Expect: 100-continue answered", interim)
        s.sendall(body)
        got = bytearray()
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    finally:
        s.close()
    check(got.startswith(b"HTTP/1.1 201 "), "upload after 100 Continue -> 201", bytes(got[:40]))


def test_raw_and_form(port):
    reset(port)
    content = b"%PDF-1.7\r\n" + bytes(range(256)) * 40 + b"\r\n--" + BOUNDARY.encode()
    st, resp, data = call(port, "PUT", "/dms/raw/report%20one.pdf", content,
                          {"Content-Type": "application/pdf", "Idempotency-Key": "raw-1"})
    check(st == 201 and data.get("id") == "DOC-1" and data.get("sha256") == sha(content)
          and data.get("size") == len(content) and data.get("content_type") == "application/pdf"
          and data.get("location") == "/dms/documents/DOC-1",
          "raw PUT -> 201 with sha256/size/content_type", (st, data))
    st, _, data2 = call(port, "PUT", "/dms/raw/report%20one.pdf", content,
                        {"Content-Type": "application/pdf"})
    check(st == 201 and data2.get("id") == "DOC-2", "raw PUT again -> new document", data2)
    st, _, meta = call(port, "GET", "/dms/documents/DOC-1")
    check(meta.get("name") == "report one.pdf" and meta.get("kind") == "raw"
          and meta.get("idempotency_key") == "raw-1", "raw document metadata", meta)

    body = b"a=1&b=&c=x+y%2Bz&d=%C3%A4&a=2&e"
    st, _, data = call(port, "POST", "/dms/forms", body,
                       {"Content-Type": "application/x-www-form-urlencoded"})
    check(st == 201 and data.get("id") == "FORM-1"
          and data.get("fields") == {"a": ["1", "2"], "b": "", "c": "x y+z", "d": "ä", "e": ""},
          "form -> 201 with parsed fields", (st, data))
    st, _, data = call(port, "POST", "/dms/forms", b"{}", {"Content-Type": "application/json"})
    check(st == 415, "form with a wrong content type -> 415", (st, data))
    s = stats(port)
    check(s["uploads"] == 2 and s["documents"] == 2 and s["forms"] == 1,
          "stats after raw + form", (s["uploads"], s["documents"], s["forms"]))


def test_search_delete(port):
    reset(port)
    x, y = b"content X\r\n", b"content Y\r\n"
    for ref, content in (("R1", x), ("R2", x), ("R1", y)):
        call(port, "POST", "/dms/documents",
             multipart(fields=[("ref", ref)], files=[("file", "f", "text/plain", content)]),
             {"Content-Type": MP_TYPE})

    def ids(query):
        st, _, data = call(port, "GET", "/dms/documents?" + query)
        return st, [i["id"] for i in data["items"]] if st == 200 else data

    check(ids("sha256=" + sha(x)) == (200, ["DOC-1", "DOC-2"]), "search by sha256, oldest first")
    check(ids("sha256=" + sha(x).upper()) == (200, ["DOC-1", "DOC-2"]), "sha256 search ignores case")
    check(ids("ref=R1") == (200, ["DOC-1", "DOC-3"]), "search by ref")
    check(ids("ref=R1&sha256=" + sha(x)) == (200, ["DOC-1"]), "search by sha256 and ref")
    check(ids("ref=none") == (200, []), "search without match -> empty items")
    st, _, _ = call(port, "GET", "/dms/documents")
    check(st == 400, "search without sha256/ref -> 400", st)

    st, resp, raw = call(port, "DELETE", "/dms/documents/DOC-1")
    check(st == 204 and raw is None, "delete -> 204, no body", (st, raw))
    st, _, _ = call(port, "DELETE", "/dms/documents/DOC-1")
    check(st == 404, "second delete -> 404", st)
    check(call(port, "GET", "/dms/documents/DOC-1")[0] == 404, "GET deleted -> 404")
    check(call(port, "GET", "/dms/documents/DOC-9")[0] == 404, "GET unknown -> 404")
    check(ids("sha256=" + sha(x)) == (200, ["DOC-2"]), "deleted document left the search")
    s = stats(port)
    check(s["deletes"] == 1 and s["documents"] == 2 and s["uploads"] == 3
          and s["by_sha256"][sha(x)] == 2, "stats after delete",
          (s["deletes"], s["documents"], s["uploads"]))


def test_faults(port):
    reset(port)
    before = call(port, "GET", "/_target/faults")[2]
    st, _, _ = set_faults(port, {"nope": {"next": ["ok"]}})
    check(st == 400, "faults: unknown route -> 400", st)
    for bad_shape in ("status:99", "status:204", "stall_ms:x", "explode", "status:5033"):
        st, _, _ = set_faults(port, {"upload": {"next": ["ok", bad_shape]}})
        check(st == 400, "faults: bad shape %r -> 400" % bad_shape, st)
    check(call(port, "GET", "/_target/faults")[2] == before, "faults: rejected posts change nothing")

    st, _, data = set_faults(port, {"upload": {"next": ["close_before_bytes", "status:503", "reset",
                                                        "partial_headers", "stall_ms:300", "ok"]}})
    check(st == 200 and data["faults"]["upload"]["next"][0] == "close_before_bytes",
          "faults: queue set", data)
    body = multipart(fields=[("ref", "F")], files=[("file", "f.bin", "application/octet-stream",
                                                    b"fault\r\n--payload")])

    got, how = raw_exchange(port, upload_request(body))
    check(got == b"" and how == "eof", "close_before_bytes: no response bytes, FIN", (got, how))
    s = stats(port)
    check(s["documents"] == 1 and s["uploads"] == 1, "close_before_bytes: document stored",
          s["documents"])
    check(s["requests"][-1]["shape"] == "close_before_bytes" and s["requests"][-1]["status"] is None,
          "close_before_bytes recorded with status null", s["requests"][-1])

    st, resp, data = call(port, "POST", "/dms/documents", body, {"Content-Type": MP_TYPE})
    check(st == 503 and data == {"error": "injected"} and resp.getheader("Retry-After") == "0",
          "status:503 -> injected 503", (st, data))
    check(stats(port)["documents"] == 1, "status:503 stores nothing")

    got, how = raw_exchange(port, upload_request(body))
    check(got == b"" and how == "reset", "reset: RST, no bytes", (got, how))
    check(stats(port)["documents"] == 2, "reset: document stored")

    got, how = raw_exchange(port, upload_request(body))
    check(got.startswith(b"HTTP/1.1 201 Created\r\n") and b"\r\n\r\n" not in got and how == "eof",
          "partial_headers: status line + one header, then FIN", got)
    check(stats(port)["documents"] == 3, "partial_headers: document stored")

    t0 = time.monotonic()
    st, _, data = call(port, "POST", "/dms/documents", body, {"Content-Type": MP_TYPE})
    elapsed = time.monotonic() - t0
    check(st == 201 and elapsed >= 0.3, "stall_ms:300: answer after >= 300 ms", (st, elapsed))
    st, _, data = call(port, "POST", "/dms/documents", body, {"Content-Type": MP_TYPE})
    check(st == 201 and data["id"] == "DOC-5", "ok shape then queue empty -> normal", data)

    set_faults(port, {"raw": {"next": ["status:500"]}, "delete": {"next": ["status:503"]},
                      "search": {"next": ["close_before_bytes"]}, "form": {"next": ["status:429"]}})
    st, _, _ = call(port, "PUT", "/dms/raw/x", b"abc", {"Content-Type": "text/plain"})
    check(st == 500 and stats(port)["documents"] == 5, "raw status:500 stores nothing", st)
    st, _, _ = call(port, "DELETE", "/dms/documents/DOC-1")
    check(st == 503 and call(port, "GET", "/dms/documents/DOC-1")[0] == 200,
          "delete status:503 deletes nothing", st)
    check(call(port, "DELETE", "/dms/documents/DOC-1")[0] == 204, "delete after fault -> 204")
    req = b"GET /dms/documents?ref=F HTTP/1.1\r\nHost: t\r\n\r\n"
    check(raw_exchange(port, req) == (b"", "eof"), "search close_before_bytes")
    st, _, _ = call(port, "POST", "/dms/forms", b"a=1",
                    {"Content-Type": "application/x-www-form-urlencoded"})
    check(st == 429 and stats(port)["forms"] == 0, "form status:429 stores nothing", st)
    s = stats(port)
    check(s["documents"] == 4 and s["deletes"] == 1 and s["uploads"] == 5,
          "stats after faults", (s["documents"], s["deletes"], s["uploads"]))
    check(all(not e["path"].startswith("/_target") for e in s["requests"]),
          "control routes are not recorded")


def test_routing(port):
    st, _, _ = call(port, "GET", "/nope")
    check(st == 404, "unknown path -> 404", st)
    st, resp, _ = call(port, "PATCH", "/dms/documents", b"")
    check(st == 405 and resp.getheader("Allow") == "GET, POST", "wrong method -> 405 + Allow",
          (st, resp.getheader("Allow")))
    st, resp, _ = call(port, "GET", "/dms/raw/x")
    check(st == 405 and resp.getheader("Allow") == "PUT", "GET on raw -> 405 Allow: PUT", st)


def test_big_upload(port):
    reset(port)
    content = random.Random(42).randbytes(20 * 1024 * 1024)
    body = multipart(fields=[("ref", "big")],
                     files=[("file", "big.bin", "application/octet-stream", content)])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.monotonic()
    st, _, data = call(port, "POST", "/dms/documents", body, {"Content-Type": MP_TYPE}, conn=conn)
    elapsed = time.monotonic() - t0
    check(st == 201 and data.get("sha256") == sha(content) and data.get("size") == len(content),
          "20 MiB multipart upload hashes correctly (%.2f s)" % elapsed, (st, data))
    st, _, data = call(port, "GET", "/dms/documents?ref=big", conn=conn)
    check(st == 200 and len(data["items"]) == 1, "keep-alive: same connection reused after it")
    conn.close()
    t0 = time.monotonic()
    st, _, data = call(port, "PUT", "/dms/raw/big.bin", content,
                       {"Content-Type": "application/octet-stream"})
    check(st == 201 and data.get("sha256") == sha(content),
          "20 MiB raw PUT hashes correctly (%.2f s)" % (time.monotonic() - t0), (st, data))


def test_limits():
    small = Target("--max-body-mb", "1")
    try:
        port = small.port
        req = (b"PUT /dms/raw/x HTTP/1.1\r\nHost: t\r\nContent-Type: a/b\r\n"
               b"Content-Length: 2097152\r\nExpect: 100-continue\r\n\r\n")
        got, _ = raw_exchange(port, req)
        check(got.startswith(b"HTTP/1.1 413 ") and b"100 Continue" not in got,
              "body over --max-body-mb (Content-Length) -> 413 without 100 Continue", got[:40])

        def chunks():
            for _ in range(32):
                yield b"x" * 65536
        try:
            st, _, data = call(port, "PUT", "/dms/raw/x", chunks(), {"Content-Type": "a/b"})
        except (BrokenPipeError, ConnectionResetError) as exc:
            st, data = None, exc
        check(st == 413, "chunked body over --max-body-mb -> 413", (st, data))
        s = stats(port)
        check(s["documents"] == 0 and s["bad_requests"] == 2, "413s counted as bad requests",
              (s["documents"], s["bad_requests"]))
    finally:
        rc = small.stop()
    check(rc == 0, "second target exits 0 on SIGTERM", rc)


def test_signal_on_a_connection_thread():
    # The kernel may hand a process-directed SIGTERM to the thread serving an
    # idle keep-alive connection rather than to the one in accept().
    target = Target()
    idle = http.client.HTTPConnection("127.0.0.1", target.port, timeout=10)
    rc = "not signalled"
    try:
        idle.request("GET", "/_target/stats")
        idle.getresponse().read()
        if check(signal_a_connection_thread(target.proc, signal.SIGTERM),
                 "an idle keep-alive connection has its own thread"):
            try:
                rc = target.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                rc = None
    finally:
        idle.close()
        if target.proc.poll() is None:
            target.proc.kill()
            target.proc.wait()
    check(rc == 0, "SIGTERM taken by a connection thread still stops the target with 0", rc)


def main():
    t0 = time.monotonic()
    target = Target()
    try:
        for test in (test_multipart, test_multipart_errors, test_chunked_and_continue,
                     test_raw_and_form, test_search_delete, test_faults, test_routing,
                     test_big_upload):
            try:
                test(target.port)
            except Exception as exc:
                check(False, "%s raised" % test.__name__, repr(exc))
        for test in (test_limits, test_signal_on_a_connection_thread):
            try:
                test()
            except Exception as exc:
                check(False, "%s raised" % test.__name__, repr(exc))
    finally:
        rc = target.stop()
    check(rc == 0, "target exits 0 on SIGTERM", rc)
    print("%d failure(s), %.1f s" % (len(failures), time.monotonic() - t0))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
