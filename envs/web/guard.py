"""Which addresses ``<browse>`` may reach, so that a policy under training cannot read the
services of the machine or network it trains on (SSRF).

By default only public (globally routable) addresses are allowed: loopback, private,
link-local (cloud metadata at 169.254.169.254 among them), shared, reserved and multicast
addresses are refused. An allow-list names what may be reached anyway: a host, a
``host:port``, or a network in CIDR form (``10.0.0.0/8``); ``"*"`` turns the check off.

A URL is parsed once, here, and what is sent is built from that parse (``Target.url``), so no
other parser can read another host out of it (``http://127.0.0.1:8080\\@example.com/`` names
127.0.0.1 to urllib3 and example.com to ``urlsplit``: a URL with a backslash or user info in
its authority is refused). The host is resolved, every address it resolves to is checked, and
the connection goes to one of exactly those addresses (``treegym.envs.web.pinning``), so a
name that resolves to a public address at the check and to a private one at the connect (DNS
rebinding) reaches nothing new. A host that does not resolve is refused. Redirects are
checked the same way, each hop. Through an HTTP proxy the proxy resolves the name itself.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from treegym.envs.web.http import FetchError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Target:
    """A checked URL: what to send (rebuilt from the one parse) and where its connection may go."""

    url: str
    host: str  # lower case, no brackets
    port: int
    addresses: tuple[str, ...]  # the checked addresses, in resolver order


@dataclass(frozen=True)
class AddressGuard:
    """Refuses URLs whose host is not a public address, unless the allow-list names it."""

    allow: tuple[str, ...] = ()

    @classmethod
    def of(cls, allow: Sequence[str] = ()) -> AddressGuard | None:
        """A guard for ``allow``; None (no check at all) when the list holds ``"*"``."""
        items = tuple(str(a).strip().lower() for a in allow if str(a).strip())
        return None if "*" in items else cls(items)

    def check(self, url: str) -> Target:
        """The checked ``Target`` of ``url``; a FetchError (not retryable) when it may not be fetched."""
        target = parse_target(url)
        host, port = target.host, target.port
        addresses = _resolve(host, port)
        if not addresses:
            raise FetchError(url, f"refused: {host} does not resolve to an address")
        if host not in self.allow and f"{host}:{port}" not in self.allow:
            for address in addresses:
                if not self._allowed(address):
                    hint = (" If this URL came from a snapshot made in another process: the in-process local web "
                            "listens on a new port in each process; share one `treegym web serve` (search_url=...) "
                            "instead.") if address.is_loopback else ""  # fmt: skip
                    raise FetchError(url, f"refused: {host} is a non-public address ({address}); browsing reaches "
                                          f"public addresses only (an env's browse_allow can name others).{hint}")  # fmt: skip
        return Target(target.url, host, port, tuple(str(a) for a in addresses))

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


def parse_target(url: str) -> Target:
    """``url`` parsed once into the URL to send, its host and port (no addresses yet)."""
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise FetchError(url, "refused: the URL holds whitespace or control characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise FetchError(url, f"not an http(s) URL (scheme {parts.scheme or 'missing'!r})")
    if "\\" in parts.netloc or "@" in parts.netloc:
        raise FetchError(url, "refused: the URL's host part holds a backslash or user info, which HTTP "
                              "libraries read in different ways")  # fmt: skip
    host = (parts.hostname or "").lower()
    if not host:
        raise FetchError(url, "the URL has no host")
    try:
        explicit = parts.port
    except ValueError:
        raise FetchError(url, "the URL has an invalid port") from None
    port = explicit or (443 if parts.scheme == "https" else 80)
    shown = f"[{host}]" if ":" in host else host
    netloc = shown if explicit is None else f"{shown}:{explicit}"
    rebuilt = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, parts.fragment))
    return Target(rebuilt, host, port, ())


def _resolve(host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to (an IP literal is itself); [] when it does not resolve."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError, OSError):
        return []
    out: list[Address] = []
    for info in infos:
        try:
            address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        except ValueError:
            continue
        if address not in out:
            out.append(address)
    return out
