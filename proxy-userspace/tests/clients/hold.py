#!/usr/bin/env python3
"""A long-lived TCP connection for the takeover tests.

  hold.py serve ADDR PORT            an echo server (one thread a connection)
  hold.py hold HOST PORT SECONDS     connects once, prints "connected PEER",
      then sends a line every 20 ms for SECONDS and reads its echo; prints
      "ok N" (N round trips) and exits 0, or "error WHAT" and exits 1
"""
import socket
import sys
import threading
import time


def serve(addr, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(64)

    def echo(c):
        with c:
            while True:
                data = c.recv(4096)
                if not data:
                    return
                c.sendall(data)

    while True:
        c, _ = s.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()


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
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        hold(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
