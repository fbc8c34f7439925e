#!/usr/bin/env python3
"""A slow HTTP/1.1 endpoint: answers every request after a fixed delay.

Self-contained (standard library, asyncio), sharing no code with Waystone. It
stands in for an ERP that takes seconds to answer, so that a client's behaviour
with thousands of requests waiting at once can be observed from the outside:
how many requests it received, how many were open at the same moment, and how
many times each Idempotency-Key arrived.

Usage:
    python3 slow_target.py [--port 0] [--delay 2.0] [--backlog 8192]

Prints one line ``PORT <n>`` once listening; serves until SIGTERM/SIGINT.

Routes:
    GET /_stats      answers at once: {"received", "open", "max_open",
                     "keys", "duplicate_keys", "answered"}
    anything else    waits --delay seconds, then answers 201 with
                     {"id": "OBJ-<n>"} and closes the connection.
"""

import argparse
import asyncio
import json
import signal
import sys

MAX_HEAD = 64 * 1024
MAX_BODY = 1024 * 1024


class Stats:
    def __init__(self):
        self.received = 0      # requests whose head and body arrived
        self.open = 0          # received, not yet answered
        self.max_open = 0
        self.answered = 0
        self.keys = {}         # Idempotency-Key -> times received

    def as_json(self):
        return {
            "received": self.received,
            "open": self.open,
            "max_open": self.max_open,
            "answered": self.answered,
            "keys": len(self.keys),
            "duplicate_keys": sum(1 for n in self.keys.values() if n > 1),
        }


class SlowProtocol(asyncio.Protocol):
    def __init__(self, stats, delay):
        self.stats = stats
        self.delay = delay
        self.buffer = b""
        self.transport = None
        self.done = False

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        if self.done:
            return
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD:
                self.reply(431, {"error": "head too large"})
            return
        head = self.buffer[:end].decode("latin-1")
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            self.reply(400, {"error": "bad request line"})
            return
        method, target, _ = parts
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                self.reply(400, {"error": "bad header line"})
                return
            headers[name.strip().lower()] = value.strip()
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            self.reply(400, {"error": "bad content-length"})
            return
        if length > MAX_BODY:
            self.reply(413, {"error": "body too large"})
            return
        if len(self.buffer) < end + 4 + length:
            return  # the body is still coming
        self.done = True
        if method == "GET" and target == "/_stats":
            self.reply(200, self.stats.as_json())
            return
        stats = self.stats
        stats.received += 1
        stats.open += 1
        stats.max_open = max(stats.max_open, stats.open)
        key = headers.get("idempotency-key")
        if key is not None:
            stats.keys[key] = stats.keys.get(key, 0) + 1
        number = stats.received
        asyncio.get_running_loop().call_later(self.delay, self.answer, number)

    def answer(self, number):
        self.stats.open -= 1
        self.stats.answered += 1
        self.reply(201, {"id": "OBJ-%d" % number})

    def reply(self, status, document):
        self.done = True
        if self.transport is None or self.transport.is_closing():
            return
        body = json.dumps(document).encode()
        reason = {200: "OK", 201: "Created"}.get(status, "Error")
        head = ("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                "Content-Length: %d\r\nConnection: close\r\n\r\n" % (status, reason, len(body)))
        self.transport.write(head.encode() + body)
        self.transport.close()

    def connection_lost(self, exc):
        self.transport = None


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=2.0)
    parser.add_argument("--backlog", type=int, default=8192)
    args = parser.parse_args()
    stats = Stats()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SlowProtocol(stats, args.delay), args.host,
                                      args.port, backlog=args.backlog)
    port = server.sockets[0].getsockname()[1]
    print("PORT %d" % port, flush=True)
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    await stop
    server.close()
    print(json.dumps(stats.as_json()), file=sys.stderr, flush=True)


if __name__ == "__main__":
    asyncio.run(main())
