"""No line of ragtune/ names a backend: what it needs of one it reads from kernels.registry's
Backend records (grid_work, interpret_cost, dtypes, ...), so a backend is added, changed or
removed in kernels/ alone.

Checked: the names of the backends with kernels of their own (Backend.own_kernels) and of
the interpreters that run them (Backend.interpreter), as words, in code, strings and comments
alike. "xla" stays allowed: it names the backend without kernels of its own, and also XLA
itself and the baseline every kernel is measured against (jax.lax.ragged_dot as XLA compiles
it; registry.REFERENCE), which ragtune's records and tables name on purpose.

PEER_NAMES lists the lines where such a word is another library's name, not ours.
"""

import re
from pathlib import Path

from kernels import registry

ROOT = Path(__file__).resolve().parents[2]
# file -> the starts of its lines (stripped) that may hold a backend's word as a peer's name.
PEER_NAMES = {
  # tokamax's implementation names (its ragged_dot api.py's IMPLEMENTATIONS keys).
  "ragtune/lut/bench.py": ("TOKAMAX_MODULES = ",),
}


def _words() -> set[str]:
  own = [b for b in registry.REGISTRY.values() if b.own_kernels]
  return {b.name for b in own} | {b.interpreter for b in own if b.interpreter}


def test_the_words_are_the_backends_and_interpreters():
  words = _words()
  assert words and registry.REFERENCE not in words
  assert all(registry.get(w).own_kernels for w in words if w in registry.REGISTRY)


def test_no_line_of_ragtune_names_a_backend():
  pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(_words()))) + r")\b")
  found = []
  for path in sorted((ROOT / "ragtune").rglob("*.py")):
    rel = path.relative_to(ROOT).as_posix()
    for i, line in enumerate(path.read_text().splitlines(), 1):
      if pattern.search(line) and not line.strip().startswith(PEER_NAMES.get(rel, ("\0",))):
        found.append(f"{rel}:{i}: {line.strip()}")
  assert not found, "lines that name a backend (read it from kernels.registry instead):\n" + "\n".join(found)
