"""The SDK's HTTP layer: configuration from the environment, REST calls,
and the two Connect RPC shapes the agent API speaks (unary JSON, and
server streaming with the Connect envelope), on the standard library's
http.client. One connection per request, so every object is safe to use
from several threads."""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import os
import ssl
import struct
import urllib.parse
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple, Union

from .errors import APIError, CorralError, error_for, error_from_response

DEFAULT_URL = "http://127.0.0.1:7420"
"""The server URL used when neither ``url`` nor ``CORRAL_URL`` is given."""

DEFAULT_DATA_DIR = "/var/lib/corral"
"""Where ``admin.key`` of a local server is looked for (``CORRAL_DATA``)."""

DEFAULT_TIMEOUT = 60.0
"""Seconds a REST call may take (connect and each read)."""

STREAM_READ_TIMEOUT = 120.0
"""Seconds a command stream may stay silent: the agent sends a keepalive
every 30 s (``Keepalive-Ping-Interval``), so a longer silence means the
connection is gone."""

MAX_ERROR_BODY = 64 << 10
MAX_MESSAGE = 16 << 20  # the control plane's bound on one agent message
USER_AGENT = "corral-python"

# Connect envelope flags.
_FLAG_COMPRESSED = 0x01
_FLAG_END_STREAM = 0x02


class StreamBroken(CorralError):
    """A stream ended without its end message (the connection was cut,
    as the server does when the sandbox ends under a running command)."""


def is_local_url(url: str) -> bool:
    """Reports whether url's host is 127.0.0.1, ::1 or localhost."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_admin_key(url: str, data_dir: Optional[str] = None) -> str:
    """Reads the admin key of a local server from ``DATA/admin.key``, as
    the CLI does; a remote server's key is not on this machine."""
    if not is_local_url(url):
        raise CorralError(f"no API key for {url}: set CORRAL_API_KEY")
    path = os.path.join(data_dir or DEFAULT_DATA_DIR, "admin.key")
    try:
        with open(path, encoding="utf-8") as f:
            key = f.read().strip()
    except OSError as e:
        raise CorralError(f"no API key: set CORRAL_API_KEY or make {path} readable: {e}") from None
    if not key:
        raise CorralError(f"no API key: {path} is empty")
    return key


