#!/usr/bin/env python3
"""Self-test of tests/targets/smtp/smtp_target.mjs.

Starts the target with node, and checks it with Python's smtplib (a client that
shares nothing with the target or the engine). Standard library only. Exits
non-zero on failure. The node process is always killed at the end.
"""

import atexit
import base64
import json
import os
import select
import signal
import smtplib
import socket
import subprocess
import sys
import time
import unittest
import urllib.error
import urllib.request
from email.message import EmailMessage

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "smtp_target.mjs")
TIMEOUT = 10  # seconds, every socket
_LIVE = []  # every started target, killed at exit whatever happened


@atexit.register
def _kill_leftovers():
    for proc in _LIVE:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class Target:
    """One running smtp_target.mjs."""

    def __init__(self, *args):
        if not os.path.isdir(os.path.join(HERE, "node_modules", "smtp-server")):
            raise RuntimeError(
                "smtp-server is not installed: run `npm ci` in tests/targets/smtp "
                "(scripts/setup.sh does it)")
        self.proc = subprocess.Popen(
            ["node", SCRIPT, "--host", "127.0.0.1", *args],
            stdout=subprocess.PIPE, stderr=None, cwd=HERE)  # its log goes to our stderr
        _LIVE.append(self.proc)
        try:
            line = self._read_port_line(15)
            if not line.startswith("PORT "):
                raise RuntimeError(f"unexpected first line {line!r}")
            self.port = int(line.split()[1])
            self.smtp_port = self.stats()["smtp_port"]
        except BaseException:
            self.stop()
            raise

    def _read_port_line(self, timeout):
        deadline = time.monotonic() + timeout
        buf = b""
        fd = self.proc.stdout.fileno()
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError("no PORT line from the target in time")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise RuntimeError("target exited before printing PORT (see its stderr above)")
                buf += chunk
        return buf.split(b"\n", 1)[0].decode()

    def stop(self):
        """Stops the target (SIGTERM, then SIGKILL); returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        try:
            self.proc.stdout.close()
        except OSError:
            pass
        return self.proc.returncode

    # control port
    def request(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            payload = e.read()
            e.close()
            return e.code, (json.loads(payload) if payload else None)

    def stats(self):
        status, body = self.request("GET", "/_target/stats")
        assert status == 200, status
        return body

    def faults(self, **kw):
        status, body = self.request("POST", "/_target/faults", kw)
        assert status == 200, (status, body)
        return body

    def reset(self):
        status, body = self.request("POST", "/_target/reset", {})
        assert status == 200, (status, body)

    def smtp(self):
        return smtplib.SMTP("127.0.0.1", self.smtp_port, timeout=TIMEOUT)


def raw_message(mid, subject="hello", body="hi there", to="bob@example.test", extra=""):
    return (f"From: Alice <alice@example.test>\r\nTo: {to}\r\nSubject: {subject}\r\n"
            f"Message-ID: {mid}\r\n{extra}\r\n{body}\r\n")


def send(t, mid, rcpt="bob@example.test", **kw):
    """One message on its own connection."""
    with t.smtp() as s:
        s.sendmail("alice@example.test", [rcpt], raw_message(mid, to=rcpt, **kw).encode())


def expect_cut(testcase, fn):
    """fn must fail because the connection ended without a reply."""
    with testcase.assertRaises((smtplib.SMTPServerDisconnected, ConnectionError, OSError)) as cm:
        fn()
    testcase.assertNotIsInstance(cm.exception, socket.timeout)
    testcase.assertNotIsInstance(cm.exception, smtplib.SMTPResponseException)


class SmtpTargetTest(unittest.TestCase):
    t = None

    @classmethod
    def setUpClass(cls):
        cls.t = Target("--seed", "7")

    @classmethod
    def tearDownClass(cls):
        if cls.t is not None:
            rc = cls.t.stop()
            assert rc == 0, f"target exit status {rc}"

    def setUp(self):
        self.t.reset()

    def test_plain_send(self):
        t = self.t
        with t.smtp() as s:
            code, _ = s.ehlo()
            self.assertEqual(code, 250)
            self.assertFalse(s.has_extn("starttls"), "STARTTLS must be off")
            self.assertTrue(s.has_extn("size"))
            s.sendmail("alice@example.test", ["bob@example.test", "carol@example.test"],
                       raw_message("<plain-1@example.test>",
                                   body="line one\r\n.starts with a dot\r\nlast",
                                   extra="X-Folded: part one\r\n\tpart two\r\n").encode())
        st = t.stats()
        self.assertEqual(st["messages_received"], 1)
        self.assertEqual(st["duplicates"], 0)
        self.assertEqual(st["replies_dropped"], 0)
        self.assertGreaterEqual(st["connections_total"], 1)
        m = st["messages"][0]
        self.assertEqual(m["seq"], 1)
        self.assertEqual(m["message_id"], "<plain-1@example.test>")
        self.assertEqual(m["envelope_from"], "alice@example.test")
        self.assertEqual(m["envelope_to"], ["bob@example.test", "carol@example.test"])
        self.assertEqual(m["from"], "Alice <alice@example.test>")
        self.assertEqual(m["to"], "bob@example.test")
        self.assertEqual(m["subject"], "hello")
        self.assertEqual(m["text"], "line one\n.starts with a dot\nlast")
        self.assertEqual(m["headers"]["x-folded"], "part one\tpart two")
        self.assertEqual(m["headers"]["message-id"], "<plain-1@example.test>")
        self.assertEqual(m["shape"], "ok")
        self.assertEqual(st["by_recipient"], {"bob@example.test": {"<plain-1@example.test>": 1},
                                              "carol@example.test": {"<plain-1@example.test>": 1}})

    def test_utf8_base64_and_rfc2047(self):
        t = self.t
        text = "こんにちは、世界。\n受注 SO-42 を承認しました。"
        subj = "承認のお知らせ"
        b64_body = base64.encodebytes(text.encode()).decode().replace("\n", "\r\n")
        b_subject = "=?UTF-8?B?" + base64.b64encode(subj.encode()).decode() + "?="
        extra = ("MIME-Version: 1.0\r\nContent-Type: text/plain; charset=UTF-8\r\n"
                 "Content-Transfer-Encoding: base64\r\n")
        send(t, "<jp-1@example.test>", subject=b_subject, body=b64_body, extra=extra)
        # Q encoding, split across two words in the middle of a character
        raw = subj.encode()
        q1 = "".join(f"={b:02X}" for b in raw[:4])
        q2 = "".join(f"={b:02X}" for b in raw[4:])
        qp_body = "caf=C3=A9 au lait, a long line that is=\r\n continued=20\r\nend"
        extra = ("Content-Type: text/plain; charset=\"utf-8\"\r\n"
                 "Content-Transfer-Encoding: quoted-printable\r\n")
        send(t, "<jp-2@example.test>", subject=f"Re: =?UTF-8?Q?{q1}?=\r\n =?UTF-8?Q?{q2}?= _x_",
             body=qp_body, extra=extra)
        # the way Python's email package writes it (lower-case charset, its own folding)
        msg = EmailMessage()
        msg["From"] = "山田 <yamada@example.test>"
        msg["To"] = "bob@example.test"
        msg["Subject"] = subj * 6
        msg["Message-ID"] = "<jp-3@example.test>"
        msg.set_content(text, charset="utf-8", cte="base64")
        with t.smtp() as s:
            s.send_message(msg)
        st = t.stats()
        self.assertEqual(st["messages_received"], 3)
        m1, m2, m3 = st["messages"]
        self.assertEqual(m1["subject"], subj)
        self.assertEqual(m1["text"], text)
        self.assertEqual(m1["message_id"], "<jp-1@example.test>")
        self.assertEqual(m2["subject"], f"Re: {subj} _x_")
        self.assertEqual(m2["text"], "café au lait, a long line that is continued \nend")
        self.assertEqual(m3["subject"], subj * 6)
        self.assertEqual(m3["text"], text)
        self.assertEqual(m3["from"], "山田 <yamada@example.test>")
        self.assertEqual(m3["message_id"], "<jp-3@example.test>")

    def test_duplicate_message_id(self):
        t = self.t
        send(t, "<dup@example.test>")
        send(t, "<dup@example.test>")
        send(t, "<dup@example.test>", rcpt="other@example.test")  # another mailbox: not a duplicate
        send(t, "<other@example.test>")
        st = t.stats()
        self.assertEqual(st["messages_received"], 4)
        self.assertEqual(st["duplicates"], 1)
        self.assertEqual(st["by_recipient"]["bob@example.test"],
                         {"<dup@example.test>": 2, "<other@example.test>": 1})
        self.assertEqual(st["by_recipient"]["other@example.test"], {"<dup@example.test>": 1})

    def test_accept_then_close_and_reset(self):
        t = self.t
        self.assertEqual(t.faults(next=["accept_then_close", "accept_then_reset"])["next"],
                         ["accept_then_close", "accept_then_reset"])
        expect_cut(self, lambda: send(t, "<cut-1@example.test>"))
        expect_cut(self, lambda: send(t, "<cut-2@example.test>"))
        send(t, "<cut-3@example.test>")  # queue empty again: ok
        st = t.stats()
        self.assertEqual(st["messages_received"], 3)
        self.assertEqual(st["replies_dropped"], 2)
        self.assertEqual([m["message_id"] for m in st["messages"]],
                         ["<cut-1@example.test>", "<cut-2@example.test>", "<cut-3@example.test>"])
        self.assertEqual([m["shape"] for m in st["messages"]],
                         ["accept_then_close", "accept_then_reset", "ok"])
        self.assertEqual(t.faults()["next"], [])

    def _raw_transaction(self, mid):
        """EHLO/MAIL/RCPT/DATA and the message on a raw socket; returns (socket, file)."""
        sock = socket.create_connection(("127.0.0.1", self.t.smtp_port), timeout=TIMEOUT)
        f = sock.makefile("rb")

        def reply():
            lines = []
            while True:
                line = f.readline()
                lines.append(line)
                if len(line) < 4 or line[3:4] != b"-":
                    return lines

        self.assertTrue(reply()[0].startswith(b"220"))
        for cmd, code in ((b"EHLO x", b"250"), (b"MAIL FROM:<a@x.test>", b"250"),
                          (b"RCPT TO:<b@y.test>", b"250"), (b"DATA", b"354")):
            sock.sendall(cmd + b"\r\n")
            self.assertTrue(reply()[-1].startswith(code), cmd)
        sock.sendall(raw_message(mid).encode() + b".\r\n")
        return sock, f

    def test_cut_on_the_wire(self):
        # after the terminating dot, accept_then_close gives end-of-stream (FIN) with no
        # reply byte, and accept_then_reset gives ECONNRESET (RST)
        t = self.t
        t.faults(next=["accept_then_close", "accept_then_reset"])
        sock, f = self._raw_transaction("<fin@example.test>")
        with sock, f:
            self.assertEqual(f.read(), b"")
        sock, f = self._raw_transaction("<rst@example.test>")
        with sock, f:
            with self.assertRaises(ConnectionResetError):
                data = f.read()
                self.fail(f"read {data!r} instead of a reset")
        st = t.stats()
        self.assertEqual(st["replies_dropped"], 2)
        self.assertEqual([m["message_id"] for m in st["messages"]],
                         ["<fin@example.test>", "<rst@example.test>"])

    def test_accept_then_stall(self):
        t = self.t
        t.faults(next=["accept_then_stall"], stall_ms=400)
        start = time.monotonic()
        expect_cut(self, lambda: send(t, "<stall@example.test>"))
        elapsed = time.monotonic() - start
        self.assertGreaterEqual(elapsed, 0.35)
        self.assertLess(elapsed, 5)
        st = t.stats()
        self.assertEqual(st["messages_received"], 1)
        self.assertEqual(st["replies_dropped"], 1)

    def test_accept_then_wait(self):
        t = self.t
        t.faults(next=["accept_then_wait"], stall_ms=400)
        start = time.monotonic()
        send(t, "<wait@example.test>")  # answered 250, late
        elapsed = time.monotonic() - start
        self.assertGreaterEqual(elapsed, 0.35)
        self.assertLess(elapsed, 5)
        st = t.stats()
        self.assertEqual(st["messages_received"], 1)
        self.assertEqual(st["replies_dropped"], 0)

    def test_rejects(self):
        t = self.t
        t.faults(next=["reject_451", "reject_550"])
        for code, enhanced in ((451, b"4.3.0"), (550, b"5.7.1")):
            with self.assertRaises(smtplib.SMTPDataError) as cm:
                send(t, f"<rej-{code}@example.test>")
            self.assertEqual(cm.exception.smtp_code, code)
            self.assertTrue(cm.exception.smtp_error.startswith(enhanced), cm.exception.smtp_error)
        st = t.stats()
        self.assertEqual(st["messages_received"], 0)
        self.assertEqual(st["messages"], [])
        self.assertEqual(st["rejected"], 2)
        self.assertEqual(st["replies_dropped"], 0)
        # the connection stays usable after a rejection
        t.faults(next=["reject_451"])
        with t.smtp() as s:
            with self.assertRaises(smtplib.SMTPDataError):
                s.sendmail("a@x.test", ["b@y.test"], raw_message("<r1@x>").encode())
            s.sendmail("a@x.test", ["b@y.test"], raw_message("<r2@x>").encode())
        self.assertEqual([m["message_id"] for m in t.stats()["messages"]], ["<r2@x>"])

    def test_close_at_mail(self):
        t = self.t
        t.faults(next=["close_at_mail", "reject_550"])
        with t.smtp() as s:
            s.ehlo()
            with self.assertRaises(smtplib.SMTPServerDisconnected):
                s.mail("alice@example.test")
        st = t.stats()
        self.assertEqual(st["messages_received"], 0)
        self.assertEqual(t.faults()["next"], ["reject_550"])

    def test_close_at_mail_waits_for_mail(self):
        t = self.t
        with t.smtp() as s:
            s.ehlo()
            s.mail("alice@example.test")
            s.rcpt("bob@example.test")
            t.faults(next=["close_at_mail"])  # set while this transaction is under way
            code, _ = s.data(raw_message("<mid-tx@example.test>").encode())
            self.assertEqual(code, 250)  # DATA does not take it
            self.assertEqual(t.faults()["next"], ["close_at_mail"])
            with self.assertRaises(smtplib.SMTPServerDisconnected):
                s.mail("alice@example.test")
        st = t.stats()
        self.assertEqual(st["messages_received"], 1)
        self.assertEqual(t.faults()["next"], [])

    def test_drop_percent_reproducible(self):
        t = self.t

        def run():
            t.reset()
            t.faults(drop_percent=30)
            pattern = []
            s = None
            try:
                for i in range(40):
                    if s is None:
                        s = t.smtp()
                    try:
                        s.sendmail("alice@example.test", ["bob@example.test"],
                                   raw_message(f"<drop-{i}@example.test>").encode())
                        pattern.append(0)
                    except (smtplib.SMTPServerDisconnected, ConnectionError):
                        pattern.append(1)
                        s.close()
                        s = None
            finally:
                if s is not None:
                    s.quit()
            return pattern, t.stats()

        p1, st = run()
        dropped = sum(p1)
        print(f"\n  drop_percent=30, seed 7: {dropped} of 40 replies dropped", file=sys.stderr)
        self.assertTrue(4 <= dropped <= 22, f"dropped {dropped} of 40")
        self.assertEqual(st["messages_received"], 40)
        self.assertEqual(st["replies_dropped"], dropped)
        self.assertEqual(st["duplicates"], 0)
        self.assertEqual([m["message_id"] for m in st["messages"]],
                         [f"<drop-{i}@example.test>" for i in range(40)])
        shapes = [1 if m["shape"] == "accept_then_close" else 0 for m in st["messages"]]
        self.assertEqual(shapes, p1)
        p2, _ = run()  # reset re-seeds: the same draws again
        self.assertEqual(p1, p2)

    def test_size_limit(self):
        t = self.t
        big = ("x" * 998 + "\r\n") * 1100  # ~1.1 MB
        msg = raw_message("<big@x>", body=big).encode()
        with t.smtp() as s:
            # smtplib declares SIZE=... in MAIL FROM: refused there
            with self.assertRaises(smtplib.SMTPSenderRefused) as cm:
                s.sendmail("a@x.test", ["b@y.test"], msg)
            self.assertEqual(cm.exception.smtp_code, 552)
        with t.smtp() as s:
            # no SIZE declared: the message goes through DATA and is refused at the end
            s.ehlo()
            self.assertEqual(s.mail("a@x.test")[0], 250)
            self.assertEqual(s.rcpt("b@y.test")[0], 250)
            self.assertEqual(s.data(msg)[0], 552)
            s.sendmail("a@x.test", ["b@y.test"], raw_message("<small@x>").encode())  # still usable
        st = t.stats()
        self.assertEqual(st["messages_received"], 1)
        self.assertEqual(st["messages"][0]["message_id"], "<small@x>")
        self.assertEqual(st["too_large"], 1)

    def test_auth_without_password(self):
        t = self.t
        with t.smtp() as s:
            s.ehlo()
            self.assertIn("PLAIN", s.esmtp_features.get("auth", "").upper())
            code, _ = s.login("anyone", "anything")
            self.assertEqual(code, 235)
            s.sendmail("a@x.test", ["b@y.test"], raw_message("<auth@x>").encode())
        self.assertEqual(t.stats()["messages"][0]["auth_user"], "anyone")
        # AUTH is optional
        send(t, "<noauth@x>")
        self.assertIsNone(t.stats()["messages"][1]["auth_user"])

    def test_control_routes(self):
        t = self.t
        self.assertEqual(t.request("GET", "/_target/nope")[0], 404)
        self.assertEqual(t.request("GET", "/elsewhere")[0], 404)
        self.assertEqual(t.request("POST", "/_target/stats", {})[0], 405)
        self.assertEqual(t.request("GET", "/_target/reset")[0], 405)
        self.assertEqual(t.request("DELETE", "/_target/faults")[0], 405)
        before = t.request("GET", "/_target/faults")[1]
        self.assertEqual(before, {"next": [], "drop_percent": 0, "stall_ms": 5000})
        for bad in ({"next": ["nope"]}, {"next": "ok"}, {"drop_percent": 101},
                    {"drop_percent": "5"}, {"stall_ms": -1}, {"stall_ms": 1.5}, {"other": 1}, [1]):
            status, _ = t.request("POST", "/_target/faults", bad)
            self.assertEqual(status, 400, bad)
        self.assertEqual(t.request("GET", "/_target/faults")[1], before)
        self.assertEqual(t.faults(next=["ok", "close_at_mail"], drop_percent=12.5, stall_ms=10),
                         {"next": ["ok", "close_at_mail"], "drop_percent": 12.5, "stall_ms": 10})
        self.assertEqual(t.faults(next=["reject_550"])["next"], ["reject_550"])  # replaces

    def test_reset_clears(self):
        t = self.t
        send(t, "<r@x>")
        send(t, "<r@x>")
        t.faults(next=["reject_451"], drop_percent=50, stall_ms=1)
        t.reset()
        st = t.stats()
        for key in ("connections_total", "messages_received", "replies_dropped", "rejected", "duplicates"):
            self.assertEqual(st[key], 0, key)
        self.assertEqual(st["messages"], [])
        self.assertEqual(st["by_recipient"], {})
        self.assertEqual(t.request("GET", "/_target/faults")[1],
                         {"next": [], "drop_percent": 0, "stall_ms": 5000})
        send(t, "<r@x>")
        st = t.stats()
        self.assertEqual(st["messages"][0]["seq"], 1)
        self.assertEqual(st["duplicates"], 0)


class PasswordModeTest(unittest.TestCase):
    def test_password(self):
        t = Target("--password", "s3cret")
        try:
            for mech in ("PLAIN", "LOGIN"):
                with t.smtp() as s:
                    s.ehlo()
                    s.user, s.password = "user", "wrong"
                    authobject = s.auth_plain if mech == "PLAIN" else s.auth_login
                    with self.assertRaises(smtplib.SMTPAuthenticationError) as cm:
                        s.auth(mech, authobject)
                    self.assertEqual(cm.exception.smtp_code, 535, mech)
                    # no authentication, and none is needed: the session goes on
                    s.sendmail("a@x.test", ["b@y.test"], raw_message(f"<anon-{mech}@x>").encode())
            with t.smtp() as s:
                s.ehlo()
                s.user, s.password = "user", "s3cret"
                code, _ = s.auth("LOGIN", s.auth_login)
                self.assertEqual(code, 235)
            with t.smtp() as s:
                s.ehlo()
                code, _ = s.login("someone", "s3cret")
                self.assertEqual(code, 235)
                s.sendmail("a@x.test", ["b@y.test"], raw_message("<pw@x>").encode())
            st = t.stats()
            self.assertEqual(st["auth_failures"], 2)
            self.assertEqual(st["messages_received"], 3)
            self.assertEqual([m["auth_user"] for m in st["messages"]], [None, None, "someone"])
        finally:
            self.assertEqual(t.stop(), 0)


if __name__ == "__main__":
    prog = unittest.main(exit=False, verbosity=2)
    sys.exit(0 if prog.result.wasSuccessful() else 1)
