"""Our CPU backend, ``"tcp"``: collectives on NumPy arrays over TCP sockets, star-shaped through rank 0.

Every rank holds one socket to rank 0. An all-reduce sends each array to rank 0, which adds them in rank order and
sends the one result back, so every rank ends with the same bits; a broadcast passes through rank 0. A worker
thread runs the collectives in the order they were called (NumPy and the sockets release the GIL, so an
``async_op`` collective overlaps the caller's work). Each message carries the collective's number, kind, dtype and
size: rank 0 compares them and stops the job with a message naming both sides when ranks disagree. A peer that
dies closes its socket (the others fail at once); one that hangs is caught by the socket timeout. GPU arrays are
taken through the host. O(world size) traffic through rank 0: a backend for tests and small CPU jobs, not for speed.
"""
from __future__ import annotations

import queue
import socket
import struct
import threading
from typing import Any, Callable

import numpy as np

from .. import backend
from .group import ProcessGroup, ReduceOp, Work
from .store import TCPStore, recv_exactly

__all__ = ["TcpProcessGroup"]

_ALL_REDUCE, _BROADCAST, _BARRIER = 1, 2, 3
_KIND_NAMES = {_ALL_REDUCE: "all_reduce", _BROADCAST: "broadcast", _BARRIER: "barrier"}
_OPS = list(ReduceOp)
# sequence number, kind, op, dtype (NumPy's str, padded), bytes, source rank
_HEADER = struct.Struct("!QBB8sQi")
_REPLY = struct.Struct("!BQ")  # status (0 ok, 1 error: the payload is the message), payload bytes


class TcpWork(Work):
    """A collective queued on the worker thread; ``finish`` (the copy back to a GPU array) runs in the waiter."""

    def __init__(self, finish: Callable[[], None] | None = None) -> None:
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._finish = finish

    def wait(self, timeout: float | None = None) -> bool:
        if not self._done.wait(timeout):
            raise TimeoutError(f"the collective did not finish within {timeout:g}s")
        if self._error is not None:
            raise RuntimeError(str(self._error)) from self._error
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()


def _bytes_of(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1)).cast("B")


