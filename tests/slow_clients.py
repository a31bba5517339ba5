#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Slow partial requests against a server on 127.0.0.1 (api_server_test.sh).

    slow_clients.py PORT COUNT EARLY_S SECONDS [READY_FILE]

Opens COUNT connections from 127.0.0.1, sends each a request line, then
one more header line every 0.3 s (never the blank line that ends the
headers), for at most SECONDS.  Prints three counts: the connections the
server closed within EARLY_S seconds (refused at once: over a cap), those
it closed later (a deadline), and those still open at the end.  With
READY_FILE, creates it once every connection has sent its request line
(the test waits for that, not for a time).
"""
import socket
import sys
import time

port, count = int(sys.argv[1]), int(sys.argv[2])
early_s, seconds = float(sys.argv[3]), float(sys.argv[4])
t0 = time.monotonic()
socks = {}
closed = {}
for i in range(count):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setblocking(False)
    socks[i] = s
    try:
        s.sendall(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    except OSError:
        closed[i] = time.monotonic() - t0
if len(sys.argv) > 5:
    open(sys.argv[5], "w").close()
n = 0
while time.monotonic() - t0 < seconds and len(closed) < count:
    for i, s in socks.items():
        if i in closed:
            continue
        gone = False
        try:
            if not s.recv(4096):  # non-blocking: the server closed it
                gone = True
        except BlockingIOError:
            pass  # nothing to read: still open
        except OSError:
            gone = True
        if not gone:
            try:
                s.send(b"X-Trickle-%d: y\r\n" % n)
            except OSError:
                gone = True
        if gone:
            closed[i] = time.monotonic() - t0
    n += 1
    time.sleep(0.3)
early = sum(1 for t in closed.values() if t < early_s)
print(early, len(closed) - early, count - len(closed))
for s in socks.values():
    s.close()
