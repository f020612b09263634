"""The one result type every reward function returns: a score and the reason for it."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class RewardResult:
    """A reward with its reason, so that a notebook can show why rewards are what they are.

    ``reason`` is a short machine-readable word (``correct``, ``wrong``, ``no_think_close``, ``no_answer``,
    ``timeout``, ``parse_error``, ``no_code``, ``crashed`` ...); ``detail`` is free text for humans.
    ``passed``/``total`` are the passed and run test counts of a code reward (None for math).
    """

    score: float
    reason: str
    passed: int | None = None
    total: int | None = None
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)
