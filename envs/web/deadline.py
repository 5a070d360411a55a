"""A total deadline on one HTTP exchange, status line, headers and body, for ``requests``.

``requests`` and ``urllib3`` time out one socket read at a time, so a server that sends a
byte every second holds a request for as long as it likes. Here a timer shuts the socket of
the exchange down when its deadline passes; the blocked read wakes, and the caller, seeing
``Deadline.expired``, reports a timeout. Sessions get this through ``DeadlineAdapter``,
whose connections put their socket under the thread's current ``Deadline`` (and connect to
the addresses a guard pinned, ``pinning.py``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from treegym.envs.web.pinning import PinnedConnection, PinnedPool

_ACTIVE = threading.local()  # .deadline: the Deadline of the exchange running on this thread


class Deadline:
    """The sockets one attempt reads from, shut down when its time is up.

    A thread blocked in ``recv`` wakes when another thread shuts its socket down (closing it
    would not wake it), so the attempt then fails at once, whatever the server is doing.
    A connection leaves the watch when it goes back to the pool, so a socket that another
    request has taken since is never touched.
    """

    def __init__(self, seconds: float) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, Any] = {}  # id(connection) -> its socket
        self.expired = False
        self._stopped = False
        self._timer = threading.Timer(max(0.0, seconds), self._expire)
        self._timer.daemon = True
        self._timer.start()

    def __enter__(self) -> Deadline:
        """Make this the deadline of the requests that this thread sends, until the exit."""
        _ACTIVE.deadline = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        _ACTIVE.deadline = None

    def watch(self, conn: Any, sock: Any) -> None:
        with self._lock:
            if self.expired:
                _shut_down(sock)
            elif not self._stopped:
                self._watched[id(conn)] = sock

    def release(self, conn: Any) -> None:
        with self._lock:
            self._watched.pop(id(conn), None)

    def stop(self) -> None:
        """End the watch; call it before the attempt's connection can go back to the pool."""
        self._timer.cancel()
        with self._lock:
            self._stopped = True
            self._watched.clear()

    def _expire(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self.expired = True
            for sock in self._watched.values():
                _shut_down(sock)


def _shut_down(sock: Any) -> None:
    # The plain socket's shutdown, also under TLS: SSLSocket.shutdown would first drop the TLS
    # object that the reading thread is using.
    raw = sock if isinstance(sock, socket.socket) else getattr(sock, "socket", None)
    if isinstance(raw, socket.socket):
        with contextlib.suppress(OSError):
            socket.socket.shutdown(raw, socket.SHUT_RDWR)


class _WatchedConnection:
    """Puts the socket under the current attempt's ``Deadline`` before the status line is read."""

    def getresponse(self) -> Any:
        deadline = getattr(_ACTIVE, "deadline", None)
        if deadline is not None and self.sock is not None:
            self._deadline = deadline
            deadline.watch(self, self.sock)
        return super().getresponse()


class _WatchedPool:
    """Takes a connection out of its attempt's watch as it goes back to the pool."""

    def _put_conn(self, conn: Any) -> None:
        deadline = getattr(conn, "_deadline", None)
        if deadline is not None:
            conn._deadline = None
            deadline.release(conn)
        super()._put_conn(conn)


class _HTTPConnection(_WatchedConnection, PinnedConnection, HTTPConnection):
    pass


class _HTTPSConnection(_WatchedConnection, PinnedConnection, HTTPSConnection):
    pass


class _HTTPPool(_WatchedPool, PinnedPool, HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(_WatchedPool, PinnedPool, HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class DeadlineAdapter(HTTPAdapter):
    """An adapter whose connections (direct or through an HTTP proxy) honour a ``Deadline``."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if manager.pool_classes_by_scheme == urllib3.poolmanager.pool_classes_by_scheme:  # not SOCKS
            manager.pool_classes_by_scheme = _POOLS
        return manager
