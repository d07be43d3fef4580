"""API tokens and passwords. Tokens are random and stored only as SHA-256 hashes; passwords
as PBKDF2-SHA256 hashes, and only if they pass :func:`password_problem`."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from functools import cache
from pathlib import Path

TOKEN_PREFIX = "dl_"
PASSWORD_ITERATIONS = 200_000
MIN_PASSWORD_LENGTH = 12
COMMON_PASSWORDS_FILE = Path(__file__).with_name("common_passwords.txt")
# What a login checks the password against when there is no stored hash to check (an unknown
# username, a user without a password): the same PBKDF2 work as a real check, so the time of
# the answer does not tell whether the username exists. No password derives to all zeros.
DUMMY_PASSWORD_HASH = f"pbkdf2_sha256${PASSWORD_ITERATIONS}${'00' * 16}${'00' * 32}"


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    # A 256-bit random token needs no slow hash: SHA-256 cannot be brute-forced back.
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def hash_password(password: str, *, iterations: int = PASSWORD_ITERATIONS) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    return f"pbkdf2_sha256${iterations}${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str | None) -> bool:
    """Whether ``password`` matches ``stored``. Without a stored hash the password is checked
    against :data:`DUMMY_PASSWORD_HASH` (and fails): the same work either way."""
    try:
        scheme, iterations, salt_hex, digest_hex = (stored or DUMMY_PASSWORD_HASH).split("$")
    except ValueError:
        return False
    if scheme != "pbkdf2_sha256":
        return False
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), bytes.fromhex(salt_hex), int(iterations))
    return hmac.compare_digest(digest.hex(), digest_hex) and bool(stored)


@cache
def common_passwords() -> frozenset[str]:
    """The common-password list shipped in ``common_passwords.txt`` (its header names the source
    and license), lower-cased."""
    lines = COMMON_PASSWORDS_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(line.strip().lower() for line in lines if line.strip() and not line.startswith("# "))


def password_problem(password: str, username: str) -> str | None:
    """What is wrong with ``password`` as ``username``'s new password (a sentence that says what
    to choose instead), or None when it may be set."""
    if not password.strip():
        return "the password is only whitespace; choose at least 12 characters that are not all spaces"
    if len(password) < MIN_PASSWORD_LENGTH:
        return f"the password is {len(password)} characters long; choose one of at least {MIN_PASSWORD_LENGTH}"
    if password.strip().lower() == username.lower():
        return "the password is the username; choose one that is not"
    if password.strip().lower() in common_passwords():
        return "the password is in a list of common passwords that attackers try first; choose a less common one"
    return None
