"""An OIDC issuer of service account tokens, as a Kubernetes cluster is one, for the unit
tests of workload identity (Azure) and workload identity federation (GCP) against the
fakes. Signed with google-auth's own signer, so the fakes check what a real library makes.
(The integration tests use the dev cluster's own issuer and tokens.)"""

from __future__ import annotations

import base64
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import crypt, jwt


def _b64(number: int) -> str:
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass
class SigningKey:
    key: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(65537, 2048))
    kid: str = field(default_factory=lambda: secrets.token_hex(8))

    @property
    def pem(self) -> str:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()

    def public_keys(self) -> dict[str, rsa.RSAPublicKey]:
        return {self.kid: self.key.public_key()}

    def jwks(self) -> dict[str, Any]:
        numbers = self.key.public_key().public_numbers()
        return {"keys": [{"kty": "RSA", "alg": "RS256", "use": "sig", "kid": self.kid,
                          "n": _b64(numbers.n), "e": _b64(numbers.e)}]}  # fmt: skip

    def sign(self, claims: dict[str, Any]) -> str:
        signer = crypt.RSASigner.from_string(self.pem, self.kid)
        return jwt.encode(signer, claims).decode()  # type: ignore[no-untyped-call]


@dataclass
class Issuer:
    """An OIDC issuer of service account tokens, as a Kubernetes cluster is one."""

    url: str = "https://oidc.example.test/cluster"
    key: SigningKey = field(default_factory=SigningKey)

    def token(
        self, subject: str, audience: str, lifetime: float = 3600.0, issued: float | None = None
    ) -> str:
        now = time.time() if issued is None else issued
        return self.key.sign({"iss": self.url, "sub": subject, "aud": [audience], "iat": int(now),
                              "nbf": int(now), "exp": int(now + lifetime)})  # fmt: skip


__all__ = ["Issuer", "SigningKey"]
