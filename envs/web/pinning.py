"""Connections that go to the addresses a guard checked, not to what the name resolves to later.

``requests`` and ``urllib3`` resolve a host name again when they connect, so a check on the
addresses a name resolves to proves nothing about the connection that follows (DNS
rebinding). Inside ``pinned(target)`` this thread's new connections to ``target``'s host and
port go to one of ``target.addresses`` (TLS still verifies the host name), and a pooled
connection that is connected elsewhere is closed first, so that it is opened again, pinned.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util import connection

_PIN = threading.local()  # .target: the checked target of the exchange running on this thread


class PinTarget(Protocol):
    """What a guard checked (``guard.Target``): the URL to send, its host, port and addresses."""

    url: str
    host: str
    port: int
    addresses: tuple[str, ...]


@contextlib.contextmanager
def pinned(target: PinTarget) -> Iterator[None]:
    """Pin this thread's connections to ``target``'s host and port to its checked addresses."""
    previous = getattr(_PIN, "target", None)
    _PIN.target = target
    try:
        yield
    finally:
        _PIN.target = previous


def _pin_for(host: str, port: int | None) -> PinTarget | None:
    target = getattr(_PIN, "target", None)
    if target is None or host.strip("[]").rstrip(".").lower() != target.host or port != target.port:
        return None
    return target


class PinnedConnection:
    """A urllib3 connection that opens its socket to a pinned address when one is set."""

    _pinned_to: str | None = None

    def _new_conn(self) -> socket.socket:
        target = _pin_for(self.host, self.port)
        if target is None or getattr(self, "_tunnel_host", None):
            self._pinned_to = None
            return super()._new_conn()
        error: Exception | None = None
        for address in target.addresses:
            try:
                sock = connection.create_connection((address, self.port), self.timeout,
                                                    source_address=self.source_address,
                                                    socket_options=self.socket_options)
            except TimeoutError as exc:
                error = ConnectTimeoutError(self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})")
                error.__cause__ = exc
                continue
            except OSError as exc:
                error = NewConnectionError(self, f"Failed to establish a new connection: {exc}")
                continue
            self._pinned_to = address
            return sock
        assert error is not None  # a Target always holds at least one address
        raise error


class PinnedPool:
    """A pool that hands out no connection that a pin would not have opened."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)
        target = _pin_for(self.host, self.port)
        if target is not None and conn.sock is not None and conn._pinned_to not in target.addresses:
            conn.close()  # opened unpinned, or for another check: connect again, pinned
        return conn
