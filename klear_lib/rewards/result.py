"""The one result type every reward function returns: a score and the reason for it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class RewardResult:
    """A reward with its reason, so that a notebook can show why rewards are what they are.

    ``reason`` is a short machine-readable word (``correct``, ``wrong``, ``gold_error``, ``no_think_close``,
    ``no_answer``, ``timeout``, ``parse_error``, ``no_code``, ``worker_died`` ...); ``detail`` is free text for
    humans. ``passed``/``total`` are the passed and run test counts of a code reward (None for math).
    ``score`` should be a finite real number; nothing here checks it, ``RewardPool`` turns any other into a
    failure with reason ``invalid_score``.
    """

    score: float
    reason: str
    passed: int | None = None
    total: int | None = None
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


#: The reason of a result judged against malformed data (a code problem's tests), not against the response: its score
#: says nothing about the response, and a trainer refuses the batch (``klear_lib.train.rl.KlearGRPOTrainer``).
DATA_ERROR = "data_error"


class DataError(ValueError):
    """The data a response is judged against is malformed (a code problem's tests): ``RewardPool`` gives the item
    reason ``DATA_ERROR`` instead of ``error``. The loaders refuse such rows first (``klear_lib.data.code_tests``)."""


def build_options(cls, what: str, options: dict):
    """Build the options dataclass ``cls`` from keyword options; an unknown one is a TypeError listing the valid."""
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(f"unknown {what} option(s) {unknown}; valid: {', '.join(valid)}")
    return cls(**options)
