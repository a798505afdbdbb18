"""Whether a network service answers, found out in seconds rather than after a library's minute of retries.

    reason = unreachable("https://huggingface.co", timeout_s=3.0)   # None when a TCP connection opens

Used before the calls that would otherwise block on a dead network: `data=hub` (datasets retries
for ~40 s, then raises a traceback) and W&B online (wandb.init retries for ~90 s). Only a TCP
connection to the URL's host and port is tried: no request is sent, no data leaves the machine.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def unreachable(url: str, timeout_s: float = 3.0) -> str | None:
    """Why `url`'s host cannot be reached (DNS failure, refused, timed out), or None when it can."""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    host = parts.hostname
    if not host:
        return f"{url!r} names no host"
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as error:  # socket.gaierror, ConnectionRefusedError, TimeoutError are all OSErrors
        return f"{host}:{port}: {type(error).__name__}: {error}" if str(error) else f"{host}:{port}: {type(error).__name__}"
