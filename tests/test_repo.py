"""What the repository itself keeps to: no large files tracked, and the layout's rules."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 1 << 20


def _tracked() -> list[Path]:
  r = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
  if r.returncode != 0:
    pytest.skip("not a git checkout")
  return [ROOT / f for f in r.stdout.decode().split("\0") if f]


def test_no_tracked_file_is_over_1_mib():
  big = {str(p.relative_to(ROOT)): p.stat().st_size for p in _tracked() if p.is_file() and p.stat().st_size > MAX_BYTES}
  assert not big, f"tracked files over 1 MiB (wheels and data belong elsewhere): {big}"
