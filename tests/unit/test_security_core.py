"""The pure security core: role parsing, authorization decisions (a table), tokens signed and
refused (expired, tampered, other key, wrong algorithm), certificate principals, sealed passwords."""

from __future__ import annotations

import time

import jwt
import pytest

from bookkeeper.errors import AuthenticationError, ConfigError
from bookkeeper.security.authz import ANONYMOUS, Action, Principal, Role, decide, parse_role
from bookkeeper.security.settings import SEALED_PREFIX, SecuritySettings, seal_new_password, unseal_password
from bookkeeper.security.tokens import TokenKey, TokenVerifier, certificate_principal, create_token

SECRET = TokenKey("HS256", b"s" * 32)


def principal(*roles: str) -> Principal:
    return Principal("p", frozenset(parse_role(role) for role in roles))


@pytest.mark.parametrize("roles, action, namespace, allowed", [
    (["produce:orders"], Action.ADD, "orders", True),
    (["produce:orders"], Action.ADD, "billing", False),
    (["produce:orders"], Action.FENCE, "orders", True),
    (["produce:orders"], Action.READ, "orders", True),
    (["consume:orders"], Action.READ, "orders", True),
    (["consume:orders"], Action.ADD, "orders", False),
    (["consume:orders"], Action.FENCE, "orders", False),
    (["consume:orders"], Action.WRITE_LAC, "orders", False),
    (["consume:orders"], Action.READ, "billing", False),
    (["admin:orders"], Action.METADATA_ADMIN, "orders", True),
    (["consume:orders"], Action.SUBSCRIBE, "orders", True),  # Kafka consumer groups commit subscriptions
    (["admin:orders"], Action.SUBSCRIBE, "orders", True),
    (["produce:orders"], Action.SUBSCRIBE, "orders", False),  # producers only read subscriptions
    (["consume:shop"], Action.SUBSCRIBE, "orders", False),
    (["admin:orders"], Action.METADATA_ADMIN, "billing", False),
    (["admin:orders"], Action.BOOKIE_ADMIN, None, False),
    (["produce:orders"], Action.ADD, None, False),  # a ledger of no namespace: admins only
    (["admin"], Action.ADD, None, True),
    (["admin"], Action.BOOKIE_ADMIN, None, True),
    (["bookie"], Action.REGISTER, None, True),
    (["bookie"], Action.READ, "orders", True),  # re-replication copies
    (["bookie"], Action.BOOKIE_ADMIN, None, False),
    (["bookie"], Action.FENCE, "orders", True),  # auto-recovery closes abandoned ledgers
    ([], Action.INFO, None, True),
    ([], Action.READ, "orders", False),
])
def test_decisions(roles, action, namespace, allowed):
    reason = decide(principal(*roles), action, namespace)
    assert (reason is None) == allowed
    if not allowed:
        assert "may not" in reason


def test_anonymous_is_only_an_explicit_superuser():
    assert decide(ANONYMOUS, Action.BOOKIE_ADMIN) is None


@pytest.mark.parametrize("text", ["", "produce", "reader:orders", "produce:", "produce:a/b", "x" * 300])
def test_bad_roles_are_refused_with_the_right_form(text):
    with pytest.raises(ConfigError, match="bad role"):
        parse_role(text)


def test_a_token_round_trips_to_its_principal():
    token = create_token(SECRET, "app", ["produce:orders", "consume:orders"], ttl_s=60)
    found = TokenVerifier(SECRET).verify(token)
    assert found.name == "app"
    assert found.roles == {Role("produce", "orders"), Role("consume", "orders")}
    assert found.expires_s is not None and found.expires_s > time.time()


def test_expired_tampered_and_foreign_tokens_are_refused():
    verifier = TokenVerifier(SECRET)
    expired = create_token(SECRET, "app", ["admin"], ttl_s=1, now_s=time.time() - 3600)
    with pytest.raises(AuthenticationError, match="expired"):
        verifier.verify(expired)
    good = create_token(SECRET, "app", ["consume:orders"])
    header, claims, signature = good.split(".")
    forged_claims = jwt.utils.base64url_encode(
        b'{"sub":"app","roles":["admin"],"iss":"dlog","iat":1}').decode()
    with pytest.raises(AuthenticationError, match="signature"):
        verifier.verify(f"{header}.{forged_claims}.{signature}")
    other = create_token(TokenKey("HS256", b"o" * 32), "app", ["admin"])
    with pytest.raises(AuthenticationError, match="signature"):
        verifier.verify(other)
    unsigned = jwt.encode({"sub": "app", "roles": ["admin"], "iss": "dlog", "iat": 1}, None,
                          algorithm="none")
    with pytest.raises(AuthenticationError):
        verifier.verify(unsigned)
    with pytest.raises(AuthenticationError):
        verifier.verify(b"\xff\xfe")


