"""The style the repo keeps ([tool.ruff] in pyproject.toml): lint clean and formatted."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_ruff(args):
  if importlib.util.find_spec("ruff") is None:
    pytest.skip("ruff is in the test extra: pip install -e '.[test]'")
  r = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-1000:]
