"""API keys as the tenants file stores them: `sha256:<hex>` of the key, never the key itself, so a leaked file
leaks no key. A random 32-byte key has nothing to brute-force, so one unsalted hash is enough (as GitHub and
Stripe store tokens); it also makes a lookup one dict access instead of a comparison per key."""

import hashlib
import secrets

PREFIX = "sha256:"
KEY_PREFIX = "rl-"


def hash_key(key: str) -> str:
    return PREFIX + hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def is_key_hash(text: str) -> bool:
    digest = text.removeprefix(PREFIX)
    return text.startswith(PREFIX) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
