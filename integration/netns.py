"""Network namespaces for tests that need separate hosts: each namespace is a
"host" with its own loopback and one veth link to the root namespace, where
PostgreSQL listens. A proxy and its clients run inside a namespace and reach
PostgreSQL only over that link, as a sidecar on another node would.

Needs root and `ip` (iproute2); `unavailable()` says why a machine cannot.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
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

    @property
    def peer(self) -> str:
        """The namespace's end of the link (`veth` is the root namespace's)."""
        return "rgn" + self.veth[3:]

    def silence(self) -> None:
        """The namespace stops answering over its link without taking it down:
        every packet it sends there is dropped at the link (a queue of length
        zero), so a peer in the root namespace sees no reply, no RST, no ICMP,
        as when a host is cut off by a firewall or a dead switch."""
        _ip("netns", "exec", self.name, "tc", "qdisc", "add", "dev", self.peer, "root",
            "pfifo", "limit", "0")

    def unsilence(self) -> None:
        _ip("netns", "exec", self.name, "tc", "qdisc", "del", "dev", self.peer, "root",
            check=False)

    def forward(self, port: int, unix_socket: str, timeout: float = 10.0) -> subprocess.Popen:
        """A relay inside the namespace from `ip:port` to `unix_socket` (a server
        of the root namespace, whose Unix socket every namespace shares): that
        server as if it ran on this namespace's host. Kill the process to stop."""
        proc = subprocess.Popen(self.argv(sys.executable, os.path.abspath(__file__), "forward",
                                          self.ip, str(port), unix_socket),
                                stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection((self.ip, port), timeout=1):
                    return proc
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError(f"relay {self.ip}:{port} -> {unix_socket} never listened")
                time.sleep(0.05)

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


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _relay(host: str, port: int, unix_socket: str) -> None:
    listener = socket.create_server((host, port))
    while True:
        tcp, _ = listener.accept()
        unix = socket.socket(socket.AF_UNIX)
        try:
            unix.connect(unix_socket)
        except OSError:
            tcp.close()
            continue
        threading.Thread(target=_pump, args=(tcp, unix), daemon=True).start()
        threading.Thread(target=_pump, args=(unix, tcp), daemon=True).start()


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "forward":
    _relay(sys.argv[2], int(sys.argv[3]), sys.argv[4])
