"""Minimal raw PostgreSQL v3 wire-protocol helpers for robustness tests.

Everything here talks bytes over a plain socket, with a timeout on every
read, so a misbehaving proxy makes a test fail instead of hanging CI.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import socket
import struct
import time
from dataclasses import dataclass, field

PROTO_3_0 = (3 << 16) | 0
SSL_REQUEST_CODE = 80877103
GSSENC_REQUEST_CODE = 80877104
CANCEL_REQUEST_CODE = 80877102

DEFAULT_TIMEOUT = 10.0


class ProtocolError(AssertionError):
    pass


# --------------------------------------------------------------------- framing
def cstr(s: str | bytes) -> bytes:
    if isinstance(s, str):
        s = s.encode()
    return s + b"\x00"


def msg(tag: bytes, payload: bytes = b"") -> bytes:
    """A framed message: 1-byte tag, int32 length (incl. itself), payload."""
    assert len(tag) == 1
    return tag + struct.pack("!I", len(payload) + 4) + payload


def startup_message(user: str, database: str | None = None, version: int = PROTO_3_0,
                    **params: str) -> bytes:
    body = struct.pack("!I", version)
    kv = {"user": user}
    if database is not None:
        kv["database"] = database
    kv.update(params)
    for k, v in kv.items():
        body += cstr(k) + cstr(v)
    body += b"\x00"
    return struct.pack("!I", len(body) + 4) + body


def version_code(major: int, minor: int) -> int:
    return (major << 16) | minor


def ssl_request() -> bytes:
    return struct.pack("!II", 8, SSL_REQUEST_CODE)


def gssenc_request() -> bytes:
    return struct.pack("!II", 8, GSSENC_REQUEST_CODE)


def cancel_request(pid: int, key: int | bytes) -> bytes:
    if isinstance(key, int):
        key = struct.pack("!I", key & 0xFFFFFFFF)
    return struct.pack("!III", 12 + len(key), CANCEL_REQUEST_CODE, pid) + key


def query(sql: str) -> bytes:
    return msg(b"Q", cstr(sql))


def terminate() -> bytes:
    return msg(b"X")


def parse(name: str, sql: str, oids: tuple[int, ...] = ()) -> bytes:
    return msg(b"P", cstr(name) + cstr(sql) + struct.pack("!H", len(oids))
               + b"".join(struct.pack("!I", o) for o in oids))


def bind(portal: str, stmt: str, params: list[bytes | None] = (), result_formats=()) -> bytes:
    body = cstr(portal) + cstr(stmt) + struct.pack("!H", 0)  # all params text
    body += struct.pack("!H", len(params))
    for p in params:
        body += struct.pack("!i", -1) if p is None else struct.pack("!i", len(p)) + p
    body += struct.pack("!H", len(result_formats))
    body += b"".join(struct.pack("!H", f) for f in result_formats)
    return msg(b"B", body)


def describe_portal(portal: str = "") -> bytes:
    return msg(b"D", b"P" + cstr(portal))


def execute(portal: str = "", max_rows: int = 0) -> bytes:
    return msg(b"E", cstr(portal) + struct.pack("!I", max_rows))


def sync() -> bytes:
    return msg(b"S")


def flush() -> bytes:
    return msg(b"H")


# --------------------------------------------------------------------- reading
def connect(host: str, port: int, timeout: float = DEFAULT_TIMEOUT) -> socket.socket:
    s = socket.create_connection((host, port), timeout=timeout)
    s.settimeout(timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly n bytes; raise EOFError on a clean close before that."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def read_message(sock: socket.socket) -> tuple[bytes, bytes]:
    """One framed backend message -> (tag, payload). EOFError on close."""
    hdr = recv_exact(sock, 5)
    tag, length = hdr[:1], struct.unpack("!I", hdr[1:])[0]
    if length < 4 or length > 64 * 1024 * 1024:
        raise ProtocolError(f"bad backend message length {length} for tag {tag!r}")
    return tag, recv_exact(sock, length - 4)


def read_until_eof(sock: socket.socket, deadline_s: float = DEFAULT_TIMEOUT) -> bytes:
    """Everything the peer sends until it closes; fail if it doesn't close in time."""
    end = time.monotonic() + deadline_s
    buf = bytearray()
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"peer did not close within {deadline_s}s (got {bytes(buf[:200])!r})")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return bytes(buf)
        except socket.timeout:
            raise TimeoutError(f"peer did not close within {deadline_s}s (got {bytes(buf[:200])!r})")
        if not chunk:
            return bytes(buf)
        buf += chunk


def split_messages(data: bytes) -> list[tuple[bytes, bytes]]:
    """Split a byte string of backend messages; a trailing partial one is dropped."""
    out, i = [], 0
    while i + 5 <= len(data):
        tag = data[i:i + 1]
        length = struct.unpack("!I", data[i + 1:i + 5])[0]
        if length < 4 or i + 1 + length > len(data):
            break
        out.append((tag, data[i + 5:i + 1 + length]))
        i += 1 + length
    return out


def parse_error_fields(payload: bytes) -> dict[str, str]:
    """ErrorResponse / NoticeResponse payload -> {field code: value}."""
    fields: dict[str, str] = {}
    for part in payload.split(b"\x00"):
        if part:
            fields[chr(part[0])] = part[1:].decode("utf-8", "replace")
    return fields


