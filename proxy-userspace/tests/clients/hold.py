#!/usr/bin/env python3
"""A long-lived TCP connection for the takeover tests (the echo server is
probe.py's tcp-echo-server).

  hold.py hold HOST PORT SECONDS     connects once, prints "connected PEER",
      then sends a line every 20 ms for SECONDS and reads its echo; prints
      "ok N" (N round trips) and exits 0, or "error WHAT" and exits 1
"""
import socket
import sys
import time


def hold(host, port, seconds):
    s = socket.create_connection((host, port), timeout=3)
    print("connected %s:%d" % s.getpeername(), flush=True)
    n, end = 0, time.monotonic() + seconds
    f = s.makefile("rb")
    while time.monotonic() < end:
        line = b"%d\n" % n
        try:
            s.sendall(line)
            got = f.readline()
        except OSError as e:
            print("error %s after %d at %.3f" % (e, n, time.time()), flush=True)
            sys.exit(1)
        if got != line:
            print("error got %r for %r" % (got, line), flush=True)
            sys.exit(1)
        n += 1
        time.sleep(0.02)
    print("ok %d" % n, flush=True)


if __name__ == "__main__":
    hold(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
