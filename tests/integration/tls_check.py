#!/usr/bin/env python3
"""`waystone serve` over HTTPS, checked by a client that is not ours.

The test makes its own CA and a server certificate for 127.0.0.1 with the openssl
command, serves with --tls-cert/--tls-key, and Python's ssl + http.client, which
trust that CA only, fetch /readyz and an authenticated /v1/me. Plain HTTP to the
TLS port gets no HTTP answer; a client without the CA refuses the server; a bad,
unreadable or mismatched certificate or key stops the server at start, naming
the file.

  python3 tests/integration/tls_check.py --waystone build/apps/waystone

Prints PASS/FAIL per check; exits 0 only when every check passed.
"""
import argparse
import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import time

failures = []


def check(name, condition, detail=""):
    print(("PASS " if condition else "FAIL ") + name + ("" if condition else ": " + detail),
          flush=True)
    if not condition:
        failures.append(name)


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(folder):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "2", "-subj", "/CN=Waystone test CA", cwd=folder)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
            "server.csr", "-subj", "/CN=127.0.0.1", cwd=folder)
    with open(os.path.join(folder, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext",
            cwd=folder)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out",
            "other.csr", "-subj", "/CN=other", cwd=folder)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--waystone", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        make_pki(work)
        db = os.path.join(work, "w.db")
        created = subprocess.run([args.waystone, "token", "create", "--db", db, "--tenant",
                                  "default", "--role", "viewer", "--name", "tls-viewer"],
                                 capture_output=True, text=True, check=True)
        token = re.search(r"wst_[0-9a-f]{64}", created.stdout).group(0)
        port = free_port()
        serve = [args.waystone, "serve", "--api-only", "--db", db, "--listen",
                 f"127.0.0.1:{port}"]
        cert, key = os.path.join(work, "server.pem"), os.path.join(work, "server.key")

        # Bad certificates and keys fail at start, naming the file.
        garbage = os.path.join(work, "garbage.pem")
        with open(garbage, "w") as f:
            f.write("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
        missing = os.path.join(work, "missing.key")
        for what, cert_file, key_file, named in [
                ("a garbage certificate", garbage, key, garbage),
                ("a missing key", cert, missing, missing),
                ("a key of another certificate", cert, os.path.join(work, "other.key"),
                 os.path.join(work, "other.key"))]:
            bad = subprocess.run(serve + ["--tls-cert", cert_file, "--tls-key", key_file],
                                 capture_output=True, text=True, timeout=30)
            check(f"{what} stops the server, naming {os.path.basename(named)}",
                  bad.returncode != 0 and named in bad.stderr,
                  f"exit {bad.returncode}: {bad.stderr[-400:]}")

        # The running server takes its certificate from a config, with HSTS on.
        config = os.path.join(work, "server.yaml")
        with open(config, "w") as f:
            f.write(f"tls:\n  cert_file: {cert}\n  key_file: {key}\n  hsts_max_age: 31536000\n")
        server = subprocess.Popen(serve + ["--config", config],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline()
            check("the server says it serves https", line.startswith("api on https://"), line)
            trusted = ssl.create_default_context(cafile=os.path.join(work, "ca.pem"))

            def get(path, bearer=None):
                conn = http.client.HTTPSConnection("127.0.0.1", port, context=trusted, timeout=10)
                conn.request("GET", path, headers={"Authorization": f"Bearer {bearer}"} if bearer else {})
                response = conn.getresponse()
                body = response.read()
                conn.close()
                get.headers = response.headers
                return response.status, body

            deadline = time.time() + 30
            status = None
            while time.time() < deadline:
                try:
                    status, _ = get("/readyz")
                    if status == 200:
                        break
                except OSError:
                    time.sleep(0.2)
            check("/readyz over TLS, verified against the test's CA", status == 200, str(status))
            status, body = get("/v1/me", token)
            me = json.loads(body) if status == 200 else {}
            check("an authenticated /v1/me over TLS", me.get("token") == "tls-viewer",
                  f"{status} {body[:200]!r}")
            check("Strict-Transport-Security as configured (tls.hsts_max_age)",
                  get.headers.get("Strict-Transport-Security") == "max-age=31536000",
                  str(get.headers.get("Strict-Transport-Security")))
            status, _ = get("/v1/me")
            check("no token over TLS is still 401", status == 401, str(status))

            # TLS 1.2 without forward secrecy or with CBC: refused at the handshake.
            for suite in ("AES128-GCM-SHA256", "AES256-SHA", "ECDHE-RSA-AES128-SHA",
                          "ECDHE-RSA-AES256-SHA384"):
                weak = ssl.create_default_context(cafile=os.path.join(work, "ca.pem"))
                weak.maximum_version = ssl.TLSVersion.TLSv1_2
                try:
                    weak.set_ciphers(suite + ":@SECLEVEL=0")
                except ssl.SSLError:
                    continue  # this OpenSSL no longer offers it at all
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                        with weak.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                            accepted = tls.cipher()
                    check(f"TLS 1.2 with {suite} is refused", False, f"negotiated {accepted}")
                except ssl.SSLError:
                    check(f"TLS 1.2 with {suite} is refused", True)
            strong = ssl.create_default_context(cafile=os.path.join(work, "ca.pem"))
            strong.maximum_version = ssl.TLSVersion.TLSv1_2
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                with strong.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    negotiated = tls.cipher()[0]
            check("TLS 1.2 negotiates an ECDHE AEAD suite",
                  negotiated.startswith("ECDHE-") and ("GCM" in negotiated or "CHACHA" in negotiated),
                  negotiated)

            # A client that does not trust the CA refuses the server.
            try:
                conn = http.client.HTTPSConnection("127.0.0.1", port,
                                                   context=ssl.create_default_context(), timeout=10)
                conn.request("GET", "/readyz")
                conn.getresponse()
                check("a client without the CA refuses the certificate", False, "it was accepted")
            except ssl.SSLCertVerificationError:
                check("a client without the CA refuses the certificate", True)

            # Plain HTTP to the TLS port: no HTTP answer, the connection is closed.
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                raw.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
                received = b""
                try:
                    while True:
                        chunk = raw.recv(4096)
                        if not chunk:
                            break
                        received += chunk
                except (ConnectionResetError, socket.timeout):
                    pass
            check("plain HTTP to the TLS port gets no HTTP answer", b"HTTP/" not in received,
                  repr(received[:200]))
        finally:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
    print("ok" if not failures else f"{len(failures)} failed: {failures}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
