#!/usr/bin/env python3
"""`POST /v1/instances` with `Prefer: wait` from a client that is not ours.

Python's own http.client talks to a real `waystone serve` (SQLite, real workers)
whose workflow (tests/fixtures/target-order.yaml) calls tests/targets/erp_target.py.
The target commits each order and then loses the answer in the ways real servers
do; the caller waits for the outcome in one request and must get the ERP's order
number, and the target must hold exactly one order per business key. Then the
same CloudEvent is sent over four connections at once to instances waiting for it:
every copy is answered, one signals, and the target receives one message per
instance. Counts are what the target received.

  python3 tests/integration/prefer_wait_check.py --waystone build/apps/waystone

Prints PASS/FAIL per check; exits 0 only when every check passed.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
failures = []


def check(name, condition, detail=""):
    print(("PASS " if condition else "FAIL ") + name + ("" if condition else ": " + detail),
          flush=True)
    if not condition:
        failures.append(name)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def call(port, method, path, body=None, headers=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers=headers or {})
        response = conn.getresponse()
        text = response.read().decode()
        return response.status, dict(response.getheaders()), text
    finally:
        conn.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--waystone", required=True)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="prefer-wait-")
    target = server = None
    try:
        target = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests/targets/erp_target.py"), "--port", "0"],
            stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, "target.err"), "wb"))
        line = target.stdout.readline().decode()
        match = re.match(r"PORT (\d+)", line)
        if not match:
            raise RuntimeError("erp_target did not start: " + line)
        target_port = int(match.group(1))
        target_url = "http://127.0.0.1:%d" % target_port

        def stats():
            return json.loads(call(target_port, "GET", "/_target/stats")[2])

        def faults(document):
            status, _, text = call(target_port, "POST", "/_target/faults", document,
                                   {"Content-Type": "application/json"})
            if status != 200:
                raise RuntimeError("faults refused: " + text)

        defs = os.path.join(tmp, "defs")
        os.makedirs(defs)
        shutil.copy(os.path.join(ROOT, "tests/fixtures/target-order.yaml"), defs)
        with open(os.path.join(defs, "gate.yaml"), "w") as f:
            f.write('workflow: gate\nkey: "{{input.id}}"\nsteps:\n'
                    '  - name: approval\n    wait: { event: com.acme.approved }\n'
                    '  - name: notify\n    idempotency: { honored: true }\n'
                    '    request:\n      method: POST\n'
                    '      url: "{{env.TARGET_URL}}/notify/messages"\n'
                    '      body: { to: sales, text: "approved {{input.id}}" }\n')
        db = os.path.join(tmp, "w.db")
        config = os.path.join(tmp, "waystone.yaml")
        with open(config, "w") as f:
            f.write("database: %s\nworkers: 4\ndefinitions: %s\n"
                    "api:\n  handler_threads: 32\n"
                    "events:\n  - type: com.acme.approved\n    signal: { key: /order }\n"
                    % (db, defs))
        env = {k: v for k, v in os.environ.items() if not k.startswith("WAYSTONE_")}
        env["TARGET_URL"] = target_url
        made = subprocess.run([args.waystone, "token", "create", "--db", db, "--tenant",
                               "default", "--role", "operator", "--name", "caller"],
                              capture_output=True, env=env, timeout=60)
        tokens = re.findall(r"wst_[A-Za-z0-9_\-]+", made.stdout.decode())
        if made.returncode != 0 or not tokens:
            raise RuntimeError("token create failed: " + made.stderr.decode())
        token = tokens[-1]
        port = free_port()
        server = subprocess.Popen(
            [args.waystone, "serve", "--config", config, "--listen", "127.0.0.1:%d" % port],
            stdout=open(os.path.join(tmp, "server.out"), "wb"),
            stderr=open(os.path.join(tmp, "server.err"), "wb"), env=env)
        deadline = time.monotonic() + 30
        while True:
            try:
                if call(port, "GET", "/healthz", timeout=1)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("server did not start: " +
                                   open(os.path.join(tmp, "server.err")).read()[-2000:])
            time.sleep(0.1)
        headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json",
                   "Prefer": "wait=30"}

        def start(order_id):
            body = {"workflow": "target-order",
                    "input": {"order_id": order_id, "customer": "U-1", "amount": 5}}
            return call(port, "POST", "/v1/instances", body, headers)

        def order_number(text):
            document = json.loads(text)
            for step in document.get("steps", []):
                if step.get("name") == "create-order":
                    return document.get("state"), step.get("external_id")
            return document.get("state"), None

        # 1. The create's answer is lost after the order was committed, in each way.
        for shape in ("close_before_bytes", "reset", "partial_headers", "late"):
            faults({"create_order": {"next": [shape], "delay_ms": 1500}})
            before = stats()
            status, response_headers, text = start("w-" + shape)
            after = stats()
            state, external_id = order_number(text)
            check("%s: one request answers with the outcome" % shape,
                  status == 201 and state == "completed" and
                  response_headers.get("Preference-Applied") == "wait=30",
                  "%d %s %s" % (status, response_headers.get("Preference-Applied"), text[:300]))
            ref = "default:crm:w-" + shape
            check("%s: the answer carries the ERP's order number" % shape,
                  bool(external_id) and external_id.startswith("ORD-"), str(external_id))
            check("%s: one order at the target" % shape,
                  after["orders_by_ref"].get(ref) == 1 and
                  after["duplicate_orders"] == before["duplicate_orders"], json.dumps(after)[:400])

        # 2. The same start again, waiting again: the same instance, no second order.
        status, _, text = start("w-reset")
        check("the same start again answers 200 with the same outcome",
              status == 200 and order_number(text)[0] == "completed", "%d %s" % (status, text[:200]))
        check("the same start again makes no order", stats()["orders_by_ref"].get(
            "default:crm:w-reset") == 1)

        # 3. Sixteen callers at once, every create's answer lost once.
        faults({"create_order": {"rate": 0.5, "shape": "close_before_bytes"}})
        results = {}

        def caller(n):
            results[n] = start("c-%d" % n)

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        faults({})
        done = [n for n, (status, _, text) in results.items()
                if status == 201 and order_number(text)[0] == "completed"]
        check("sixteen waiting callers each get their completed instance", len(done) == 16,
              "completed: %s" % sorted(done))
        final = stats()
        refs = ["default:crm:c-%d" % n for n in range(16)]
        check("sixteen callers, sixteen orders, none twice",
              all(final["orders_by_ref"].get(ref) == 1 for ref in refs) and
              final["duplicate_orders"] == 0, json.dumps(final["orders_by_ref"])[:600])

        # 4. The same event over four connections at once (a sender that retries before
        # its first try is answered), to instances waiting for it.
        gates = ["g-%d" % n for n in range(8)]
        for gate in gates:
            status, _, text = call(port, "POST", "/v1/instances",
                                   {"workflow": "gate", "input": {"id": gate}},
                                   {"Authorization": "Bearer " + token,
                                    "Content-Type": "application/json"})
            check("gate %s starts" % gate, status == 201, "%d %s" % (status, text[:200]))
        for gate in gates:  # each waits for its event
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                view = json.loads(call(port, "GET", "/v1/instances/" + gate, None,
                                       {"Authorization": "Bearer " + token})[2])
                if any(step.get("name") == "approval" and step.get("state") == "waiting"
                       for step in view.get("steps", [])):
                    break
                time.sleep(0.05)
        for gate in gates:
            answers = []

            def send(gate=gate, answers=answers):
                answers.append(call(port, "POST", "/v1/events", {"order": gate}, {
                    "Authorization": "Bearer " + token, "Content-Type": "application/json",
                    "ce-specversion": "1.0", "ce-id": "ap-" + gate, "ce-source": "/approvals",
                    "ce-type": "com.acme.approved"}))

            senders = [threading.Thread(target=send) for _ in range(4)]
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join()
            outcomes = sorted(json.loads(text)["results"][0]["outcome"]
                              if status == 200 else "%d %s" % (status, text[:200])
                              for status, _, text in answers)
            check("%s: four copies at once, one signals, three are duplicates" % gate,
                  outcomes == ["duplicate", "duplicate", "duplicate", "signalled"],
                  str(outcomes))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [json.loads(call(port, "GET", "/v1/instances/" + gate, None,
                                      {"Authorization": "Bearer " + token})[2]).get("state")
                      for gate in gates]
            if all(state == "completed" for state in states):
                break
            time.sleep(0.1)
        check("every gate completed", all(state == "completed" for state in states), str(states))
        sent = {m["text"]: m["count"] for m in stats()["messages_by_content"]}
        check("the target received one message per gate",
              all(sent.get("approved " + gate) == 1 for gate in gates), json.dumps(sent)[:600])
    finally:
        for process in (server, target):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
        if failures:
            print("kept " + tmp, flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
