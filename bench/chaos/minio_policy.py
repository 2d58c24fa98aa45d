"""A MinIO user whose policy can refuse deletes, through MinIO's admin API (``MinioAdmin``).

MinIO's root user is above every policy, so a client that must meet a refused
DeleteObject uses an ordinary user: ``TierUser`` creates one with all rights on one
bucket, and ``refuse_deletes(True)`` replaces its policy with the same one plus a
``Deny`` of ``s3:DeleteObject`` (which also refuses each key of a multi-object delete).
"""

from __future__ import annotations

import secrets
from typing import Any

from minio import MinioAdmin
from minio.credentials.providers import StaticProvider

POLICY_NAME = "headrace-tier"


def bucket_policy(bucket: str, *, deletes: bool) -> dict[str, Any]:
    statements: list[dict[str, Any]] = [
        {
            "Effect": "Allow",
            "Action": ["s3:*"],
            "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
        }
    ]
    if not deletes:
        statements.append(
            {
                "Effect": "Deny",
                "Action": ["s3:DeleteObject", "s3:DeleteObjectVersion"],
                "Resource": [f"arn:aws:s3:::{bucket}/*"],
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}


class TierUser:
    """An ordinary MinIO user with every right on ``bucket`` (deletes switchable)."""

    def __init__(self, endpoint: str, root_access: str, root_secret: str, bucket: str) -> None:
        self.bucket = bucket
        self.access_key = "tier-" + secrets.token_hex(4)
        self.secret_key = secrets.token_urlsafe(24)
        self._admin = MinioAdmin(
            endpoint=endpoint,
            credentials=StaticProvider(root_access, root_secret),
            secure=False,
        )

    def create(self) -> TierUser:
        self._admin.user_add(self.access_key, self.secret_key)
        self._admin.policy_add(POLICY_NAME, policy=bucket_policy(self.bucket, deletes=True))
        self._admin.policy_set(POLICY_NAME, user=self.access_key)
        return self

    def refuse_deletes(self, refuse: bool) -> None:
        """Replace the user's policy: deletes refused (``AccessDenied``) or allowed again."""
        self._admin.policy_add(POLICY_NAME, policy=bucket_policy(self.bucket, deletes=not refuse))
