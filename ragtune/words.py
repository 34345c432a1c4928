"""Counts in what users read: "1 problem", "2 problems"."""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
  """n and the noun, singular for exactly 1 ("1 problem", "0 problems", "3 candidates")."""
  return f"{n} {noun if n == 1 else plural or noun + 's'}"
