"""Argument checks shared by every module: what counts as an int or a
number (a bool is neither), the checks of settings dataclasses, and their
strict ``from_dict`` (unknown keys are an error, never silently dropped).
"""

from __future__ import annotations

from dataclasses import asdict, fields
from numbers import Integral, Real
from typing import Any, ClassVar, Sequence

import numpy as np


def is_int(v: Any, *, numpy: bool = False) -> bool:
    """``v`` is a Python int and not a bool (``numpy=True``: a numpy integer
    counts too)."""
    return not isinstance(v, bool) and isinstance(v, (int, np.integer) if numpy else int)


def is_integral(v: Any) -> bool:
    """``v`` is any :class:`numbers.Integral` (numpy integers included) but not a bool."""
    return not isinstance(v, bool) and isinstance(v, Integral)


def is_number(v: Any) -> bool:
    """``v`` is a Python int or float and not a bool."""
    return not isinstance(v, bool) and isinstance(v, (int, float))


def is_real(v: Any) -> bool:
    """``v`` is any :class:`numbers.Real` (numpy floats included) but not a bool."""
    return not isinstance(v, bool) and isinstance(v, Real)


def check_int(v: Any, name: str, minimum: int = 1, allow_none: bool = False) -> None:
    """``v`` is an int >= ``minimum`` (or None with ``allow_none``); else ValueError."""
    if v is None and allow_none:
        return
    if not is_int(v) or v < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}{' or None' if allow_none else ''}, got {v!r}")


def check_bool(v: Any, name: str) -> None:
    """``v`` is True or False; else TypeError."""
    if not isinstance(v, bool):
        raise TypeError(f"{name}: expected true or false, got {v!r}")


def check_choice(v: Any, name: str, allowed: Sequence[Any]) -> None:
    """``v`` is one of ``allowed``; else ValueError ("expected 'a' or 'b'" for
    two choices, "expected one of [...]" for more)."""
    if v not in allowed:
        expected = " or ".join(repr(a) for a in allowed) if len(allowed) == 2 else f"one of {list(allowed)}"
        raise ValueError(f"{name}: expected {expected}, got {v!r}")


def check_texts(texts: Any, name: str = "texts") -> list[str]:
    """``texts`` as a list of str (the API is batch first).

    Raises
    ------
    TypeError
        A single str, or an item that is not a str (the message names
        ``name`` and the item's index).
    """
    if isinstance(texts, str):
        raise TypeError(f"{name}: expected a sequence of str (batch first), got a single str; wrap it in a list")
    texts = list(texts)
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise TypeError(f"{name}: expected str items, item {bad} is {type(texts[bad]).__name__}")
    return texts


def check_k(k: Any, name: str = "k") -> int:
    """``k`` (a count of results) as an int >= 1; a numpy integer counts, a
    bool does not. ValueError naming ``name`` otherwise."""
    if not is_int(k, numpy=True) or k < 1:
        raise ValueError(f"{name}: expected a positive int, got {k!r}")
    return int(k)


def unknown_keys(cls: type, d: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(sorted keys of ``d`` that are not fields of dataclass ``cls``, sorted field names)."""
    known = {f.name for f in fields(cls)}
    return sorted(set(d) - known), sorted(known)


class Settings:
    """Mixin of settings dataclasses: ``to_dict`` gives plain data,
    ``from_dict`` refuses keys that are not fields.

    ``settings_name`` names the settings in the error
    (``"config: unknown <settings_name> settings [...]"``).
    """

    settings_name: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        unknown, _ = unknown_keys(cls, d)
        if unknown:
            raise ValueError(f"config: unknown {cls.settings_name} settings {unknown}")
        return cls(**d)


def check_token_ids(rows: Sequence[Sequence[Any]], vocab_size: int, name: str, *, depth: int = 1) -> None:
    """Refuse a token id that is not an int in ``[0, vocab_size)`` (a
    negative id would read another row of the model's matrices).

    Parameters
    ----------
    rows : nested lists (or int arrays) of int
        ``depth`` levels of lists above the lists of ids: 1 for prompts
        (``[B][T]``), 2 for label spellings (``[B][C][S]``).
    vocab_size : int
    name : str
        The argument, for the message.

    Raises
    ------
    ValueError
        Naming ``name``, the entry and the range.
    """
    if isinstance(rows, (str, bytes)) or not isinstance(rows, (Sequence, np.ndarray)):
        raise ValueError(f"{name}: expected a list, got {type(rows).__name__}")
    for i, x in enumerate(rows):
        if depth > 0:
            check_token_ids(x, vocab_size, f"{name}[{i}]", depth=depth - 1)
        elif not is_int(x, numpy=True) or not 0 <= x < vocab_size:
            raise ValueError(f"{name}[{i}]: expected a token id in [0, {vocab_size}), got {x!r}")

__all__ = ["is_int", "is_integral", "is_number", "is_real", "check_int", "check_bool", "check_choice", "check_texts",
           "check_token_ids",
           "check_k", "unknown_keys", "Settings"]
