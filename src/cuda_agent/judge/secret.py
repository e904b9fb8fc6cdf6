"""The judgement's random choices, from a generator no candidate can predict.

The seed of every call and which calls are kept are drawn here. Python's own generator
(Mersenne Twister) is linear: a few hundred of its outputs, such as the seeds a candidate
receives over one run, give away its state and every later draw, so a candidate could
predict the next calls' inputs and which calls the judge will keep. ``Keyed`` draws from
BLAKE2b over a 256-bit key and a counter instead: reproducible where the key is given
(``JudgeConfig.seed``), unpredictable without it.
"""

from __future__ import annotations

import hashlib
import random
import secrets


class Keyed(random.Random):
    """A ``random.Random`` whose bits come from BLAKE2b(key, counter)."""

    def __init__(self, key: int | bytes | None = None):
        self._counter = 0
        super().__init__(0)  # the base class's state is never used
        self.key = key if isinstance(key, bytes) else (
            secrets.token_bytes(32) if key is None else
            hashlib.blake2b(str(key).encode(), digest_size=32).digest())

    def seed(self, *args: object, **kwargs: object) -> None:  # noqa: ARG002
        self._counter = 0

    def getrandbits(self, k: int) -> int:
        if k <= 0:
            return 0
        out = b""
        while len(out) * 8 < k:
            self._counter += 1
            out += hashlib.blake2b(self._counter.to_bytes(16, "little"), key=self.key,
                                   digest_size=64).digest()
        return int.from_bytes(out, "little") >> (len(out) * 8 - k)

    def random(self) -> float:
        return self.getrandbits(53) / (1 << 53)

    def child(self) -> Keyed:
        """An independent generator keyed from this one."""
        return Keyed(self.getrandbits(256).to_bytes(32, "little"))

    def getstate(self) -> object:  # pragma: no cover - not a state that may leave
        raise TypeError("a keyed generator's state is not exported")

    def setstate(self, state: object) -> None:  # pragma: no cover
        raise TypeError("a keyed generator's state is not imported")
