"""What the repository itself keeps to: no large files tracked, and the layout's rules."""

import ast
import subprocess
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
