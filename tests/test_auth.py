"""blobsdk.auth: signed tokens, chunk grants, keyrings, clock skew and key rotation."""

from __future__ import annotations

import base64
from pathlib import Path

import msgspec
import pytest

from blobsdk.auth import CLOCK_SKEW_S, Claims, Keyring, ServeKey, new_claims, read_claims
from blobsdk.errors import Forbidden, Unauthorized

NOW = 1_800_000_000.0
BLOCK = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def ring() -> Keyring:
    return Keyring.generate("k1")


def token(ring: Keyring, ttl: float = 600, now: float = NOW, **kw: object) -> str:
    return ring.sign_token(new_claims("acme", ("train",), ttl, now=now, **kw))  # type: ignore[arg-type]


def test_a_token_round_trips_its_claims(ring: Keyring) -> None:
    claims = ring.verify_token(token(ring), NOW)
    assert claims == Claims(tenant="acme", buckets=("train",), not_before=int(NOW), expires=int(NOW) + 600)
    assert claims.allows("train") and not claims.allows("eval") and not claims.all_buckets
    assert read_claims(token(ring)) == claims


def test_admin_and_star_tokens_allow_every_bucket(ring: Keyring) -> None:
    star = ring.verify_token(ring.sign_token(new_claims("acme", ("*",), 60, now=NOW)), NOW)
    admin = ring.verify_token(ring.sign_token(new_claims("ops", (), 60, admin=True, now=NOW)), NOW)
    assert star.allows("any") and star.all_buckets and not star.admin
    assert admin.allows("any") and admin.admin


def test_a_token_is_valid_within_the_clock_skew_and_not_beyond(ring: Keyring) -> None:
    t = token(ring, ttl=600)
    ring.verify_token(t, NOW - CLOCK_SKEW_S + 1)  # the issuer's clock runs a little ahead
    ring.verify_token(t, NOW + 600 + CLOCK_SKEW_S - 1)  # or behind
    with pytest.raises(Unauthorized, match=r"^bearer token is not valid before 2027-01-15T08:00:00Z \(server time .*30 s\)"):
        ring.verify_token(t, NOW - CLOCK_SKEW_S - 1)
    with pytest.raises(Unauthorized, match=r"^bearer token expired at 2027-01-15T08:10:00Z \(server time"):
        ring.verify_token(t, NOW + 600 + CLOCK_SKEW_S)
    ring.verify_token(t, NOW + 700, skew=120)  # a server may allow more skew


def test_a_tampered_token_is_refused(ring: Keyring) -> None:
    prefix, kid, payload, mac = token(ring).split(".")
    claims = msgspec.msgpack.decode(base64.urlsafe_b64decode(payload + "=="), type=Claims)
    wider = msgspec.structs.replace(claims, buckets=("*",), admin=True)
    forged = base64.urlsafe_b64encode(msgspec.msgpack.encode(wider)).rstrip(b"=").decode()
    cases = {
        f"{prefix}.{kid}.{forged}.{mac}": "bearer token signature does not verify",
        f"{prefix}.{kid}.{payload}.{mac[:-2]}AA": "bearer token signature does not verify",
        f"{prefix}.{kid}.{payload}.!!!": "bearer token signature does not verify",
        f"{prefix}.k9.{payload}.{mac}": "bearer token signed with unknown key id 'k9'",
        f"bst0.{kid}.{payload}.{mac}": "malformed bearer token",
        "plain-secret": "malformed bearer token",
        "": "malformed bearer token",
    }
    for bad, message in cases.items():
        with pytest.raises(Unauthorized, match="^" + message):
            ring.verify_token(bad, NOW)


def test_another_keyring_cannot_sign_for_this_one(ring: Keyring) -> None:
    with pytest.raises(Unauthorized, match="signature does not verify"):
        ring.verify_token(token(Keyring.generate("k1")), NOW)