class TcpProcessGroup(ProcessGroup):
    """The ``"tcp"`` backend: see the module's docstring. ``timeout``: seconds any one socket operation may wait."""

    name = "tcp"

    def __init__(self, store: TCPStore, rank: int, size: int, timeout: float) -> None:
        self.rank, self.size, self.timeout = rank, size, timeout
        self.device = None  # any: GPU arrays travel through the host
        self._peers: dict[int, socket.socket] = {}
        self._sequence = 0
        self._broken: str | None = None
        self._tasks: queue.Queue = queue.Queue()
        self._worker = None
        if size > 1:  # a world of one has nothing to send: no sockets, no thread
            self._connect(store)
            self._worker = threading.Thread(target=self._run, name=f"minidnn-tcp-rank{rank}", daemon=True)
            self._worker.start()

    # --- setup ------------------------------------------------------------------------------------
    def _connect(self, store: TCPStore) -> None:
        if self.rank == 0:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("", 0))  # any free port, published through the store
            listener.listen(self.size)
            listener.settimeout(self.timeout)
            store.set("tcp/port", str(listener.getsockname()[1]))
            try:
                while len(self._peers) < self.size - 1:
                    try:
                        connection, _ = listener.accept()
                    except socket.timeout:
                        raise RuntimeError(f"tcp backend: only {len(self._peers)} of {self.size - 1} ranks connected "
                                           f"to rank 0 within {self.timeout:g}s") from None
                    connection.settimeout(self.timeout)
                    peer = struct.unpack("!i", recv_exactly(connection, 4))[0]
                    self._peers[peer] = connection
            finally:
                listener.close()
        else:
            port = int(store.get("tcp/port"))
            connection = socket.create_connection((store.host, port), timeout=self.timeout)
            connection.sendall(struct.pack("!i", self.rank))
            self._peers[0] = connection
        for connection in self._peers.values():
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection.settimeout(self.timeout)

    # --- the worker -------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            operation, work = task
            try:
                if self._broken is not None:
                    raise RuntimeError(f"the process group is broken by an earlier failure: {self._broken}")
                operation()
            except BaseException as error:  # noqa: BLE001 - handed to the waiter
                if self._broken is None:
                    self._broken = str(error)
                work._error = error
            work._done.set()

    def _submit(self, kind: int, array: Any, op: ReduceOp = ReduceOp.SUM, src: int = 0) -> TcpWork:
        if self.size == 1:
            return Work()  # nothing to combine: the array is already the result (the AVG of one is itself)
        sequence = self._sequence
        self._sequence += 1
        if backend.is_cuda_array(array):
            host = backend.to_device(array, "cpu")  # waits for the kernels that wrote it
            work = TcpWork(finish=lambda: array.set(host))
        else:
            host, work = array, TcpWork()
        header = (sequence, kind, _OPS.index(op), host.dtype.str.encode().ljust(8), host.nbytes, src)
        self._tasks.put((lambda: self._collective(header, host), work))
        return work

    def _describe(self, header: tuple) -> str:
        sequence, kind, op, dtype, nbytes, src = header
        what = _KIND_NAMES.get(kind, f"kind {kind}")
        detail = {_ALL_REDUCE: f" {_OPS[op].name}" if op < len(_OPS) else "",
                  _BROADCAST: f" from rank {src}"}.get(kind, "")
        return f"#{sequence} {what}{detail} of {nbytes} bytes of {dtype.decode().strip()}"

    def _failure(self, peer: int, header: tuple, error: BaseException) -> RuntimeError:
        what = self._describe(header)
        if isinstance(error, socket.timeout):
            return RuntimeError(f"tcp backend: rank {self.rank} waited more than {self.timeout:g}s for rank {peer} in "
                                f"collective {what}: that rank is stuck, or has stopped calling collectives; stopping "
                                f"rather than hang")
        return RuntimeError(f"tcp backend: rank {peer} closed its connection during collective {what} ({error}): "
                            f"that rank has most likely died")

    def _collective(self, header: tuple, host: np.ndarray) -> None:
        if self.rank == 0:
            self._root(header, host)
        else:
            self._leaf(header, host)

    def _leaf(self, header: tuple, host: np.ndarray) -> None:
        kind, src = header[1], header[5]
        connection = self._peers[0]
        try:
            connection.sendall(_HEADER.pack(*header))
            if kind == _ALL_REDUCE or (kind == _BROADCAST and src == self.rank):
                connection.sendall(_bytes_of(host))
            status, length = _REPLY.unpack(recv_exactly(connection, _REPLY.size))
            if status != 0:
                raise RuntimeError(bytes(recv_exactly(connection, length)).decode())
            if length:
                recv_exactly(connection, length, _bytes_of(host))
        except (OSError, ConnectionError) as error:
            raise self._failure(0, header, error) from None

    def _root(self, header: tuple, host: np.ndarray) -> None:
        kind, op, src = header[1], _OPS[header[2]], header[5]
        result = host.copy() if kind == _ALL_REDUCE else host
        incoming = np.empty_like(host) if kind == _ALL_REDUCE else None
        combine = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}[op]
        for peer in range(1, self.size):  # in rank order: every run adds in the same order
            connection = self._peers[peer]
            try:
                theirs = _HEADER.unpack(recv_exactly(connection, _HEADER.size))
                if theirs != header:
                    message = (f"tcp backend: the ranks disagree on collective #{header[0]}: rank 0 runs "
                               f"{self._describe(header)}, rank {peer} runs {self._describe(theirs)}; every rank must "
                               f"call the same collectives in the same order, with the same sizes and dtypes")
                    self._tell_others(message)
                    raise RuntimeError(message)
                if kind == _ALL_REDUCE:
                    recv_exactly(connection, host.nbytes, _bytes_of(incoming))
                    combine(result, incoming, out=result)
                elif kind == _BROADCAST and peer == src:
                    recv_exactly(connection, host.nbytes, _bytes_of(host))
            except (OSError, ConnectionError) as error:
                failure = self._failure(peer, header, error)
                self._tell_others(str(failure), skip=peer)
                raise failure from None
        if kind == _ALL_REDUCE:
            if op is ReduceOp.AVG:
                result /= self.size
            np.copyto(host, result)
        for peer in range(1, self.size):
            payload = kind == _ALL_REDUCE or (kind == _BROADCAST and peer != src)
            try:
                self._peers[peer].sendall(_REPLY.pack(0, host.nbytes if payload else 0))
                if payload and host.nbytes:
                    self._peers[peer].sendall(_bytes_of(host))
            except (OSError, ConnectionError) as error:
                raise self._failure(peer, header, error) from None

    def _tell_others(self, message: str, skip: int | None = None) -> None:
        """Best effort: hand the error to every rank still listening, so that each stops with the same message."""
        encoded = message.encode()
        for peer, connection in self._peers.items():
            if peer == skip:
                continue
            try:
                connection.sendall(_REPLY.pack(1, len(encoded)) + encoded)
            except OSError:
                pass

    # --- the collectives --------------------------------------------------------------------------
    def all_reduce(self, array: Any, op: ReduceOp = ReduceOp.SUM) -> Work:
        return self._submit(_ALL_REDUCE, array, op)

    def broadcast(self, array: Any, src: int = 0) -> Work:
        return self._submit(_BROADCAST, array, src=src)

    def barrier(self) -> None:
        self._submit(_BARRIER, np.zeros(1, np.uint8)).wait()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._tasks.put(None)
            self._worker.join(timeout=self.timeout)
            self._worker = None
        for connection in self._peers.values():
            connection.close()
        self._peers.clear()
