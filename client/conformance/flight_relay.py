"""A loopback relay between a client and PostgreSQL that counts the client's
flights: what the client sends before it waits for the server.

The clients' tests (client/python/tests/test_round_trips.py,
client/node/test/round-trips.test.js) connect through it and assert how
many flights a request takes in each mode; a count, not a time, so that
the test cannot flake on a busy machine.

A flight opens with the first message the client sends while it waits for
nothing, and closes when the server has answered every Sync and Query of
it with ReadyForQuery (or, after a Flush, with anything: psycopg's fetch
inside a pipeline waits for results without ReadyForQuery). One thread
reads both directions, and a server message is counted before it is passed
on, so a client that waits for ReadyForQuery before it sends again is
always seen to: the count is exact for such a client. A client that sent
two Syncs without waiting could be seen as one flight or two.

As a module: Relay(host, port) (host a socket directory, as libpq's, or an
address), .port, .flights(), .log(), .close(). From the command line
(for the Node tests): flight_relay.py HOST PORT prints "port N", then
answers each line "count" on stdin with one JSON line
{"flights": n, "log": [...]}; end of input stops it.

Relay(host, port, opened=False) (the command line: --closed) has its port
but refuses connections, as a server that has not started yet, until
.open() (a line "open"): the clients' start-up tests wait through that.
"""

import json
import os
import selectors
import socket
import struct
import sys
import threading

SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST = 80877103, 80877104, 80877102


def _text(payload):
    return payload.split(b"\0", 1)[0].decode("utf-8", "replace")


class _Side:
    """One connection's two byte streams and the client's flight state."""

    def __init__(self, client, server):
        self.client, self.server = client, server
        self.cbuf, self.sbuf = b"", b""
        self.startup = True      # untyped messages until the StartupMessage
        self.one_byte = 0        # answers to SSLRequest / GSSENCRequest: one byte each
        self.waiting = 0         # Syncs and Queries not yet answered with ReadyForQuery
        self.flushed = False     # the last message was a Flush: any answer ends the flight
        self.open = False


class Relay:
    def __init__(self, host, port, listen="127.0.0.1", opened=True):
        self._target = (os.path.join(host, ".s.PGSQL.%d" % int(port)) if host.startswith("/")
                        else (host, int(port)))
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((listen, 0))  # bound, not listening: connections are refused
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._flights = []       # each: the statements or message kinds of one flight
        self._sel = selectors.DefaultSelector()
        if opened:
            self._listen()
        self._stop_r, self._stop_w = socket.socketpair()
        self._sel.register(self._stop_r, selectors.EVENT_READ, "stop")
        self._thread = threading.Thread(target=self._run, name="flight-relay", daemon=True)
        self._thread.start()

    # ---- what the tests read ------------------------------------------------------

    def flights(self):
        with self._lock:
            return len(self._flights)

    def log(self):
        """Each flight as the statements it carried ("BEGIN", "SELECT ...", or
        "bind <name>" for a prepared statement's execution)."""
        with self._lock:
            return [list(f) for f in self._flights]

    def open(self):
        """Start accepting connections (a relay made with opened=False)."""
        self._stop_w.send(b"o")

    def _listen(self):
        self._listener.listen(64)
        self._sel.register(self._listener, selectors.EVENT_READ, None)

    def close(self):
        self._stop_w.send(b"x")
        self._thread.join()
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()
        self._listener.close()  # not in the map if never opened
        self._stop_w.close()

    # ---- the loop -----------------------------------------------------------------

    def _run(self):
        while True:
            for key, _ in self._sel.select():
                if key.data == "stop":
                    if self._stop_r.recv(1) == b"o":
                        self._listen()
                        continue
                    return
                if key.data is None:
                    self._accept()
                    continue
                side, from_client = key.data
                try:
                    data = key.fileobj.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self._drop(side)
                    continue
                try:
                    if from_client:
                        self._from_client(side, data)
                        side.server.sendall(data)
                    else:
                        self._from_server(side, data)
                        side.client.sendall(data)
                except OSError:
                    self._drop(side)

    def _accept(self):
        client, _ = self._listener.accept()
        family = socket.AF_UNIX if isinstance(self._target, str) else socket.AF_INET
        server = socket.socket(family, socket.SOCK_STREAM)
        server.connect(self._target)
        side = _Side(client, server)
        self._sel.register(client, selectors.EVENT_READ, (side, True))
        self._sel.register(server, selectors.EVENT_READ, (side, False))

    def _drop(self, side):
        for s in (side.client, side.server):
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def _from_client(self, side, data):
        side.cbuf += data
        while True:
            if side.startup:
                if len(side.cbuf) < 8:
                    return
                n, code = struct.unpack("!II", side.cbuf[:8])
                if len(side.cbuf) < n:
                    return
                side.cbuf = side.cbuf[n:]
                if code in (SSL_REQUEST, GSSENC_REQUEST):
                    side.one_byte += 1
                elif code != CANCEL_REQUEST:
                    side.startup = False  # the StartupMessage: typed messages from here
                continue
            if len(side.cbuf) < 5:
                return
            kind = side.cbuf[:1]
            n = struct.unpack("!I", side.cbuf[1:5])[0]
            if len(side.cbuf) < 1 + n:
                return
            payload, side.cbuf = side.cbuf[5:1 + n], side.cbuf[1 + n:]
            self._client_message(side, kind, payload)

    def _client_message(self, side, kind, payload):
        # Authentication (p) and Terminate (X) are no request's flights.
        if kind in (b"p", b"X"):
            return
        with self._lock:
            if not side.open:
                side.open = True
                self._flights.append([])
            if kind == b"Q":
                self._flights[-1].append(_text(payload))
            elif kind == b"P":
                self._flights[-1].append(_text(payload.split(b"\0", 1)[1]))
            elif kind == b"B":
                name = _text(payload.split(b"\0", 2)[1])
                if name:
                    self._flights[-1].append("bind " + name)
        if kind in (b"S", b"Q"):
            side.waiting += 1
        side.flushed = kind == b"H"

    def _from_server(self, side, data):
        side.sbuf += data
        while True:
            if side.one_byte:
                if not side.sbuf:
                    return
                side.sbuf = side.sbuf[1:]
                side.one_byte -= 1
                continue
            if len(side.sbuf) < 5:
                return
            kind = side.sbuf[:1]
            n = struct.unpack("!I", side.sbuf[1:5])[0]
            if len(side.sbuf) < 1 + n:
                return
            side.sbuf = side.sbuf[1 + n:]
            with self._lock:
                if kind == b"Z" and side.waiting:
                    side.waiting -= 1
                if side.open and (side.waiting == 0 and (kind == b"Z" or side.flushed)):
                    side.open = side.flushed = False


def main(argv):
    closed = "--closed" in argv
    argv = [a for a in argv if a != "--closed"]
    if len(argv) != 3:
        sys.stderr.write("usage: flight_relay.py HOST PORT [--closed]\n")
        return 2
    relay = Relay(argv[1], argv[2], opened=not closed)
    print("port %d" % relay.port, flush=True)
    for line in sys.stdin:
        if line.strip() == "count":
            print(json.dumps({"flights": relay.flights(), "log": relay.log()}), flush=True)
        elif line.strip() == "open":
            relay.open()
            print("open", flush=True)
    relay.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