def test_rotation_keeps_old_tokens_valid_until_the_old_key_is_dropped(ring: Keyring, tmp_path: Path) -> None:
    old = token(ring)
    rotated = ring.with_key("k2")
    assert rotated.active == "k2" and rotated.key_ids == ["k1", "k2"]
    new = token(rotated)
    assert new.split(".")[1] == "k2"
    for t in (old, new):
        rotated.verify_token(t, NOW)
    (tmp_path / "keys.toml").write_text(rotated.to_toml())
    text = (tmp_path / "keys.toml").read_text().replace(rotated.to_toml().split("\n")[3], "")  # drop k1's line
    (tmp_path / "keys.toml").write_text(text)
    retired = Keyring.load(tmp_path / "keys.toml")
    assert retired.key_ids == ["k2"]
    retired.verify_token(new, NOW)
    with pytest.raises(Unauthorized, match="unknown key id 'k1'"):
        retired.verify_token(old, NOW)


def test_a_grant_lets_one_tenant_read_one_range_until_it_expires(ring: Keyring) -> None:
    expires = int(NOW) + 900
    grant = ring.sign_grant("acme", BLOCK, 4096, 1000, expires)
    ring.verify_grant(grant, "acme", BLOCK, 4096, 1000, NOW)
    ring.verify_grant(grant, "acme", BLOCK, 4096, 1000, expires + CLOCK_SKEW_S - 1)
    refused = {
        ("other", BLOCK, 4096, 1000): "not for tenant 'other' and bytes 4096\\+1000",
        ("acme", "f" * 32, 4096, 1000): "not for tenant 'acme'",
        ("acme", BLOCK, 0, 1000): "not for tenant 'acme' and bytes 0\\+1000",
        ("acme", BLOCK, 4096, 1001): "not for tenant",
        ("acme", BLOCK, 4096, -1): "not for tenant",  # a whole-block GET
    }
    for (tenant, block, offset, length), message in refused.items():
        with pytest.raises(Forbidden, match=message):
            ring.verify_grant(grant, tenant, block, offset, length, NOW)
    with pytest.raises(Forbidden, match=r"^chunk grant expired at"):
        ring.verify_grant(grant, "acme", BLOCK, 4096, 1000, expires + CLOCK_SKEW_S)


def test_a_tampered_or_missing_grant_is_refused(ring: Keyring) -> None:
    kid, expires, mac = ring.sign_grant("acme", BLOCK, 0, 10, int(NOW) + 60).split(".")
    cases = {
        "": "a chunk grant \\(header X-Blobsdk-Grant\\) is needed to read block",
        f"{kid}.{int(expires) + 3600}.{mac}": "not for tenant",  # a later expiry
        f"k9.{expires}.{mac}": "malformed chunk grant",
        f"{kid}.-5.{mac}": "malformed chunk grant",
        f"{kid}.{expires}": "not for tenant",
        "garbage": "malformed chunk grant",
    }
    for grant, message in cases.items():
        with pytest.raises(Forbidden, match=message):
            ring.verify_grant(grant, "acme", BLOCK, 0, 10, NOW)


def test_a_grant_never_passes_for_a_token_or_back(ring: Keyring) -> None:
    """The MACs are domain-separated: neither can be cut out of the other."""
    t = token(ring)
    mac = t.split(".")[3]
    with pytest.raises(Forbidden):
        ring.verify_grant(f"k1.{int(NOW) + 60}.{mac}", "acme", BLOCK, 0, 10, NOW)


