"""Where an endpoint listens (the endpoint file's `host`), and how this machine reaches it.

Like Ollama, an endpoint listens on loopback unless its file says otherwise; `0.0.0.0` and
`::` listen on every interface, any other address on that one only. The health gate, the
watchdog and the hand-off on this machine connect to loopback when the endpoint listens on
every interface, else to the address itself.
"""

from __future__ import annotations

import ipaddress

DEFAULT_HOST = "127.0.0.1"


def listen_address(text: str) -> str:
    """`text` as an IP address; ValueError naming what is allowed otherwise."""
    if "%" in text:
        raise ValueError(f"{text!r} carries an interface scope (%), which cannot be listened on")
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError(
            f"{text!r} is not an IP address (a host name is not resolved here)"
        ) from None


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def local_address(host: str) -> str:
    """The address a client on this machine connects to, bracketed when IPv6."""
    address = ipaddress.ip_address(host)
    if address.is_unspecified:
        address = ipaddress.ip_address("127.0.0.1" if address.version == 4 else "::1")
    return f"[{address}]" if address.version == 6 else str(address)


def local_url(host: str, port: int) -> str:
    """The base URL without /v1 that this machine reaches the endpoint at."""
    return f"http://{local_address(host)}:{port}"
