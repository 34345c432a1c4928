"""Counts in what users read: "1 problem", "2 problems", "3 LUT entries"."""

from __future__ import annotations


def plural_of(noun: str) -> str:
  """The regular English plural: "problem" -> "problems", "LUT entry" -> "LUT entries", "day" -> "days"."""
  if len(noun) > 1 and noun.endswith("y") and noun[-2] not in "aeiou":
    return noun[:-1] + "ies"
  return noun + "s"


def count(n: int, noun: str, plural: str | None = None) -> str:
  """n and the noun, singular for exactly 1 ("1 problem", "0 problems", "3 LUT entries")."""
  return f"{n} {noun if n == 1 else plural or plural_of(noun)}"
