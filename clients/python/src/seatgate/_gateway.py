"""The HTTP transport: the same seat handle through ``seatgate gateway``
(docs/gateway.md), with the standard library only (asyncio streams, ssl).
The credential decides the application, user and group; the gateway makes
the lease; a wait is followed on the seat's server-sent events,
reconnecting with Last-Event-ID."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Set, Tuple
from urllib.parse import quote, urljoin, urlsplit

from ._backend import AcquireSpec, Logger, SeatTarget, Timing
from .errors import CLOSED, GATEWAY_UNAVAILABLE, INVALID_ARGUMENT, TIMEOUT, SeatgateError, describe
from .wire import RETRY_LATER, Inbox, Received, Reply, now_ms, random_hex, sleep_ms

#: How long an HTTP call waits for its answer: above the gateway's reply_timeout_ms (10 s).
CALL_TIMEOUT_S = 15.0
#: The gateway's own codes, which are no answer about the seat: try again.
GATEWAY_TRANSIENT = frozenset({"UNAVAILABLE", "TIMEOUT", "RATE_LIMITED"})
#: The gateway's own refusals of the caller: no use trying again.
GATEWAY_FATAL = frozenset({"UNAUTHENTICATED", "FORBIDDEN", "MISDIRECTED", "BAD_REQUEST"})


def to_reply(body: Mapping[str, Any]) -> Dict[str, str]:
    """A JSON answer's fields as a wire reply: every value a string."""
    out: Dict[str, str] = {}
    for k, v in body.items():
        if v is None:
            continue
        if isinstance(v, str):
            out[k] = v
        elif isinstance(v, bool):
            out[k] = "1" if v else "0"
        elif isinstance(v, (int, float)):
            out[k] = str(v)
        else:
            out[k] = json.dumps(v, separators=(",", ":"))
    # A problem+json carries the wire status in `code` and the text in `detail`.
    if out.get("status", "").isdigit() and "code" in out:
        out["http_status"] = out["status"]
        out["status"] = out["code"]
        if "detail" in out:
            out["error"] = out["detail"]
    return out


def event_reply(event: str, data: Mapping[str, Any], session: str) -> Optional[Dict[str, str]]:
    """The wire reply an event of the waiting session stands for, if any."""
    fields = to_reply(data)
    if "session" in fields and fields["session"] != session:
        return None
    base = {**fields, "session": session, "op": "acquire"}
    if event == "granted":
        return {**base, "status": "GRANTED", "ok": "1"}
    if event == "acquired":
        return {**base, "status": "ACQUIRED", "ok": "1"}
    if event == "queued":
        return {**base, "status": "QUEUED", "ok": "0"}
    if event == "queue_timeout":
        why = fields.get("error") or f"waited {fields.get('waited_ms', '?')} ms without a seat"
        return {**base, "status": "QUEUE_TIMEOUT", "ok": "0", "error": why}
    if event == "revoked":
        why = f"revoked by {fields.get('actor', 'unknown')}: {fields.get('reason', '')}"
        return {**base, "status": "SESSION_REVOKED", "ok": "0", "error": why}
    if event == "left_queue":
        return {**base, "status": "LEFT_QUEUE", "ok": "0", "error": "the session left the queue"}
    if event == "denied":
        return {**base, "status": fields.get("reason") or "DENIED", "ok": "0", "error": f"denied: {fields.get('reason', '')}"}
    if event in ("evicted", "released"):
        why = f"the seat ended ({event} {fields.get('reason', '')})".strip()
        return {**base, "status": "SESSION_NOT_ACTIVE", "ok": "0", "error": why}
    return None


class _Response:
    def __init__(self, status: int, headers: Dict[str, str], reader: asyncio.StreamReader) -> None:
        self.status = status
        self.headers = headers
        self.reader = reader

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked, Content-Length or until EOF)."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await self.reader.readline()
                if not size_line:
                    return
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    await self.reader.readline()
                    return
                data = await self.reader.readexactly(size)
                await self.reader.readline()
                yield data
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await self.reader.read(min(left, 65536))
                if not data:
                    return
                left -= len(data)
                yield data
        else:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    return
                yield data

    async def body(self) -> bytes:
        parts: List[bytes] = []
        async for c in self.chunks():
            parts.append(c)
        return b"".join(parts)


