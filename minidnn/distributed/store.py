"""The rendezvous store: a small key-value server that rank 0 runs, which every rank reaches over TCP.

Ranks that know nothing of each other but ``MASTER_ADDR:MASTER_PORT`` meet through it: rank 0 publishes what the
others need (the NCCL unique id, the port of its collective socket) under a key, and ``get`` blocks until the key
appears. TCP rather than a file: a file store needs one host or a shared file system, and several machines are
the point of a rendezvous address. Standard library only (``socket``, ``threading``); values are bytes, never pickled.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

__all__ = ["TCPStore", "recv_exactly", "StoreTimeout"]

# A request: one command byte, the key's length (4 bytes) and the key, the value's length (8 bytes) and the value.
# A reply: a status byte (0 ok, 1 timed out) and a length-prefixed value.
_SET, _GET, _ADD, _DELETE = b"s", b"g", b"a", b"d"
_HEADER = struct.Struct("!cIQ")
_REPLY = struct.Struct("!BQ")
_INT = struct.Struct("!q")


class StoreTimeout(TimeoutError):
    """A key did not appear in time, or the store could not be reached."""


def recv_exactly(connection: socket.socket, count: int, into: memoryview | None = None) -> memoryview:
    """Read exactly ``count`` bytes (into ``into`` when given); ``ConnectionError`` when the peer closes first."""
    buffer = into if into is not None else memoryview(bytearray(count))
    received = 0
    while received < count:
        got = connection.recv_into(buffer[received:count])
        if got == 0:
            raise ConnectionError(f"the peer closed the connection after {received} of {count} bytes")
        received += got
    return buffer


class _Server:
    """The store's server, in rank 0's process: one daemon thread per connected rank, one dict under a lock."""

    def __init__(self, port: int) -> None:
        self.values: dict[bytes, bytes] = {}
        self.changed = threading.Condition()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            # Every interface: the other machines reach this one at MASTER_ADDR, whichever interface that names.
            self.listener.bind(("", port))
        except OSError as error:
            self.listener.close()
            raise RuntimeError(f"the rendezvous store cannot listen on port {port} ({error}): is another job using "
                               f"it? Pick another MASTER_PORT") from None
        self.listener.listen(128)
        self.closed = False
        threading.Thread(target=self._accept, name="minidnn-store", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # the listener was closed
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(connection,), name="minidnn-store-client", daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            try:
                while True:
                    command, key_length, value_length = _HEADER.unpack(recv_exactly(connection, _HEADER.size))
                    key = bytes(recv_exactly(connection, key_length))
                    value = bytes(recv_exactly(connection, value_length)) if value_length else b""
                    status, reply = self._handle(command, key, value)
                    connection.sendall(_REPLY.pack(status, len(reply)) + reply)
            except (ConnectionError, OSError):
                return  # that rank has gone: its keys stay for the others

    def _handle(self, command: bytes, key: bytes, value: bytes) -> tuple[int, bytes]:
        with self.changed:
            if command == _SET:
                self.values[key] = value
                self.changed.notify_all()
                return 0, b""
            if command == _ADD:
                total = _INT.unpack(self.values.get(key, _INT.pack(0)))[0] + _INT.unpack(value)[0]
                self.values[key] = _INT.pack(total)
                self.changed.notify_all()
                return 0, self.values[key]
            if command == _DELETE:
                return 0, b"1" if self.values.pop(key, None) is not None else b"0"
            # GET: wait (the client's timeout travels in the value) until the key is there.
            timeout = _INT.unpack(value)[0] / 1000.0
            if self.changed.wait_for(lambda: key in self.values, timeout=timeout):
                return 0, self.values[key]
            return 1, b""

    def close(self) -> None:
        self.closed = True
        self.listener.close()


class TCPStore:
    """``TCPStore(host, port, world_size, is_master, timeout=300.0)``: PyTorch's name and methods.

    ``is_master`` (rank 0) also runs the server, listening on every interface at ``port``; every rank, the master
    included, talks to it through one client connection to ``host:port``, retried until ``timeout`` seconds have
    passed (the master may start after the others). ``set(key, bytes)``, ``get(key) -> bytes`` (waits up to
    ``timeout`` for the key), ``add(key, int) -> int``, ``delete_key(key) -> bool``, ``wait_for_count``.
    """

    def __init__(self, host: str, port: int, world_size: int | None = None, is_master: bool = False,
                 timeout: float = 300.0) -> None:
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ValueError(f"port must be an int in 1..65535, got {port!r}")
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.host, self.port, self.world_size, self.timeout = host, port, world_size, float(timeout)
        self._server = _Server(port) if is_master else None
        self._lock = threading.Lock()  # one request at a time on the one connection
        self._connection = self._connect()

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                connection = socket.create_connection((self.host, self.port), timeout=min(self.timeout, 10.0))
                break
            except OSError as error:
                if time.monotonic() >= deadline:
                    raise StoreTimeout(f"could not reach the rendezvous store at {self.host}:{self.port} within "
                                       f"{self.timeout:g}s ({error}): is rank 0 running, and MASTER_ADDR/MASTER_PORT "
                                       f"the same on every rank?") from None
                time.sleep(0.05)
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.settimeout(None)  # each request sets its own
        return connection

    def _request(self, command: bytes, key: str, value: bytes, wait: float = 0.0) -> tuple[int, bytes]:
        encoded = key.encode()
        with self._lock:
            # The reply may take as long as the server's wait, plus the trip.
            self._connection.settimeout(wait + self.timeout)
            try:
                self._connection.sendall(_HEADER.pack(command, len(encoded), len(value)) + encoded + value)
                status, length = _REPLY.unpack(recv_exactly(self._connection, _REPLY.size))
                reply = bytes(recv_exactly(self._connection, length)) if length else b""
            except socket.timeout:
                raise StoreTimeout(f"the rendezvous store at {self.host}:{self.port} did not answer within "
                                   f"{wait + self.timeout:g}s") from None
            except (ConnectionError, OSError) as error:
                raise ConnectionError(f"lost the rendezvous store at {self.host}:{self.port} ({error}): rank 0, "
                                      f"which runs it, has probably died") from None
        return status, reply

    def set(self, key: str, value: bytes | str) -> None:
        self._request(_SET, key, value.encode() if isinstance(value, str) else bytes(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value under ``key``, waiting up to ``timeout`` seconds (the store's own by default) for it."""
        wait = self.timeout if timeout is None else float(timeout)
        status, reply = self._request(_GET, key, _INT.pack(int(wait * 1000)), wait=wait)
        if status != 0:
            raise StoreTimeout(f"key {key!r} did not appear in the rendezvous store within {wait:g}s: a rank has not "
                               f"arrived (is every rank started, with the same WORLD_SIZE?)")
        return reply

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer under ``key`` (0 if absent) and return the new value, atomically."""
        return _INT.unpack(self._request(_ADD, key, _INT.pack(int(amount)))[1])[0]

    def delete_key(self, key: str) -> bool:
        return self._request(_DELETE, key, b"")[1] == b"1"

    def wait_for_count(self, key: str, count: int, timeout: float | None = None) -> None:
        """Wait until the counter under ``key`` (see :meth:`add`) reaches ``count``: a barrier through the store."""
        wait = self.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + wait
        delay = 0.001
        while self.add(key, 0) < count:
            if time.monotonic() >= deadline:
                raise StoreTimeout(f"only {self.add(key, 0)} of {count} ranks reached {key!r} within {wait:g}s: a "
                                   f"rank has not arrived (is every rank started, with the same WORLD_SIZE?)")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def close(self) -> None:
        try:
            self._connection.close()
        finally:
            if self._server is not None:
                self._server.close()
