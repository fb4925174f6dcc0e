#!/usr/bin/env python3
"""Socket probes for the kernel tests: plain sockets and syscalls, printing
what the application sees (reply sources, getpeername()).

  probe.py udp-sendto HOST PORT N [INTERVAL [SRCPORT [SIZE]]]
      unconnected: sendto + recvfrom (from SRCPORT when given, SRCPORT 0:
      any; each datagram padded to SIZE bytes when given)
  probe.py udp-connect HOST PORT N            connect, getpeername, send + recvfrom
  probe.py tcp-peer HOST PORT                 connect, getpeername
  probe.py udp-connect-loop HOST PORT N INTERVAL
      a connected socket sending N datagrams; after an error it prints
      "error ERRNO UNIXTIME", connects a new socket and goes on
  probe.py tcp-echo-server HOST PORT          echoes every connection's bytes;
      prints "listening" once it listens
  probe.py tcp-hold HOST PORT N INTERVAL      one connection: N lines sent,
      each echo checked ("echo pingI"), INTERVAL seconds apart
  probe.py mesh-proxy HOST PORT MARK          a sidecar as Istio's: takes the
      connections iptables REDIRECTs to HOST:PORT, prints "original DST" (its
      SO_ORIGINAL_DST) for each, connects to DST with SO_MARK MARK (which
      the REDIRECT rule skips) and relays both ways; prints "listening"
  probe.py open-many KIND HOST PORT N         N sockets of KIND (tcp: connected;
      udp-connect: connected, one datagram answered; udp-sendto: one
      datagram sent and answered each), kept open: prints "open N", then
      closes them all when standard input ends

Each reply prints as "PAYLOAD SOURCE"; a failing call prints "error ERRNO"
and exits 1.
"""
import errno
import socket
import sys
import time


