#!/usr/bin/env python3
"""Approvers deciding at the same moment, as independent HTTP clients.

Standard library only (urllib, threads); shares no code with Waystone. Each
decision is one POST of a JSON body with its own bearer token; all of them wait
at a barrier and go together. Prints one JSON list: per decision, in the order
given, the HTTP status, the Content-Type and the parsed body.

  approvers.py URL PATH TOKEN=BODY_JSON [TOKEN=BODY_JSON ...]
"""
import json
import sys
import threading
import urllib.error
import urllib.request


def decide(url, token, body, barrier, out, i):
    request = urllib.request.Request(
        url, data=body.encode(), method="POST",
        headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    barrier.wait()
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, ctype, text = response.status, response.headers.get("Content-Type"), response.read()
    except urllib.error.HTTPError as error:
        status, ctype, text = error.code, error.headers.get("Content-Type"), error.read()
    except OSError as error:  # no answer at all (the server was killed)
        out[i] = {"status": 0, "error": str(error)}
        return
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text.decode(errors="replace")
    out[i] = {"status": status, "content_type": ctype, "body": parsed}


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    url = sys.argv[1].rstrip("/") + sys.argv[2]
    decisions = [arg.split("=", 1) for arg in sys.argv[3:]]
    barrier = threading.Barrier(len(decisions))
    out = [None] * len(decisions)
    threads = [threading.Thread(target=decide, args=(url, token, body, barrier, out, i))
               for i, (token, body) in enumerate(decisions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
