#!/usr/bin/env python3
"""Print a RabbitMQ password hash for definitions.json (``rabbit_password_hashing_sha256``).

The format RabbitMQ stores and imports: base64(salt + sha256(salt + password)), with a random 4-byte salt.
Standard library only, so it runs anywhere:

    python3 deploy/rabbitmq/hash_password.py            # asks for the password
    printf %s "$PASSWORD" | python3 deploy/rabbitmq/hash_password.py -
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import sys


def rabbitmq_sha256_hash(password: str, salt: bytes | None = None) -> str:
    """The ``password_hash`` value RabbitMQ accepts with ``rabbit_password_hashing_sha256``."""
    salt = os.urandom(4) if salt is None else salt
    digest = hashlib.sha256(salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def main(argv: list[str]) -> int:
    password = sys.stdin.read() if argv[1:] == ["-"] else getpass.getpass("password: ")
    if not password:
        print("empty password refused", file=sys.stderr)
        return 1
    print(rabbitmq_sha256_hash(password))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