def test_key_pair_tokens_verify_with_the_public_key_only(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    for algorithm, private in (("ES256", ec.generate_private_key(ec.SECP256R1())),
                               ("RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048))):
        private_pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption())
        public_pem = private.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo)
        (tmp_path / "private.pem").write_bytes(private_pem)
        (tmp_path / "public.pem").write_bytes(public_pem)
        signing = TokenKey.from_file(tmp_path / "private.pem")
        assert signing.algorithm == algorithm
        token = create_token(signing, "svc", ["produce:a"], ttl_s=60)
        assert TokenVerifier(TokenKey.from_file(tmp_path / "public.pem")).verify(token).name == "svc"
        # an HS256 token "signed" with the public key text is refused (algorithm confusion)
        with pytest.raises(AuthenticationError):
            TokenVerifier(TokenKey.from_file(tmp_path / "public.pem")).verify(
                create_token(TokenKey("HS256", b"x" * 32), "svc", ["admin"]))


def test_certificate_principals_take_roles_from_the_organizational_unit():
    subject = ((("commonName", "writer-1"),), (("organizationalUnitName", "dlog-role=produce:orders"),))
    found = certificate_principal({"subject": subject})
    assert found.name == "cert:writer-1" and found.roles == {Role("produce", "orders")}
    with pytest.raises(AuthenticationError):
        certificate_principal(None)


def test_stream_passwords_are_sealed_and_need_the_namespace_credentials():
    settings = SecuritySettings(zk_user="ns.orders", zk_password="p" * 32)
    stored, password = seal_new_password(settings.seal_key("orders"))
    assert stored.startswith(SEALED_PREFIX) and password not in stored
    assert unseal_password(stored, settings.seal_key("orders")) == password
    admin = SecuritySettings(zk_user="admin", zk_password="a", cluster_secret=b"c" * 32)
    assert unseal_password(stored, admin.seal_key("orders")) != password  # other credentials
    with pytest.raises(ConfigError, match="sealed"):
        unseal_password(stored, None)
    assert unseal_password("clear-legacy", None) == "clear-legacy"


def test_the_write_bucket_paces_to_its_rate_with_a_one_second_burst():
    from bookkeeper.security.quota import DELAY_S_MAX, TokenBucket

    bucket = TokenBucket(1000, now_s=0.0)
    assert bucket.charge(1000, 0.0) == 0.0  # the burst
    assert bucket.charge(500, 0.0) == pytest.approx(0.5)  # 500 bytes over: wait half a second
    assert bucket.charge(0, 0.5) == 0.0  # refilled to zero debt
    assert bucket.charge(100_000, 0.5) == DELAY_S_MAX  # never one pause longer than the cap


@pytest.mark.parametrize("data", [b"not json", b'{"streams_max": -1}', b'{"write_bytes_per_s": "x"}'])
def test_bad_quota_nodes_are_refused(data):
    from bookkeeper.security.quota import Quota

    with pytest.raises(ConfigError, match="quota"):
        Quota.from_bytes(data)


def test_stream_slots_keep_the_oldest_streams_and_refuse_new_ones_beyond_the_quota():
    from bookkeeper.security.quota import StreamSlots

    slots = StreamSlots()
    assert slots.refusal("ns", "a", 10, 2) is None  # admitted here, counted at once
    assert slots.refusal("ns", "b", 12, 2) is None
    refused = slots.refusal("ns", "c", 14, 2)
    assert refused is not None and "streams_max 2" in refused and "'c'" in refused
    assert slots.refusal("ns", "a", 20, 2) is None  # a known stream's next ledger goes on
    assert slots.refusal("other", "c", 14, 2) is None  # quotas are per namespace
    # the cluster's view (published usage) ranks by first ledger: a third stream that another
    # bookie let in at the same time is the one refused everywhere
    slots.set_cluster({"ns": {"a": 10, "b": 12, "late": 13}})
    assert slots.refusal("ns", "late", 30, 2) is not None
    assert slots.refusal("ns", "b", 31, 2) is None