def test_keyring_files_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    cases = {
        "active = [": "is not valid TOML",
        'active = "k1"': "want active = KEY_ID and a \\[keys\\] table",
        'active = "k2"\n[keys]\nk1 = "' + "ab" * 32 + '"': "active key 'k2' is not in the keyring \\(k1\\)",
        'active = "k1"\n[keys]\nk1 = "abcd"': "key 'k1' is 2 bytes; at least 32 are needed",
        'active = "k1"\n[keys]\nk1 = "zz"': "key 'k1' is not hex",
        'active = "k1"\n[keys]\nk1 = 5': "key 'k1' is 0 bytes",
        'active = "k 1"\n[keys]\n"k 1" = "' + "ab" * 32 + '"': "key id 'k 1': want 1-32 letters",
        'active = "k1"\nextra = 1\n[keys]\nk1 = "' + "ab" * 32 + '"': "unknown keys \\['extra'\\]",
        'active = "k1"\n[keys]\n': "a keyring needs at least one key",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            Keyring.load(path)
    with pytest.raises(ValueError, match=r"cannot read keyring .*No such file"):
        Keyring.load(tmp_path / "missing.toml")


def test_a_keyring_round_trips_and_never_shows_its_secrets(ring: Keyring, tmp_path: Path) -> None:
    (tmp_path / "k.toml").write_text(ring.to_toml())
    loaded = Keyring.load(tmp_path / "k.toml")
    loaded.verify_token(token(ring), NOW)
    assert repr(loaded) == "Keyring(keys=['k1'], active='k1')"
    with pytest.raises(ValueError, match="already in the keyring"):
        ring.with_key("k1")


@pytest.mark.parametrize(
    ("tenant", "buckets", "ttl", "admin", "message"),
    [
        ("", ("b",), 60, False, "tenant '': want 1-64 letters"),
        ("a/b", ("b",), 60, False, "tenant 'a/b'"),
        ("default", ("b",), 60, False, "tenant name 'default' is reserved for a server's static --token"),
        ("acme", (), 60, False, "a token needs at least one bucket"),
        ("acme", ("b/c",), 60, False, "bucket 'b/c'"),
        ("acme", ("b",), 0, False, "ttl must be a positive number of seconds, got 0"),
        ("acme", ("b",), float("inf"), False, "ttl must be a positive number"),
        ("acme", ("b",), float("nan"), False, "ttl must be a positive number"),
    ],
)
def test_bad_claims_are_refused_before_signing(
    tenant: str, buckets: tuple[str, ...], ttl: float, admin: bool, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        new_claims(tenant, buckets, ttl, admin=admin, now=NOW)


def test_read_claims_refuses_what_is_not_a_token() -> None:
    with pytest.raises(ValueError, match="not a signed blobsdk token"):
        read_claims("s3cret")


# --- serve tickets (the peer tier) -------------------------------------------------------------


def test_a_serve_ticket_lets_one_tenant_fetch_one_key_from_one_peer_until_it_expires() -> None:
    key, other = ServeKey.generate(), ServeKey.generate()
    ticket = key.ticket("alice", "k1", expires=1000)
    key.verify(ticket, "alice", "k1", now=999.0, skew=0)
    with pytest.raises(Unauthorized, match=r"a serve ticket from the tracker \(header X-Blobsdk-Ticket\) is needed"):
        key.verify("", "alice", "k1", now=999.0)
    for tenant, chunk, peer in (("bob", "k1", key), ("alice", "k2", key), ("alice", "k1", other)):
        with pytest.raises(Forbidden, match=f"the serve ticket is not this peer's for tenant '{tenant}' and chunk {chunk}"):
            peer.verify(ticket, tenant, chunk, now=999.0)
    with pytest.raises(Forbidden, match="serve ticket expired at 1970-01-01T00:16:40Z"):
        key.verify(ticket, "alice", "k1", now=1000.0, skew=0)
    for malformed in ("x.abc", "-5.abc", "9" * 13 + ".abc"):
        with pytest.raises(Forbidden, match="malformed serve ticket"):
            key.verify(malformed, "alice", "k1", now=999.0)
    assert repr(key) == "ServeKey(...)" and key.hex not in repr(key)
    with pytest.raises(ValueError, match="invalid serve key: a serve key is 4 bytes"):
        ServeKey.from_hex("ab" * 4)


def test_a_token_mac_never_passes_for_a_grant_mac_of_the_same_key_and_message():
    """The purpose in the MAC is domain separation: the same key and bytes signed as a token
    and as a grant give unrelated MACs (a mutant without it survived every other test)."""
    ring = Keyring.generate("k1")
    message = b"tenant.block.0.100.1700000000"
    token_mac, grant_mac = ring._mac("k1", b"token", message), ring._mac("k1", b"grant", message)
    assert token_mac != grant_mac and token_mac[: len(grant_mac) // 2] != grant_mac[: len(grant_mac) // 2]
    assert ring._mac("k1", b"token", message) == token_mac  # deterministic: the difference is the purpose
