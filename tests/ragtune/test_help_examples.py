"""Every --help example runs as pasted; usage lines name arguments; types read in words."""

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

import kernels
from ragtune.cli.app import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("sweep", "verify", "export-lut", "show", "report", "bench", "shapes from-config", "shapes from-function")


def _help(cmd):
  r = runner.invoke(app, [*cmd.split(), "--help"], prog_name="ragtune")
  assert r.exit_code == 0, r.output
  return r.output


def test_usage_names_arguments_and_types_read_in_words():
  for cmd in COMMANDS + ("--help",):
    text = _help(cmd) if cmd != "--help" else runner.invoke(app, ["--help"]).output
    assert not re.search(r"\{\w+\}", text), text  # Typer's {shapes_file}
    assert not re.search(r"<(list\[\w+\]|path|int|float|text|int range|float range)>", text), text
  assert "sweep [OPTIONS] SHAPES_FILE\n" in _help("sweep")
  assert "export-lut [OPTIONS] [DIR]...\n" in _help("export-lut")
  assert "from-config [OPTIONS] CONFIG_JSON\n" in _help("shapes from-config")
  assert "--shape M,K,N" in _help("verify") and "--timeout SECONDS" in _help("sweep")


def test_every_help_example_runs(tmp_path, monkeypatch):
  # A fresh clone's working tree, as far as the examples can see it.
  shutil.copytree(ROOT / "shapes", tmp_path / "shapes")
  (tmp_path / "tests" / "ragtune").mkdir(parents=True)
  shutil.copy(ROOT / "tests" / "ragtune" / "moe_model.py", tmp_path / "tests" / "ragtune")  # from-function's step
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", list(sys.path))  # from-function puts the folder it runs in first
  examples = {}
  for cmd in COMMANDS:
    found = [l.strip().removeprefix("Example: ") for l in _help(cmd).splitlines() if l.strip().startswith("Example: ")]
    assert len(found) == 1, (cmd, found)
    examples[cmd] = found[0]
  for example in examples.values():
    for part in example.split("&&"):
      args = shlex.split(part)
      assert args[0] == "ragtune", example
      r = runner.invoke(app, args[1:])
      assert r.exit_code == 0, (example, r.output)
  slug = kernels.device_slug(kernels.lut.current_device_kind())
  made = [f"results/{slug}/records.jsonl", f"luts/{slug}.json", "report/best.csv", "report/rows.csv"]
  made += [f"results/{slug}/bench-smoke.csv"]
  for path in made:
    assert (tmp_path / path).is_file(), path
  # What the examples write into a clone is ignored by git (real device results are not).
  if slug == "cpu" and shutil.which("git") and (ROOT / ".git").exists():
    r = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *made], capture_output=True, text=True)
    assert r.stdout.split() == made, r.stdout + r.stderr


def test_no_file_cites_outside_the_repository():
  # Facts cite public sources (model configs, papers, repositories), never a local file
  # beside the clone. The pattern is split so this file does not match itself.
  outside = re.compile("|".join([r"\.\./" + "shared", "shared/" + "ANCHORS", "ANCHORS" + r"\.md"]))
  files = [
    p
    for p in ROOT.rglob("*")
    if p.is_file()
    and ".git" not in p.parts
    and "__pycache__" not in p.parts
    and p.suffix in (".py", ".md", ".yaml", ".sh", ".toml", ".txt", ".cfg", "")
  ]
  hits = [str(p.relative_to(ROOT)) for p in files if outside.search(p.read_text(errors="ignore"))]
  assert not hits, hits
