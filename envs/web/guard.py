"""Which addresses ``<browse>`` may reach, so that a policy under training cannot read the
services of the machine or network it trains on (SSRF).

By default only public (globally routable) addresses are allowed: loopback, private,
link-local (cloud metadata at 169.254.169.254 among them), shared, reserved and multicast
addresses are refused. The check runs on the address that the host name resolves to, and
again on every redirect. An allow-list names what may be reached anyway: a host, a
``host:port``, or a network in CIDR form (``10.0.0.0/8``); ``"*"`` turns the check off.

A host that resolves to a public address at the check and to a private one at the connect
(DNS rebinding, with a near-zero TTL) is not caught; closing that needs a resolver that pins
the checked address, which ``requests`` does not offer.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from treegym.envs.web.http import FetchError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class AddressGuard:
    """Refuses URLs whose host is not a public address, unless the allow-list names it."""

    allow: tuple[str, ...] = ()

    @classmethod
    def of(cls, allow: Sequence[str] = ()) -> AddressGuard | None:
        """A guard for ``allow``; None (no check at all) when the list holds ``"*"``."""
        items = tuple(str(a).strip().lower() for a in allow if str(a).strip())
        return None if "*" in items else cls(items)

    def check(self, url: str) -> None:
        """Raise a FetchError (not retryable) when ``url`` may not be fetched."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise FetchError(url, "the URL has an invalid port") from None
        if not host:
            raise FetchError(url, "the URL has no host")
        if host in self.allow or f"{host}:{port}" in self.allow:
            return
        for address in _resolve(host, port):
            if not self._allowed(address):
                hint = (" If this URL came from a snapshot made in another process: the in-process local web "
                        "listens on a new port in each process; share one `treegym web serve` (search_url=...) "
                        "instead.") if address.is_loopback else ""  # fmt: skip
                raise FetchError(url, f"refused: {host} is a non-public address ({address}); browsing reaches "
                                      f"public addresses only (an env's browse_allow can name others).{hint}")  # fmt: skip

    def _allowed(self, address: Address) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if any(address in net for net in self._networks()):
            return True
        return address.is_global and not address.is_multicast

    def _networks(self) -> list[Network]:
        nets = []
        for item in self.allow:
            try:
                nets.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                continue  # a host name, not a network
        return nets


def _resolve(host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to (an IP literal is itself); [] when it does not resolve,
    so that the fetch itself reports the unknown host."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError, OSError):
        return []
    out = []
    for info in infos:
        try:
            out.append(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
        except ValueError:
            continue
    return out