def family(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def show(addr):
    """host:port, with brackets for IPv6."""
    host, port = addr[0], addr[1]
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


def fail(e):
    name = "timeout" if isinstance(e, socket.timeout) else errno.errorcode.get(e.errno, str(e.errno))
    print("error", name, flush=True)
    sys.exit(1)


def udp(mode, host, port, n, interval, srcport=None, size=None):
    s = socket.socket(family(host), socket.SOCK_DGRAM)
    s.settimeout(2)
    if srcport:
        s.bind(("::" if ":" in host else "0.0.0.0", srcport))
    try:
        if mode == "udp-connect":
            s.connect((host, port))
            print("peer", show(s.getpeername()), flush=True)
        for i in range(n):
            msg = b"ping%d" % i
            if size is not None:
                msg = msg.ljust(size, b".")
            if mode == "udp-connect":
                s.send(msg)
            else:
                s.sendto(msg, (host, port))
            data, src = s.recvfrom(2048)
            print(data.decode(), show(src), flush=True)
            time.sleep(interval)
    except OSError as e:
        fail(e)


def udp_connect_loop(host, port, n, interval):
    def connect():
        s = socket.socket(family(host), socket.SOCK_DGRAM)
        s.settimeout(1)
        s.connect((host, port))
        return s

    s = connect()
    for i in range(n):
        try:
            s.send(b"ping%d" % i)
            data, src = s.recvfrom(2048)
            print(data.decode(), show(src), flush=True)
        except OSError as e:
            name = "timeout" if isinstance(e, socket.timeout) else errno.errorcode.get(e.errno, str(e.errno))
            print("error", name, "%.3f" % time.time(), flush=True)
            s.close()
            s = connect()
        time.sleep(interval)


def tcp_peer(host, port):
    try:
        s = socket.socket(family(host), socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect((host, port))
        print("peer", show(s.getpeername()), flush=True)
    except OSError as e:
        fail(e)


def tcp_echo_from(host, port, srcport):
    """Connects to an echo server from local port SRCPORT, sends a line and
    prints what came back."""
    try:
        s = socket.socket(family(host), socket.SOCK_STREAM)
        s.settimeout(2)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", srcport))
        s.connect((host, port))
        s.sendall(b"ping\n")
        print("echo", s.makefile("rb").readline().decode().strip(), flush=True)
    except OSError as e:
        fail(e)


def tcp_echo_server(host, port):
    def serve(conn):
        with conn:
            while True:
                data = conn.recv(4096)
                if not data:
                    return
                conn.sendall(data)

    serve_forever(host, port, serve)


def serve_forever(host, port, serve):
    """Listens on HOST:PORT, prints "listening", and runs serve(conn) on a
    thread of its own for every connection."""
    import threading

    s = socket.socket(family(host), socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(64)
    print("listening", flush=True)
    while True:
        conn, _ = s.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def tcp_hold(host, port, n, interval):
    try:
        s = socket.socket(family(host), socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect((host, port))
        f = s.makefile("rb")
        for i in range(n):
            msg = b"ping%d\n" % i
            s.sendall(msg)
            line = f.readline()
            if line != msg:
                print("error mismatch", repr(line), flush=True)
                sys.exit(1)
            print("echo", line.decode().strip(), flush=True)
            time.sleep(interval)
        s.close()
    except OSError as e:
        name = "timeout" if isinstance(e, socket.timeout) else errno.errorcode.get(e.errno, str(e.errno))
        print("error", name, "%.3f" % time.time(), flush=True)
        sys.exit(1)


def mesh_proxy(host, port, mark):
    import struct
    import threading

    SO_ORIGINAL_DST = 80

    def pipe(a, b):
        try:
            while True:
                data = a.recv(4096)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            try:
                b.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def serve(conn):
        raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        dport, = struct.unpack("!H", raw[2:4])
        dst = socket.inet_ntoa(raw[4:8])
        print("original %s:%d" % (dst, dport), flush=True)
        up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        up.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
        up.settimeout(5)
        try:
            up.connect((dst, dport))
        except OSError as e:
            print("upstream-error", errno.errorcode.get(e.errno, str(e.errno)), flush=True)
            conn.close()
            return
        up.settimeout(None)
        threading.Thread(target=pipe, args=(up, conn), daemon=True).start()
        pipe(conn, up)

    serve_forever(host, port, serve)


def open_many(kind, host, port, n):
    held = []
    try:
        for i in range(n):
            s = socket.socket(family(host), socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
            s.settimeout(2)
            held.append(s)
            if kind == "tcp":
                s.connect((host, port))
                continue
            if kind == "udp-connect":
                s.connect((host, port))
                s.send(b"ping%d" % i)
            else:
                s.sendto(b"ping%d" % i, (host, port))
            s.recvfrom(2048)
    except OSError as e:
        fail(e)
    print("open", len(held), flush=True)
    sys.stdin.read()
    for s in held:
        s.close()
    print("closed", flush=True)


def count_tunnelled(iface, seconds):
    """Counts the IPIP and IP6IP6 frames `iface` receives for `seconds`
    (seen by a packet socket before the TC programs take them apart), and
    prints the count."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    s.bind((iface, 0))
    s.settimeout(0.2)
    print("listening", flush=True)
    end, n = time.time() + seconds, 0
    while time.time() < end:
        try:
            frame, addr = s.recvfrom(128)
        except socket.timeout:
            continue
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        ethertype = frame[12:14]
        if (ethertype == b"\x08\x00" and frame[23] == 4) or (ethertype == b"\x86\xdd" and frame[20] == 41):
            n += 1
    print("tunnelled", n, flush=True)


def main():
    if sys.argv[1] == "open-many":
        open_many(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    if sys.argv[1] == "count-tunnelled":
        count_tunnelled(sys.argv[2], float(sys.argv[3]))
        return
    mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "tcp-peer":
        tcp_peer(host, port)
    elif mode == "mesh-proxy":
        mesh_proxy(host, port, int(sys.argv[4], 0))
    elif mode == "tcp-echo-from":
        tcp_echo_from(host, port, int(sys.argv[4]))
    elif mode == "tcp-echo-server":
        tcp_echo_server(host, port)
    elif mode == "tcp-hold":
        tcp_hold(host, port, int(sys.argv[4]), float(sys.argv[5]))
    elif mode == "udp-connect-loop":
        udp_connect_loop(host, port, int(sys.argv[4]), float(sys.argv[5]))
    else:
        n = int(sys.argv[4])
        interval = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
        srcport = int(sys.argv[6]) if len(sys.argv) > 6 else None
        size = int(sys.argv[7]) if len(sys.argv) > 7 else None
        udp(mode, host, port, n, interval, srcport, size)


main()
