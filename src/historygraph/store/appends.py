"""Idempotent appends (issue 17): how many keys a session keeps, how long a key may be, what "the
same batch" means for a key (:func:`batch_fingerprint`), and the refusal of an append that does not
match (:class:`AppendConflict`). Used by :meth:`historygraph.store.base.Store.append`."""

from __future__ import annotations

import hashlib
import json
from typing import Sequence

from historygraph.history.events import Message

KEPT_KEYS = 1000
"""Idempotency keys kept per session: the most recent keyed appends (older keys are forgotten, and
reusing one then appends again). A count rather than a time so storage per session is bounded;
retries come within seconds, and payment APIs that set the convention keep keys for a day."""

MAX_KEY_LENGTH = 255
"""Longest accepted idempotency key, in characters (the limit payment APIs use)."""


class AppendConflict(ValueError):
    """An append refused without writing anything (an HTTP 409 in the session API).

    Attributes:
        key: the idempotency key reused with another batch, or ``None`` when the refusal is an
            ``expected_length`` mismatch.
        length: the session's current number of events.
    """

    def __init__(self, message: str, key: str | None, length: int) -> None:
        super().__init__(message)
        self.key, self.length = key, length


def batch_fingerprint(batch: Sequence[Message], expected_length: int | None) -> str:
    """SHA-256 hex of the canonical JSON (sorted keys) of the events' :meth:`Message.to_dict` and
    ``expected_length``: what "the same request" means for an idempotency key."""
    canon = json.dumps([[m.to_dict() for m in batch], expected_length], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canon.encode()).hexdigest()
