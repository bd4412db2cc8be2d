"""Network namespaces for tests that need separate hosts: each namespace is a
"host" with its own loopback and one veth link to the root namespace, where
PostgreSQL listens. A proxy and its clients run inside a namespace and reach
PostgreSQL only over that link, as a sidecar on another node would.

Needs root and `ip` (iproute2); `unavailable()` says why a machine cannot.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass

# One /24 per namespace out of this /16: host side .1, namespace side .2.
SUBNET = "10.231"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          stdin=subprocess.DEVNULL, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"rgprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Namespace:
    """One namespace: `host_ip` is the root namespace's end of its link
    (where PostgreSQL is reached), `ip` its own end."""

    name: str
    index: int
    veth: str

    @property
    def host_ip(self) -> str:
        return f"{SUBNET}.{self.index}.1"

    @property
    def ip(self) -> str:
        return f"{SUBNET}.{self.index}.2"

    def argv(self, *argv: str) -> list[str]:
        """`argv` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def close(self) -> None:
        _ip("link", "del", self.veth, check=False)
        _ip("netns", "del", self.name, check=False)


def make(index: int) -> Namespace:
    """A namespace linked to the root namespace over `SUBNET.index.0/24`."""
    tag = uuid.uuid4().hex[:6]
    ns = Namespace(name=f"rg{index}-{tag}", index=index, veth=f"rgh{index}{tag}")
    peer = f"rgn{index}{tag}"
    try:
        _ip("netns", "add", ns.name)
        _ip("link", "add", ns.veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns.name)
        _ip("addr", "add", f"{ns.host_ip}/24", "dev", ns.veth)
        _ip("link", "set", ns.veth, "up")
        _ip("netns", "exec", ns.name, "ip", "addr", "add", f"{ns.ip}/24", "dev", peer)
        _ip("netns", "exec", ns.name, "ip", "link", "set", peer, "up")
        _ip("netns", "exec", ns.name, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        ns.close()
        raise RuntimeError(f"making namespace {ns.name}: {e.stderr}") from e
    return ns
