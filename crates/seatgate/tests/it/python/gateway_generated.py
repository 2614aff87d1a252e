"""The gateway through a client generated from docs/openapi.json.

Run by tests/it/gateway.rs after `openapi-python-client generate`: the
generated package is imported as it was written, and drives a seat's whole
life (acquire, a second user's wait granted when the first releases,
heartbeats, releases), then a borrow whose token PyJWT verifies with the
gateway's published keys and refuses once one byte is changed.

Environment: SEATGATE_CLIENT_DIR (where the package was generated),
SEATGATE_GATEWAY (https://127.0.0.1:port), SEATGATE_CA (the CA's PEM file),
SEATGATE_ADA and SEATGATE_BOB (gateway tokens), SEATGATE_LICENSE (1 seat),
SEATGATE_BORROW_LICENSE (borrowing allowed).
"""

import json
import os
import sys
import uuid

sys.path.insert(0, os.environ["SEATGATE_CLIENT_DIR"])

import jwt  # PyJWT
from seatgate_gateway_client import AuthenticatedClient
from seatgate_gateway_client.api.borrow import jwks
from seatgate_gateway_client.api.seats import acquire, events, heartbeat, release
from seatgate_gateway_client.models import AcquireBody, Problem, SeatResponse, SessionResponse

GATEWAY = os.environ["SEATGATE_GATEWAY"]
CA = os.environ["SEATGATE_CA"]
LICENSE = os.environ["SEATGATE_LICENSE"]
BORROW = os.environ["SEATGATE_BORROW_LICENSE"]


def client(token):
    return AuthenticatedClient(base_url=GATEWAY, token=token, verify_ssl=CA, raise_on_unexpected_status=True)


ada = client(os.environ["SEATGATE_ADA"])
bob = client(os.environ["SEATGATE_BOB"])

# ada takes the one seat.
r = acquire.sync_detailed(LICENSE, client=ada, body=AcquireBody(session="py-ada"), idempotency_key=str(uuid.uuid4()))
assert r.status_code == 201 and isinstance(r.parsed, SeatResponse), r
ada_seat = r.parsed
print(f"ada: {r.status_code} {ada_seat.status} {ada_seat.seats_used}/{ada_seat.seats_total}")

# bob waits: QUEUED, with the events link.
key = str(uuid.uuid4())
r = acquire.sync_detailed(LICENSE, client=bob, body=AcquireBody(session="py-bob", wait_ms=60000), idempotency_key=key)
assert r.status_code == 202 and r.parsed.status == "QUEUED", r
bob_wait = r.parsed
print(f"bob: {r.status_code} {bob_wait.status} position {bob_wait.position}")
# The same request again (a lost answer): the same place, the same lease.
r = acquire.sync_detailed(LICENSE, client=bob, body=AcquireBody(session="py-bob", wait_ms=60000), idempotency_key=key)
assert r.status_code == 202 and r.parsed.lease == bob_wait.lease, r
print("bob again with the same Idempotency-Key: 202, the same lease")

r = heartbeat.sync_detailed(LICENSE, "py-ada", client=ada, seatgate_lease=ada_seat.lease)
assert r.status_code == 200 and isinstance(r.parsed, SessionResponse), r
print(f"ada heartbeat: {r.parsed.status}, heartbeat_timeout_ms {r.parsed.heartbeat_timeout_ms}")
r = heartbeat.sync_detailed(LICENSE, "py-ada", client=ada, seatgate_lease="0" * 32)
assert r.status_code == 403 and isinstance(r.parsed, Problem) and r.parsed.code == "LEASE_MISMATCH", r
print(f"ada heartbeat with another lease: {r.status_code} {r.parsed.code}")

# ada releases; bob's events say granted.
r = release.sync_detailed(LICENSE, "py-ada", client=ada, seatgate_lease=ada_seat.lease)
assert r.status_code == 200 and r.parsed.status == "RELEASED", r
after = bob_wait.events.split("after=")[1]
got = []
with bob.get_httpx_client().stream(
    "GET", f"/v1/licenses/{LICENSE}/seats/py-bob/events", params={"after": after}, timeout=15
) as stream:
    kind = None
    for line in stream.iter_lines():
        if line.startswith("event: "):
            kind = line[len("event: "):]
        elif line.startswith("data: "):
            got.append((kind, json.loads(line[len("data: "):])))
            if kind == "granted":
                break
print("bob's events:", [k for k, _ in got])
assert got[-1][0] == "granted" and got[-1][1]["session"] == "py-bob", got
r = heartbeat.sync_detailed(LICENSE, "py-bob", client=bob, seatgate_lease=bob_wait.lease)
assert r.status_code == 200, r
r = release.sync_detailed(LICENSE, "py-bob", client=bob, seatgate_lease=bob_wait.lease)
assert r.status_code == 200 and r.parsed.status == "RELEASED", r
print("bob heartbeat and release: 200, 200")
# The generated `events` call exists too (an SSE body is text to it).
assert callable(events.sync_detailed)

# A borrow, verified offline with PyJWT and the published keys.
r = acquire.sync_detailed(
    BORROW, client=ada, body=AcquireBody(session="py-laptop", borrow_ms=3600000, hardware_id="hw-9c2e")
)
assert r.status_code == 201 and r.parsed.borrow_token, r
token = r.parsed.borrow_token
keys = jwks.sync_detailed(client=ada)
assert keys.status_code == 200, keys
keyset = jwt.PyJWKSet.from_dict(json.loads(keys.content))
kid = jwt.get_unverified_header(token)["kid"]
key = keyset[kid]
claims = jwt.decode(token, key.key, algorithms=["EdDSA"], issuer="seatgate")
assert claims["license"] == BORROW and claims["hardware_id"] == "hw-9c2e" and claims["sub"] == "ada", claims
assert claims["exp"] == r.parsed.borrowed_until_ms // 1000, claims
print(f"borrow token verified by PyJWT {jwt.__version__}: license={claims['license']} sub={claims['sub']} hardware_id={claims['hardware_id']} exp={claims['exp']}")
head, payload, sig = token.split(".")
i = len(payload) // 2
changed = payload[:i] + ("A" if payload[i] != "A" else "B") + payload[i + 1:]
try:
    jwt.decode(".".join([head, changed, sig]), key.key, algorithms=["EdDSA"], issuer="seatgate")
except jwt.InvalidTokenError as e:
    print(f"one byte changed: refused ({type(e).__name__})")
else:
    raise AssertionError("a changed borrow token verified")
print("OK")
