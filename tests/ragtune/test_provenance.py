"""`ragtune --version` and ragtune.provenance: the versions that records and LUTs carry."""

import subprocess
import tomllib
from pathlib import Path

import jax
import jaxlib
import pytest
from typer.testing import CliRunner

from ragtune import provenance
from ragtune.cli.app import app
from ragtune.provenance import Versions

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def _git(cwd: Path, *args: str) -> str:
  cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
  return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def test_version_names_ragtune_its_commit_jax_and_jaxlib():
  version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
  if (ROOT / ".git").exists():
    dirty = "+dirty" if _git(ROOT, "status", "--porcelain", "--untracked-files=no") else ""
    commit = f" ({provenance.host().commit})"
    sha = provenance.host().commit.removesuffix("+dirty")
    assert len(sha) >= 7 and _git(ROOT, "rev-parse", "HEAD").startswith(sha)
    assert provenance.host().commit == sha + dirty
  else:
    commit = ""  # a source tree without git: no commit, and nothing said about git
  for flag in ("--version", "-V"):
    r = runner.invoke(app, [flag])
    assert r.exit_code == 0, r.output
    assert r.output == f"ragtune {version}{commit}, jax {jax.__version__}, jaxlib {jaxlib.__version__}\n"


def test_git_commit_of_a_checkout_only(tmp_path, monkeypatch):
  repo = tmp_path / "repo"
  repo.mkdir()
  _git(repo, "init", "-q")
  (repo / "f.txt").write_text("a")
  _git(repo, "add", "f.txt")
  _git(repo, "commit", "-q", "-m", "one")
  _git(repo, "tag", "-a", "v1", "-m", "v1")  # a tag must not turn the sha into a description
  sha = _git(repo, "rev-parse", "HEAD")
  got = provenance.git_commit(repo)
  assert len(got) == 7 and sha.startswith(got)
  (repo / "f.txt").write_text("b")
  assert provenance.git_commit(repo) == got + "+dirty"
  # A folder with no .git of its own (a package installed inside another project's repository),
  # a folder outside any repository, and no git on PATH: no commit, quietly.
  (repo / "site-packages").mkdir()
  assert provenance.git_commit(repo / "site-packages") is None
  assert provenance.git_commit(tmp_path) is None
  monkeypatch.setenv("PATH", str(tmp_path / "empty"))
  assert provenance.git_commit(repo) is None


def test_version_comes_from_the_source_tree_else_the_installed_metadata(tmp_path, monkeypatch):
  import importlib.metadata

  try:
    installed = importlib.metadata.version("ragtune")
  except importlib.metadata.PackageNotFoundError:
    installed = "unknown"
  monkeypatch.setattr(provenance, "_ROOT", tmp_path)
  try:
    provenance.ragtune_version.cache_clear()
    assert provenance.ragtune_version() == installed  # no pyproject.toml here
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\nversion = "9.9.9"\n')
    provenance.ragtune_version.cache_clear()
    assert provenance.ragtune_version() == installed, "another project's pyproject says nothing of ragtune"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "ragtune"\nversion = "9.9.9"\n')
    provenance.ragtune_version.cache_clear()
    assert provenance.ragtune_version() == "9.9.9"
  finally:
    provenance.ragtune_version.cache_clear()


def test_versions_round_trip_and_name_what_is_wrong():
  v = Versions(ragtune="0.1.0", jax="0.10.2", jaxlib="0.10.2", platform="cuda 12090", cuda_driver="12.8")
  assert v.to_dict() == {
    "ragtune": "0.1.0",
    "jax": "0.10.2",
    "jaxlib": "0.10.2",
    "platform": "cuda 12090",
    "cuda_driver": "12.8",
  }
  assert Versions.from_dict({**v.to_dict(), "added_later": "x"}) == v
  for bad in ("0.10.2", {"jax": 10}):
    with pytest.raises(ValueError, match="versions: expected an object of strings"):
      Versions.from_dict(bad)


def test_the_device_part_is_read_once_and_cpu_adds_nothing():
  dev = jax.devices()[0]
  assert provenance.for_device(dev) is provenance.for_device(dev)
  if dev.platform == "cpu":
    assert provenance.for_device(dev) == provenance.host()
  else:
    assert provenance.for_device(dev).platform