class GatewayTransport:
    """HTTP/1.1 calls to the gateway, one connection each; SSE for waits."""

    def __init__(self, base_url: str, token: str, ca: Optional[str], timing: Timing, log: Logger) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("https", "http") or not u.hostname:
            raise SeatgateError(
                INVALID_ARGUMENT, f"the gateway's base_url must be https:// (or http:// on loopback), not {base_url}"
            )
        self._base = base_url if base_url.endswith("/") else base_url + "/"
        self._host = u.hostname
        self._port = u.port or (443 if u.scheme == "https" else 80)
        self._host_header = u.netloc.rsplit("@", 1)[-1]
        self._ssl: Optional[ssl.SSLContext] = None
        if u.scheme == "https":
            if ca is not None and "-----BEGIN" in ca:
                self._ssl = ssl.create_default_context(cadata=ca)
            elif ca is not None:
                if not os.path.exists(ca):
                    raise SeatgateError(INVALID_ARGUMENT, f"no CA file at {ca}")
                self._ssl = ssl.create_default_context(cafile=ca)
            else:
                self._ssl = ssl.create_default_context()
        self._token = token
        self._timing = timing
        self._log = log
        self.where = f"the gateway at {u.scheme}://{self._host_header}"
        self._open: Set[asyncio.StreamWriter] = set()
        self._follows: Set["asyncio.Task[None]"] = set()
        self._inboxes: Set[Inbox[Received]] = set()
        self._closing = False
        self._last_failure = ""

    async def _request(self, method: str, path: str, headers: Mapping[str, str], body: Optional[bytes]) -> Tuple[_Response, asyncio.StreamWriter]:
        if self._closing:
            raise SeatgateError(CLOSED, "the seatgate client is closed")
        url = urlsplit(urljoin(self._base, path.lstrip("/")))
        target = url.path + (f"?{url.query}" if url.query else "")
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self._host, self._port, ssl=self._ssl,
                                        server_hostname=self._host if self._ssl is not None else None),
                CALL_TIMEOUT_S,
            )
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as e:
            why = "no answer" if isinstance(e, asyncio.TimeoutError) else describe(e)
            raise SeatgateError(GATEWAY_UNAVAILABLE, f"cannot reach {self.where}: {why}") from e
        self._open.add(writer)
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._host_header}", f"Authorization: Bearer {self._token}",
                 "Connection: close", "User-Agent: seatgate-python/0.1.0"]
        hs = {"accept": "application/json", **{k.lower(): v for k, v in headers.items()}}
        if body is not None:
            hs["content-type"] = "application/json"
            hs["content-length"] = str(len(body))
        lines.extend(f"{k}: {v}" for k, v in hs.items())
        try:
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CALL_TIMEOUT_S)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError) as e:
            self._drop(writer)
            why = "no answer" if isinstance(e, asyncio.TimeoutError) else describe(e)
            raise SeatgateError(GATEWAY_UNAVAILABLE, f"{self.where}: {why}") from e
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        try:
            status = int(status_line.split(" ", 2)[1])
        except (IndexError, ValueError):
            self._drop(writer)
            raise SeatgateError(GATEWAY_UNAVAILABLE, f"{self.where} answered no HTTP: {status_line[:80]}") from None
        rh: Dict[str, str] = {}
        for line in header_lines:
            if ":" in line:
                k, v = line.split(":", 1)
                rh[k.strip().lower()] = v.strip()
        return _Response(status, rh, reader), writer

    def _drop(self, writer: asyncio.StreamWriter) -> None:
        self._open.discard(writer)
        try:
            writer.close()
        except Exception:
            pass

    async def _call(self, method: str, path: str, headers: Mapping[str, str], body: Any) -> Tuple[int, Dict[str, Any]]:
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode("utf-8")
        res, writer = await self._request(method, path, headers, payload)
        try:
            raw = await asyncio.wait_for(res.body(), CALL_TIMEOUT_S)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as e:
            raise SeatgateError(GATEWAY_UNAVAILABLE, f"{self.where}: {describe(e)}") from e
        finally:
            self._drop(writer)
        text = raw.decode("utf-8", "replace")
        try:
            parsed = json.loads(text) if text else {}
        except ValueError:
            parsed = {"detail": text}
        return res.status, parsed if isinstance(parsed, dict) else {}

    async def _call_until_answered(
        self, what: str, method: str, path: str, headers: Mapping[str, str], body: Any,
        until_ms: Optional[float], stop: Optional[asyncio.Event],
    ) -> Optional[Reply]:
        """Calls until an answer about the seat comes (a wire status, or a
        gateway refusal of the caller, which is raised); network failures
        and the gateway's own 503/504/429 are tried again after a pause.
        None at `until_ms` or when `stop` is set."""
        pause = 200.0
        while True:
            if stop is not None and stop.is_set():
                return None
            if until_ms is not None and now_ms() >= until_ms:
                return None
            try:
                status, parsed = await self._call(method, path, headers, body)
                reply = to_reply(parsed)
                code = reply.get("status", "")
                if status == 401 or (code in GATEWAY_FATAL and status >= 400):
                    raise SeatgateError(
                        GATEWAY_UNAVAILABLE,
                        f"{what} refused by {self.where}: {code or status} {reply.get('error', '')}".strip(), reply,
                    )
                undecided = status == 429 or code in GATEWAY_TRANSIENT or code == "REQUEST_EXPIRED" or (
                    status >= 500 and code == "")
                if not undecided:
                    return reply
                failure = f"{status} {code} {reply.get('error', '')}".strip()
            except SeatgateError as e:
                if e.code != GATEWAY_UNAVAILABLE or e.reply is not None:
                    raise
                if (stop is not None and stop.is_set()) or self._closing:
                    return None
                failure = e.message
            self._last_failure = failure
            self._log("warn", f"{what}: {failure}; trying again")
            left = pause if until_ms is None else min(pause, until_ms - now_ms())
            await sleep_ms(left, stop)
            pause = min(pause * 2, 2000.0)

    @staticmethod
    def _seat_path(license: str, session: Optional[str] = None) -> str:
        p = f"v1/licenses/{quote(license, safe='')}/seats"
        return p if session is None else f"{p}/{quote(session, safe='')}"

    def start_acquire(self, spec: AcquireSpec) -> "_GatewayAttempt":
        body: Dict[str, Any] = {"session": spec.session}
        if spec.meta is not None:
            body["meta"] = dict(spec.meta)
        if spec.wait_ms > 0:
            body["wait_ms"] = spec.wait_ms
        if spec.priority:
            body["priority"] = spec.priority
        if spec.borrow_ms:
            body["borrow_ms"] = spec.borrow_ms
        if spec.user is not None:
            body["user"] = spec.user
        if spec.group is not None:
            body["group"] = spec.group
        return _GatewayAttempt(self, spec, body)

    async def follow(self, link: str, lease: str, session: str, inbox: Inbox[Received], stop: asyncio.Event) -> None:
        """Follows a wait's events (SSE), reconnecting with Last-Event-ID,
        and pushes the wire reply each ending event stands for."""
        last_id = ""
        pause = 200.0
        while not stop.is_set() and not self._closing:
            try:
                headers = {"accept": "text/event-stream", "seatgate-lease": lease}
                if last_id:
                    headers["last-event-id"] = last_id
                res, writer = await self._request("GET", link, headers, None)
                try:
                    if res.status != 200:
                        raise SeatgateError(GATEWAY_UNAVAILABLE, f"events answered HTTP {res.status}")
                    buf = ""
                    async for chunk in res.chunks():
                        buf += chunk.decode("utf-8", "replace").replace("\r\n", "\n")
                        while "\n\n" in buf:
                            block, buf = buf.split("\n\n", 1)
                            ev_id, event, data = "", "", ""
                            for line in block.split("\n"):
                                if line.startswith("id:"):
                                    ev_id = line[3:].strip()
                                elif line.startswith("event:"):
                                    event = line[6:].strip()
                                elif line.startswith("data:"):
                                    data += line[5:].lstrip()
                            if ev_id:
                                last_id = ev_id
                            if not event:
                                continue  # a keep-alive comment
                            try:
                                parsed = json.loads(data or "{}")
                            except ValueError:
                                parsed = {}
                            reply = event_reply(event, parsed if isinstance(parsed, dict) else {}, session)
                            if reply is not None:
                                inbox.push(Received(reply, None))
                                if reply["status"] != "QUEUED":
                                    return
                finally:
                    self._drop(writer)
                pause = 200.0
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if stop.is_set() or self._closing:
                    return
                self._log("warn", f"following the wait of {session} on {self.where}: {describe(e)}; reconnecting")
            await sleep_ms(pause, stop)
            pause = min(pause * 2, 2000.0)

    def track_follow(self, task: "asyncio.Task[None]") -> None:
        self._follows.add(task)
        task.add_done_callback(self._follows.discard)

    @property
    def is_closing(self) -> bool:
        return self._closing

    @property
    def last_failure(self) -> str:
        return self._last_failure

    async def heartbeat(
        self, target: SeatTarget, stop: Optional[asyncio.Event], until_ms: Optional[float]
    ) -> Optional[Received]:
        reply = await self._call_until_answered(
            f"heartbeat {target.license}/{target.session}", "POST",
            f"{self._seat_path(target.license, target.session)}/heartbeat", {"seatgate-lease": target.lease}, None,
            until_ms, stop,
        )
        return None if reply is None else Received(reply, None)

    async def release(self, target: SeatTarget, until_ms: float) -> Optional[Reply]:
        while True:
            reply = await self._call_until_answered(
                f"release {target.license}/{target.session}", "DELETE",
                self._seat_path(target.license, target.session), {"seatgate-lease": target.lease}, None, until_ms, None,
            )
            if reply is None or reply.get("status", "") not in RETRY_LATER:
                return reply
            if now_ms() >= until_ms:
                return None
            await sleep_ms(max(10.0, self._timing.request_timeout_ms / 5))

    async def close(self) -> None:
        self._closing = True
        for inbox in list(self._inboxes):
            inbox.close()
        for task in list(self._follows):
            task.cancel()
        for writer in list(self._open):
            self._drop(writer)
        if self._follows:
            await asyncio.wait(list(self._follows), timeout=0.3)


