"""The client's address behind trusted proxies (``DYNALOOP_TRUSTED_PROXIES``).

A proxy in front of the API (nginx, a load balancer) connects to it from its own address; the
client's address travels in ``X-Forwarded-For`` (each proxy appends the address it was
connected from) or in the standard ``Forwarded`` header (RFC 7239, ``for=``). Either header is
whatever the sender wrote, so it is read only when the socket peer is one of the trusted
proxies, and then from the right: the rightmost hop that is not itself a trusted proxy is the
client (the hops to its left are the client's own claim). When every hop is a trusted proxy the
leftmost one is taken; when a hop is not an address (``unknown``, an obfuscated name, garbage)
the trusted proxy that reported it is. Without trusted proxies (the default) the peer is the
client, whatever the headers say.

``frontend/forwarded.py`` is the web app's copy (the web app imports nothing of the project);
tests/test_rate_limits.py checks that both answer alike.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_trusted_proxies(value: str | Iterable[str] | None) -> tuple[IPNetwork, ...]:
    """``10.0.0.5, 172.16.0.0/12, ::1`` (a comma-separated string or a list) as networks; a
    :class:`ValueError` names the entry that is neither an address nor a network."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    networks = []
    for item in items:
        entry = item.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(
                f"DYNALOOP_TRUSTED_PROXIES: {entry[:80]!r} is not an IP address or network; give addresses "
                "and CIDR networks separated by commas, e.g. 10.0.0.5,172.16.0.0/12"
            ) from None
    return tuple(networks)


def _address(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address as a header writes it (``1.2.3.4``, ``1.2.3.4:5678``, ``[2001:db8::1]:80``,
    ``"[2001:db8::1]"``), or None."""
    value = value.strip().strip('"').strip()
    if value.startswith("["):
        value = value[1 : value.find("]")] if "]" in value else ""
    elif value.count(":") == 1:  # IPv4 with a port
        value = value.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address, networks: tuple[IPNetwork, ...]) -> bool:
    return any(address.version == network.version and address in network for network in networks)


def is_trusted(address: str, trusted: tuple[IPNetwork, ...]) -> bool:
    """Whether ``address`` is one of the ``trusted`` proxies."""
    parsed = _address(address)
    return parsed is not None and _trusted(parsed, trusted)


def _forwarded_for(value: str) -> list[str]:
    """The ``for=`` of each element of a ``Forwarded`` header, in order (an element without one
    counts as an unknown hop)."""
    hops = []
    for element in value.split(","):
        found = "unknown"
        for pair in element.split(";"):
            name, _, given = pair.partition("=")
            if name.strip().lower() == "for":
                found = given
        hops.append(found)
    return hops


def forwarded_hops(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[str]:
    """The hops the proxies reported, leftmost (the original client's claim) first:
    ``X-Forwarded-For`` when present (all its lines, in order), else ``Forwarded``'s ``for=``."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    x_forwarded_for: list[str] = []
    forwarded: list[str] = []
    for name, value in pairs:
        key = name.lower()
        if key == "x-forwarded-for":
            x_forwarded_for.extend(part for part in value.split(","))
        elif key == "forwarded":
            forwarded.extend(_forwarded_for(value))
    return x_forwarded_for or forwarded


def client_address(
    peer: str | None, headers: Mapping[str, str] | Iterable[tuple[str, str]], trusted: tuple[IPNetwork, ...]
) -> str | None:
    """The client's address: ``peer`` unless it is a trusted proxy, else the rightmost
    forwarded hop that is not one (see the module's docstring)."""
    peer_address = _address(peer) if peer else None
    if peer_address is None or not trusted or not _trusted(peer_address, trusted):
        return peer
    hops = forwarded_hops(headers)
    if not hops:
        return str(peer_address)
    chosen = peer_address
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            return str(chosen)
        chosen = address
        if not _trusted(address, trusted):
            return str(address)
    return str(chosen)
