"""Binding a server that treegym starts: the port check, what counts as loopback, and the warning
printed when a server is told to listen beyond this machine.

None of these servers (retrieval, model, local web, OpenEnv env server) has authentication, so
each binds 127.0.0.1 unless told otherwise, and every one warns the same way when it is.
"""

from __future__ import annotations

import ipaddress
import sys

from treegym.errors import ConfigError


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and any address in 127.0.0.0/8 or ``::1`` (brackets allowed)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_port(port: int, flag: str = "--port") -> int:
    """A TCP port to bind (0 picks a free one); a ConfigError names the flag otherwise."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"{flag} must be from 0 to 65535 (0 picks a free one), got {port}")
    return port


def exposure_warning(host: str, what: str = "the API") -> str | None:
    """The warning for binding ``host``, or None when it is loopback."""
    if is_loopback(host):
        return None
    where = "every interface" if host in ("", "0.0.0.0", "::") else host
    return (f"warning: binding {host or '(all)'} exposes {what}, which has no authentication, on {where}; "
            "use --host 127.0.0.1 unless that is what you want")


def warn_if_exposed(host: str, what: str) -> None:
    """Print :func:`exposure_warning` to stderr when there is one."""
    warning = exposure_warning(host, what)
    if warning:
        print(warning, file=sys.stderr, flush=True)
