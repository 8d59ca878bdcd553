"""What the local cloud fakes (``gcpfake``, ``azurefake``) need of an identity provider
(dev tool, F-NODE-6): RS256 JWTs checked against known keys, and access tokens issued and
checked.

The SDKs' own credential chains run unchanged against the fakes: Azure's workload identity
presents a Kubernetes service account token (checked against the cluster's JWKS, as Entra
ID checks a federated credential against its issuer), and a GCP service account signs its
own JWT (checked against the key the fake was given, as Google checks a key it issued).
One home for both, so neither fake carries a copy.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

LEEWAY = 60.0  # seconds of clock skew a JWT's times are allowed


class InvalidToken(Exception):
    """A JWT or bearer token that proves nothing; the message says why (as the fakes answer)."""


def _b64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def jwt_parts(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, claims) of a JWT, unchecked."""
    parts = token.split(".")
    if len(parts) != 3:
        raise InvalidToken("not a JWT (want three dot-separated parts)")
    try:
        return json.loads(_b64(parts[0])), json.loads(_b64(parts[1]))
    except ValueError as err:
        raise InvalidToken(f"not a JWT: {err}") from None


def jwks_keys(jwks: Mapping[str, Any]) -> dict[str, rsa.RSAPublicKey]:
    """The RSA keys of a JSON Web Key Set (e.g. the API server's /openid/v1/jwks), by key id."""
    keys = {}
    for key in jwks.get("keys") or []:
        if key.get("kty") == "RSA":
            numbers = rsa.RSAPublicNumbers(
                int.from_bytes(_b64(key["e"]), "big"), int.from_bytes(_b64(key["n"]), "big")
            )
            keys[str(key.get("kid", ""))] = numbers.public_key()
    return keys


def verify_jwt(
    token: str, keys: Mapping[str, rsa.RSAPublicKey], clock: Callable[[], float] = time.time
) -> dict[str, Any]:
    """The claims of an RS256 JWT signed by one of ``keys`` (by its ``kid``) and valid now."""
    header, claims = jwt_parts(token)
    if header.get("alg") != "RS256":
        raise InvalidToken(f"signing algorithm {header.get('alg')!r} is not RS256")
    key = keys.get(str(header.get("kid", "")))
    if key is None:
        raise InvalidToken(f"signed with key {header.get('kid')!r}, which is not known")
    signed, _, signature = token.rpartition(".")
    try:
        key.verify(_b64(signature), signed.encode(), padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        raise InvalidToken("invalid signature") from None
    now = clock()
    if "exp" not in claims or float(claims["exp"]) + LEEWAY < now:
        raise InvalidToken(f"expired (exp {claims.get('exp')}, now {now:.0f})")
    if float(claims.get("nbf", claims.get("iat", 0))) - LEEWAY > now:
        raise InvalidToken("not valid yet (nbf/iat in the future)")
    return claims


@dataclass(frozen=True)
class Issued:
    subject: str
    audience: str
    expires: float


@dataclass
class TokenIssuer:
    """Opaque access tokens the fake issued, with their lifetimes; the API routes accept only these."""

    lifetime: float = 3600.0
    clock: Callable[[], float] = time.time
    tokens: dict[str, Issued] = field(default_factory=dict)

    def issue(self, subject: str, audience: str, lifetime: float | None = None) -> tuple[str, int]:
        """A new token for ``subject``; (token, seconds it lives)."""
        token = "fake." + secrets.token_urlsafe(32)
        seconds = self.lifetime if lifetime is None else lifetime
        self.tokens[token] = Issued(subject, audience, self.clock() + seconds)
        return token, int(seconds)

    def check(self, token: str) -> Issued:
        issued = self.tokens.get(token)
        if issued is None:
            raise InvalidToken("the access token is not one this service issued")
        if issued.expires <= self.clock():
            raise InvalidToken("the access token has expired")
        return issued

    def expire_all(self) -> None:
        """Every token issued so far expires now (as if their lifetime had passed)."""
        now = self.clock()
        self.tokens = {t: Issued(i.subject, i.audience, now) for t, i in self.tokens.items()}


def bearer(headers: Mapping[str, str]) -> str | None:
    """The bearer token of a request's headers (any case of the header name), or None."""
    value = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


__all__ = ["InvalidToken", "Issued", "TokenIssuer", "bearer", "jwks_keys", "jwt_parts", "verify_jwt"]
