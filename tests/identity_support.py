"""Keys and signed tokens a test makes as an identity's owner would: an OIDC issuer's signing
key (a Kubernetes cluster's, for Azure workload identity) and a GCP service account key
file. Signed with google-auth's own signer, so the fakes check what a real library makes."""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
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

    def token(self, subject: str, audience: str, lifetime: float = 3600.0, issued: float | None = None) -> str:
        now = time.time() if issued is None else issued
        return self.key.sign({"iss": self.url, "sub": subject, "aud": [audience], "iat": int(now),
                              "nbf": int(now), "exp": int(now + lifetime)})  # fmt: skip


def service_account_file(
    path: Path, key: SigningKey, project: str, email: str, token_uri: str
) -> Path:
    """A service account key file as ``gcloud iam service-accounts keys create`` writes it,
    its token URI the fake's."""
    info = {
        "type": "service_account", "project_id": project, "private_key_id": key.kid,
        "private_key": key.pem, "client_email": email, "client_id": "1" * 21,
        "auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": token_uri,
    }  # fmt: skip
    path.write_text(json.dumps(info))
    path.chmod(0o600)
    return path


__all__ = ["Issuer", "SigningKey", "service_account_file"]