class _GatewayAttempt:
    def __init__(self, t: GatewayTransport, spec: AcquireSpec, body: Dict[str, Any]) -> None:
        self._t = t
        self._spec = spec
        self._body = body
        # The same key on every try: the gateway derives the same lease and
        # answers the same seat (ALREADY_ACTIVE) or place (QUEUED).
        self._key = random_hex(16)
        self._lease = ""
        self._attempts = 0
        self._first_sent_at = 0.0
        self._inbox: Inbox[Received] = Inbox()
        self._stop = asyncio.Event()
        t._inboxes.add(self._inbox)

    @property
    def lease(self) -> str:
        return self._lease

    @property
    def attempts(self) -> int:
        return self._attempts

    @property
    def first_sent_at(self) -> float:
        return self._first_sent_at

    async def first(self, give_up_at: float, stop: Optional[asyncio.Event] = None) -> Optional[Received]:
        spec = self._spec
        self._first_sent_at = now_ms()
        self._attempts = 1
        reply = await self._t._call_until_answered(
            f"acquire {spec.license}/{spec.session}", "POST", self._t._seat_path(spec.license),
            {"idempotency-key": self._key}, self._body, give_up_at, stop,
        )
        if reply is None:
            if stop is not None and stop.is_set():
                return None
            last = f" (last: {self._t.last_failure})" if self._t.last_failure else ""
            raise SeatgateError(TIMEOUT, f"no answer to acquire {spec.license}/{spec.session} from {self._t.where}{last}")
        self._lease = reply.get("lease", "")
        if reply.get("status") == "QUEUED" and reply.get("events") and self._lease:
            self._t.track_follow(asyncio.ensure_future(
                self._t.follow(reply["events"], self._lease, spec.session, self._inbox, self._stop)))
        return Received(reply, None)

    async def next(self, until_ms: float, stop: Optional[asyncio.Event] = None) -> Optional[Received]:
        got = await self._inbox.next(until_ms, stop)
        if got is None and self._t.is_closing:
            raise SeatgateError(CLOSED, "the seatgate client is closed")
        return got

    def close(self) -> None:
        self._stop.set()
        self._inbox.close()
        self._t._inboxes.discard(self._inbox)
