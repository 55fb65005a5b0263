"""Whether the Hugging Face hub can be asked now: one quick answer before any slow download.

Both the model loader (:mod:`bsi.models`) and the text datasets
(:mod:`bsi.data.text`) ask before they reach for a hub id, so that an unknown
name offline fails at once with advice instead of after half a minute of
retries. It sits below both, with nothing of bsi's but the standard library.
"""

from __future__ import annotations

import os
import socket
import threading
from urllib.parse import urlparse


def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be asked now, or None when it can.

    Offline mode (``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``) answers at once;
    otherwise one TCP connection to the hub's host is tried for at most 3 s
    (in a thread, so a name lookup that hangs counts too). Behind a proxy
    (``HTTPS_PROXY``) the proxy decides, so the hub counts as reachable.
    """
    import huggingface_hub
    from huggingface_hub import constants

    if huggingface_hub.is_offline_mode():
        return "offline mode (HF_HUB_OFFLINE) is on"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    reached: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=3.0).close()
            reached.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(3.0)
    return None if reached else f"no connection to {constants.ENDPOINT}"
