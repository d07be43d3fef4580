"""API tokens and passwords. Tokens are random and stored only as SHA-256 hashes; passwords
as PBKDF2-SHA256 hashes, and only if they pass :func:`password_problem` (length, not the
username, not a common password, and :func:`weak_password_pattern`: not one character or piece
repeated, at least six different characters, not a run, not a common password with digits
appended)."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from functools import cache
from itertools import pairwise
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
    return weak_password_pattern(password)


# The strength rule on top of length and the common-password list: what guessers try right
# after the list (one character repeated, a short piece repeated, a run along the alphabet, the
# digits or a keyboard row, a common password with digits or symbols appended).
MIN_DISTINCT_CHARACTERS = 6
# A password is a run when at least this share of its steps go to a neighbouring character.
MAX_RUN_SHARE = 0.75
_KEYBOARD_ROWS = ("1234567890", "qwertyuiop", "asdfghjkl", "zxcvbnm", "qwertzuiop", "azertyuiop", "yxcvbnm")
_TRAILING_DECORATION = re.compile(r"[\W\d_]+$")


def _repeated_unit(password: str) -> str | None:
    """The shortest piece that ``password`` is two or more copies of, or None."""
    length = len(password)
    for size in range(1, length // 2 + 1):
        if length % size == 0 and password[:size] * (length // size) == password:
            return password[:size]
    return None


def _neighbours(first: str, second: str) -> bool:
    """Whether ``second`` follows ``first`` on the alphabet, the digits (9 then 0) or a keyboard
    row, either way."""
    if abs(ord(first) - ord(second)) == 1 or {first, second} == {"9", "0"}:
        return True
    for row in _KEYBOARD_ROWS:
        a, b = row.find(first), row.find(second)
        if a >= 0 and b >= 0 and abs(a - b) == 1:
            return True
    return False


def weak_password_pattern(password: str) -> str | None:
    """What makes ``password`` guessable although it is long enough and not on the list (a
    sentence that says what to choose instead), or None."""
    lowered = password.strip().lower()
    advice = "choose a few unrelated words or a password manager's random password"
    unit = _repeated_unit(lowered)
    if unit is not None:
        what = "one character repeated" if len(unit) == 1 else f"a piece of {len(unit)} characters repeated"
        return f"the password is {what}; {advice}"
    distinct = len(set(lowered))
    if distinct < MIN_DISTINCT_CHARACTERS:
        return (
            f"the password has only {distinct} different characters; use at least {MIN_DISTINCT_CHARACTERS}, {advice}"
        )
    steps = [_neighbours(a, b) for a, b in pairwise(lowered)]
    if steps and sum(steps) / len(steps) >= MAX_RUN_SHARE:
        return f"the password is mostly a run along the alphabet, the digits or a keyboard row; {advice}"
    stem = _TRAILING_DECORATION.sub("", lowered)
    if stem != lowered and stem in common_passwords():
        return f"the password is a common password with digits or symbols added; {advice}"
    return None