@dataclass
class Session:
    sock: socket.socket
    params: dict[str, str] = field(default_factory=dict)
    pid: int | None = None
    key: bytes | None = None
    notices: list[dict[str, str]] = field(default_factory=list)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> tuple[bytes, bytes]:
        return read_message(self.sock)

    def until_ready(self) -> list[tuple[bytes, bytes]]:
        """Messages up to and including ReadyForQuery."""
        out = []
        while True:
            tag, payload = self.read()
            out.append((tag, payload))
            if tag == b"Z":
                return out

    def simple_query(self, sql: str) -> tuple[list[list[bytes | None]], list[dict[str, str]]]:
        """Run a simple Query; return (rows, errors)."""
        self.send(query(sql))
        rows, errors = [], []
        for tag, payload in self.until_ready():
            if tag == b"D":
                rows.append(decode_datarow(payload))
            elif tag == b"E":
                errors.append(parse_error_fields(payload))
        return rows, errors

    def close(self) -> None:
        try:
            self.sock.sendall(terminate())
        except OSError:
            pass
        self.sock.close()


def decode_datarow(payload: bytes) -> list[bytes | None]:
    n = struct.unpack("!H", payload[:2])[0]
    i, cols = 2, []
    for _ in range(n):
        ln = struct.unpack("!i", payload[i:i + 4])[0]
        i += 4
        if ln < 0:
            cols.append(None)
        else:
            cols.append(payload[i:i + ln])
            i += ln
    return cols


# --------------------------------------------------------------------- login
class LoginError(Exception):
    def __init__(self, fields: dict[str, str]):
        super().__init__(f"{fields.get('C')}: {fields.get('M')}")
        self.fields = fields
        self.sqlstate = fields.get("C")


def login(host: str, port: int, user: str, database: str, password: str | None = None,
          timeout: float = DEFAULT_TIMEOUT, ssl_first: bool = False, **params: str) -> Session:
    """Open a connection and authenticate (trust, cleartext, md5 or SCRAM-SHA-256).

    Raises LoginError with the server's ErrorResponse fields on rejection.
    """
    sock = connect(host, port, timeout)
    try:
        if ssl_first:
            sock.sendall(ssl_request())
            answer = recv_exact(sock, 1)
            if answer != b"N":
                raise ProtocolError(f"SSLRequest answered {answer!r}, expected b'N'")
        sock.sendall(startup_message(user, database, **params))
        sess = Session(sock)
        scram: _Scram | None = None
        while True:
            tag, payload = sess.read()
            if tag == b"E":
                raise LoginError(parse_error_fields(payload))
            if tag == b"N":
                sess.notices.append(parse_error_fields(payload))
            elif tag == b"R":
                code = struct.unpack("!I", payload[:4])[0]
                if code == 0:  # AuthenticationOk
                    pass
                elif code == 3:  # cleartext
                    if password is None:
                        raise ProtocolError("server asked for a password; none given")
                    sess.send(msg(b"p", cstr(password)))
                elif code == 5:  # md5
                    salt = payload[4:8]
                    inner = hashlib.md5((password + user).encode()).hexdigest()
                    outer = hashlib.md5(inner.encode() + salt).hexdigest()
                    sess.send(msg(b"p", cstr("md5" + outer)))
                elif code == 10:  # SASL
                    mechs = [m.decode() for m in payload[4:].split(b"\x00") if m]
                    if "SCRAM-SHA-256" not in mechs:
                        raise ProtocolError(f"no SCRAM-SHA-256 in {mechs}")
                    if password is None:
                        raise ProtocolError("server asked for SCRAM; no password given")
                    scram = _Scram(password)
                    first = scram.client_first().encode()
                    sess.send(msg(b"p", cstr("SCRAM-SHA-256") + struct.pack("!i", len(first)) + first))
                elif code == 11:  # SASLContinue
                    assert scram is not None
                    sess.send(msg(b"p", scram.client_final(payload[4:].decode()).encode()))
                elif code == 12:  # SASLFinal
                    assert scram is not None
                    scram.verify_server(payload[4:].decode())
                else:
                    raise ProtocolError(f"unsupported auth request {code}")
            elif tag == b"S":
                k, v, _ = payload.split(b"\x00", 2)
                sess.params[k.decode()] = v.decode()
            elif tag == b"K":
                sess.pid = struct.unpack("!I", payload[:4])[0]
                sess.key = payload[4:]
            elif tag == b"v":  # NegotiateProtocolVersion
                pass
            elif tag == b"Z":
                return sess
            else:
                raise ProtocolError(f"unexpected message {tag!r} during login")
    except BaseException:
        sock.close()
        raise


class _Scram:
    """SCRAM-SHA-256 client (RFC 5802/7677), no channel binding, as libpq sends it."""

    def __init__(self, password: str):
        self.password = password.encode()
        self.nonce = base64.b64encode(os.urandom(18)).decode()
        self.first_bare = f"n=,r={self.nonce}"
        self.server_sig = b""

    def client_first(self) -> str:
        return "n,," + self.first_bare

    def client_final(self, server_first: str) -> str:
        attrs = dict(kv.split("=", 1) for kv in server_first.split(","))
        r, salt, iters = attrs["r"], base64.b64decode(attrs["s"]), int(attrs["i"])
        if not r.startswith(self.nonce):
            raise ProtocolError("server nonce does not extend client nonce")
        salted = hashlib.pbkdf2_hmac("sha256", self.password, salt, iters)
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        stored_key = hashlib.sha256(client_key).digest()
        without_proof = f"c=biws,r={r}"
        auth_msg = f"{self.first_bare},{server_first},{without_proof}".encode()
        client_sig = hmac.new(stored_key, auth_msg, hashlib.sha256).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, client_sig))
        server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
        self.server_sig = hmac.new(server_key, auth_msg, hashlib.sha256).digest()
        return f"{without_proof},p={base64.b64encode(proof).decode()}"

    def verify_server(self, server_final: str) -> None:
        attrs = dict(kv.split("=", 1) for kv in server_final.split(","))
        if base64.b64decode(attrs.get("v", "")) != self.server_sig:
            raise ProtocolError("SCRAM server signature mismatch")