class Transport:
    """Talks to one corral server with one API key."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None,
                 ca_file: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT,
                 data_dir: Optional[str] = None) -> None:
        url = url or os.environ.get("CORRAL_URL") or DEFAULT_URL
        self.url = url.rstrip("/")
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CorralError(f"server URL {url!r}: want http://HOST:PORT or https://HOST:PORT")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self.api_key = api_key or os.environ.get("CORRAL_API_KEY") or \
            local_admin_key(self.url, data_dir or os.environ.get("CORRAL_DATA"))
        self.timeout = timeout
        self._ssl: Optional[ssl.SSLContext] = None
        if self._scheme == "https":
            ca_file = ca_file or os.environ.get("CORRAL_CA_FILE") or None
            ctx = ssl.create_default_context(cafile=ca_file)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            self._ssl = ctx

    # -- plumbing ---------------------------------------------------------

    def _conn(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        t = self.timeout if timeout is None else timeout
        if self._ssl is not None:
            return http.client.HTTPSConnection(self._host, self._port, timeout=t, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=t)

    def _target(self, path: str, query: Optional[Mapping[str, Any]] = None) -> str:
        target = self._prefix + path
        if query:
            items = []
            for k, v in query.items():
                if v is None:
                    continue
                if isinstance(v, (list, tuple)):
                    items.extend((k, str(x)) for x in v)
                else:
                    items.append((k, str(v)))
            if items:
                target += "?" + urllib.parse.urlencode(items)
        return target

    def open(self, method: str, path: str, *, query: Optional[Mapping[str, Any]] = None,
             body: Any = None, headers: Optional[Mapping[str, str]] = None,
             timeout: Optional[float] = None) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Sends a request and returns the connection and its (2xx)
        response, whose body the caller reads and then closes with the
        connection. A non-2xx answer is raised as its typed error."""
        h = {"X-API-Key": self.api_key, "User-Agent": USER_AGENT}
        if headers:
            h.update(headers)
        conn = self._conn(timeout)
        try:
            conn.request(method, self._target(path, query), body=body, headers=h)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise CorralError(f"{method} {self.url}{path}: {e}") from e
        if not 200 <= resp.status <= 299:
            try:
                data = resp.read(MAX_ERROR_BODY)
            except (OSError, http.client.HTTPException):
                data = b""
            conn.close()
            raise error_from_response(resp.status, resp.headers, data)
        return conn, resp

    def call(self, method: str, path: str, body: Any = None, *,
             query: Optional[Mapping[str, Any]] = None,
             timeout: Optional[float] = None) -> Any:
        """A REST call: body (if not None) is sent as JSON; the JSON answer
        is returned decoded (None for an empty one)."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn, resp = self.open(method, path, query=query, body=data, headers=headers, timeout=timeout)
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise CorralError(f"{method} {path}: reading the answer: {e}") from e
        finally:
            conn.close()
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise CorralError(f"{method} {path}: the answer is not JSON: {e}") from e

    # -- Connect RPC ------------------------------------------------------

    def unary(self, path: str, msg: Mapping[str, Any], *, user: Optional[str] = None,
              timeout: Optional[float] = None) -> Dict[str, Any]:
        """A unary Connect call with the JSON codec (POST, application/json)."""
        headers = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
        _set_user(headers, user)
        conn, resp = self.open("POST", path, body=json.dumps(msg).encode(), headers=headers, timeout=timeout)
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise CorralError(f"POST {path}: reading the answer: {e}") from e
        finally:
            conn.close()
        return json.loads(raw) if raw.strip() else {}

    def server_stream(self, path: str, msg: Mapping[str, Any], *, user: Optional[str] = None,
                      timeout_ms: Optional[int] = None,
                      headers: Optional[Mapping[str, str]] = None) -> "ConnectStream":
        """Opens a server-streaming Connect call with the JSON codec: the
        request is one envelope (flag byte, 4-byte big-endian length,
        JSON); the answer is envelopes until the end-stream one."""
        h = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
        if timeout_ms:
            h["Connect-Timeout-Ms"] = str(max(1, int(timeout_ms)))
        _set_user(h, user)
        if headers:
            h.update(headers)
        conn, resp = self.open("POST", path, body=envelope(msg), headers=h, timeout=STREAM_READ_TIMEOUT)
        return ConnectStream(conn, resp)


def _set_user(headers: Dict[str, str], user: Optional[str]) -> None:
    # The agent reads the user of a call from Basic auth with an empty
    # password (envd's convention); the API key travels in X-API-Key.
    if user:
        headers["Authorization"] = "Basic " + base64.b64encode((user + ":").encode()).decode()


def envelope(msg: Mapping[str, Any], flags: int = 0) -> bytes:
    """Encodes one Connect streaming envelope of a JSON message."""
    data = json.dumps(msg).encode()
    return struct.pack(">BI", flags, len(data)) + data


class ConnectStream:
    """The messages of a server-streaming Connect answer.

    Iterating yields each message (a dict). The end-stream envelope ends
    the iteration, or raises its error as a typed :class:`APIError`; a
    connection that ends without one raises :class:`StreamBroken`."""

    def __init__(self, conn: http.client.HTTPConnection, resp: Any) -> None:
        self._conn = conn
        self._resp = resp

    def _read(self, n: int) -> bytes:
        try:
            data = self._resp.read(n)
        except http.client.IncompleteRead as e:
            raise StreamBroken("the stream was cut") from e
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise StreamBroken(f"the stream broke: {e}") from e
        if len(data) < n:
            raise StreamBroken("the stream ended without its end message")
        return data

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return read_envelopes(self._read)

    def close(self) -> None:
        """Closes the connection (the server sees the client go away)."""
        try:
            self._conn.close()
        except OSError:
            pass


def read_envelopes(read) -> Iterator[Dict[str, Any]]:
    """Decodes Connect envelopes with read(n) (which returns exactly n
    bytes or raises StreamBroken) until the end-stream envelope."""
    while True:
        head = read(5)
        flags, length = struct.unpack(">BI", head)
        if length > MAX_MESSAGE:
            raise StreamBroken(f"a stream message of {length} bytes is over the {MAX_MESSAGE}-byte bound")
        if flags & _FLAG_COMPRESSED:
            raise StreamBroken("a compressed stream message (none was asked for)")
        data = read(length) if length else b""
        if flags & _FLAG_END_STREAM:
            end = json.loads(data) if data.strip() else {}
            err = end.get("error") if isinstance(end, dict) else None
            if err:
                raise error_for(str(err.get("code") or "unknown"), str(err.get("message") or ""))
            return
        yield json.loads(data) if data else {}


def b64decode(s: Union[str, bytes, None]) -> bytes:
    """Decodes protobuf JSON bytes (standard or URL-safe base64, padding
    optional)."""
    if not s:
        return b""
    if isinstance(s, bytes):
        s = s.decode("ascii")
    s = s.replace("-", "+").replace("_", "/")
    return base64.b64decode(s + "=" * (-len(s) % 4))


def quote(s: str) -> str:
    """Escapes one path segment."""
    return urllib.parse.quote(s, safe="")


__all__ = ["Transport", "ConnectStream", "StreamBroken", "DEFAULT_URL", "DEFAULT_DATA_DIR",
           "is_local_url", "local_admin_key", "envelope", "read_envelopes", "b64decode", "APIError"]
