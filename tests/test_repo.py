"""What the repository itself keeps to: no large files tracked, and the layout's rules."""

import ast
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 1 << 20
MAX_COMMAND_STATEMENTS = 25


def _tracked() -> list[Path]:
  r = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
  if r.returncode != 0:
    pytest.skip("not a git checkout")
  return [ROOT / f for f in r.stdout.decode().split("\0") if f]


def test_no_tracked_file_is_over_1_mib():
  big = {str(p.relative_to(ROOT)): p.stat().st_size for p in _tracked() if p.is_file() and p.stat().st_size > MAX_BYTES}
  assert not big, f"tracked files over 1 MiB (wheels and data belong elsewhere): {big}"


def _statements(body: list[ast.stmt]) -> int:
  """Statements, nested ones included (a def inside a command counts with its body)."""
  nested = ("body", "orelse", "finalbody", "handlers")
  return sum(1 + _statements([s for f in nested for s in getattr(stmt, f, []) or []]) for stmt in body)


def test_cli_commands_are_thin():
  """A command parses its options and hands the work to the stages (ragtune.run.prepare,
  ragtune.lut, ...), which run without Typer; its body stays within MAX_COMMAND_STATEMENTS."""
  tree = ast.parse((ROOT / "ragtune" / "cli" / "app.py").read_text())
  commands = {
    node.name: node
    for node in tree.body
    if isinstance(node, ast.FunctionDef)
    and any(isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "command" for d in node.decorator_list)
  }
  assert len(commands) >= 9, sorted(commands)
  sizes = {}
  for name, node in commands.items():
    body = node.body[1:] if ast.get_docstring(node) else node.body
    sizes[name] = _statements(body)
  assert max(sizes.values()) <= MAX_COMMAND_STATEMENTS, sizes


def _normal(extra: str) -> str:
  """PEP 685's normal form of an extra's name, the one pip matches on."""
  return re.sub(r"[-_.]+", "-", extra).lower()


def _extras() -> set[str]:
  return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


# '.[a,b]' or ragtune[a,b] after `pip install`, a bare ragtune[a,b], and install_hint('a', 'b') in code.
_HINTS = (
  re.compile(r"pip install[^\n`]*?(?:ragtune|\.)\[([^\]]*)\]"),
  re.compile(r"\bragtune\[([^\]]*)\]"),
  re.compile(r"install_hint\(([^)]*)\)"),
)


def _hinted(text: str) -> list[str]:
  names = []
  for pattern in _HINTS:
    for group in pattern.findall(text):
      names += [n.strip(" '\"") for n in group.split(",")]
  # literals, not install_hint's own code nor the docs' placeholder
  return [n for n in names if re.fullmatch(r"[A-Za-z0-9._-]+", n) and n != "EXTRA"]


def test_extras_are_in_pips_normal_form():
  """pip older than 24 matches an extra only as its normal form (mosaic-gpu, not mosaic_gpu)."""
  extras = _extras()
  assert extras and all(_normal(e) == e for e in extras), sorted(extras)


def test_every_install_hint_names_an_extra_that_exists_in_normal_form():
  files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
  files += [p for d in ("ragtune", "kernels") for p in (ROOT / d).rglob("*.py")]
  extras, bad, seen = _extras(), [], 0
  for path in files:
    for name in _hinted(path.read_text()):
      seen += 1
      if name not in extras:
        bad.append(f"{path.relative_to(ROOT)}: {name}")
  assert seen > 5, "the hints are found"
  assert not bad, f"install hints naming no extra of pyproject.toml (or not in normal form): {bad}"


def test_code_gives_one_form_of_install_hint():
  """Every message says `python3 -m pip install -e '.[EXTRA]'`, through errors.install_hint."""
  other = [
    f"{p.relative_to(ROOT)}:{i}"
    for d in ("ragtune", "kernels")
    for p in (ROOT / d).rglob("*.py")
    for i, line in enumerate(p.read_text().splitlines(), 1)
    if "pip install" in line and "python3 -m pip install -e '.[" not in line
  ]
  assert not other, other
