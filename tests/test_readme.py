"""Every example in README.md runs as printed, and the docs' links and install hints hold.

A `ragtune ...` line is parsed by the CLI's own parser (click's make_context, nothing run), so
an option or argument the command does not have fails here; the files it names exist; the
cheap ones also run. Python snippets compile and their imports import. pip lines name extras
pyproject.toml has, in the one form `python3 -m pip install -e '.[EXTRA]'`.
"""

import ast
import csv
import functools
import importlib
import re
import shlex
import shutil
import tomllib
from pathlib import Path

import pytest
import typer
import typer.core
from typer.testing import CliRunner

from ragtune.cli.app import app

# The click that typer's commands are built on (typer 0.29 carries its own copy).
click = getattr(typer.core, "_click", None) or importlib.import_module("click")
ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
FIRST_COMMAND = "python3 -m pip install -e . && ragtune sweep shapes/smoke.yaml && ragtune verify && ragtune export-lut"
TEST_COMMAND = "python3 -m pip install -e '.[test,gpu-compile,tpu]' && python3 -m pytest"
# Options whose value is a path the command writes (or a device's results), not one that must exist.
OUTPUT_OPTIONS = {"-o", "--out", "--output", "--csv"}
# Examples cheap enough to run here (a few seconds), not only parse.
RUN = ("ragtune shapes from-config", "ragtune plan shapes/smoke.yaml")


def _blocks(text: str) -> list[tuple[str, str]]:
  """(language, body) of each fenced code block."""
  return re.findall(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)


def _shell_lines(body: str) -> list[str]:
  return [l for l in body.replace("\\\n", " ").splitlines() if l.strip() and not l.lstrip().startswith("#")]


def _commands(line: str) -> list[list[str]]:
  """The commands of one shell line, split at `&&`, comments dropped."""
  out, cur = [], []
  for tok in shlex.split(line, comments=True):
    if tok == "&&":
      out.append(cur)
      cur = []
    else:
      cur.append(tok)
  return [c for c in out + [cur] if c]


def _examples(text: str, spans: bool = True) -> tuple[list[list[str]], list[str]]:
  """Every shell command (bash blocks, and with spans inline `ragtune ...`/`python3 -m pip ...`
  spans) and every Python snippet of a Markdown text."""
  cmds, snippets = [], []
  for lang, body in _blocks(text):
    if lang == "python":
      snippets.append(body)
    elif lang in ("bash", "sh"):
      cmds += [c for l in _shell_lines(body) for c in _commands(l)]
  prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
  for span in re.findall(r"`([^`\n]+)`", prose):
    # `ragtune bench` alone names a command in prose; with an option or argument it is an example.
    example = spans and span.startswith("ragtune ") and not all(re.fullmatch(r"[a-z][a-z-]*", t) for t in span.split())
    if example or span.startswith("python3 -m pip "):
      cmds += _commands(span)
  return cmds, snippets


def _extras() -> set[str]:
  meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
  return {_normal(e) for e in meta["project"]["optional-dependencies"]}


def _normal(name: str) -> str:
  """An extra's name as pip compares it (PEP 685)."""
  return re.sub(r"[-_.]+", "-", name).lower()


def _parse(args: list[str]) -> None:
  """Parse `ragtune ARGS` down to the leaf command, without running it; click raises on an
  unknown command, option or argument."""
  cmd = typer.main.get_command(app)
  ctx = cmd.make_context("ragtune", list(args), resilient_parsing=False)
  while hasattr(cmd, "resolve_command"):
    protected = getattr(ctx, "_protected_args", None)
    rest = [*(ctx.protected_args if protected is None else protected), *ctx.args]
    name, cmd, rest = cmd.resolve_command(ctx, rest)
    ctx = cmd.make_context(name, rest, parent=ctx)


def _named_paths(args: list[str]) -> list[str]:
  """Arguments that name a file of the repository (a shape set, a config): not option names,
  not what an output option writes."""
  paths = []
  for prev, tok in zip(["", *args], args):
    if tok.startswith("-") or prev in OUTPUT_OPTIONS:
      continue
    if re.search(r"\.(ya?ml|json|txtpb|py|sh)$", tok) or re.match(r"(shapes|benchmarks|tests|kernels|\.ci)/", tok):
      paths.append(tok)
  return paths


def _check_pip(cmd: list[str], where: str, extras: set[str]) -> None:
  assert cmd[:5] == ["python3", "-m", "pip", "install", "-e"], f"{where}: {shlex.join(cmd)}"
  m = re.fullmatch(r"\.(?:\[([^\]]*)\])?", cmd[5])
  assert m and len(cmd) == 6, f"{where}: {shlex.join(cmd)}"
  for extra in (m.group(1) or "").split(","):
    if extra:
      assert extra == _normal(extra), f"{where}: extra {extra!r} is not in pip's normal form"
      assert extra in extras, f"{where}: extra {extra!r} is not in pyproject.toml ({sorted(extras)})"


def _check_command(cmd: list[str], where: str, extras: set[str], paths: bool = True) -> str:
  """What was checked: 'ragtune', 'pip', 'python' or 'other'. paths: that the files a
  ragtune command names exist."""
  if cmd[0] == "ragtune":
    try:
      _parse(cmd[1:])
    except (typer.Exit, getattr(click.exceptions, "Exit", typer.Exit)):  # --help, --version
      pass
    except click.exceptions.ClickException as e:
      pytest.fail(f"{where}: {shlex.join(cmd)}: {e.format_message()}")
    for path in _named_paths(cmd[1:]) if paths else ():
      assert (ROOT / path).exists(), f"{where}: {shlex.join(cmd)}: {path} does not exist"
    return "ragtune"
  if cmd[:3] == ["python3", "-m", "pip"]:
    _check_pip(cmd, where, extras)
    return "pip"
  if cmd[:2] == ["python3", "-c"]:
    compile(cmd[2], where, "exec")
    return "python"
  return "other"


def _check_snippet(src: str, where: str) -> None:
  tree = ast.parse(compile(src, where, "exec", ast.PyCF_ONLY_AST))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        importlib.import_module(alias.name)
    elif isinstance(node, ast.ImportFrom):
      mod = importlib.import_module(node.module)
      for alias in node.names:
        assert hasattr(mod, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), (
          f"{where}: from {node.module} import {alias.name}"
        )


def test_the_readme_megablox_snippet_runs_at_m_96(monkeypatch):
  """The megablox lines as printed, on the README's smoke shape (interpreted here, as this
  host has no TPU), with no LUT: the fallback runs, its row tile cut to divide m."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.experimental.pallas.ops.tpu import megablox

  import kernels

  (src,) = [body for lang, body in _blocks(README.read_text()) if lang == "python" and "megablox" in body]
  monkeypatch.setattr(megablox, "gmm", functools.partial(megablox.gmm, interpret=True))
  monkeypatch.delenv(kernels.lut.ENV_VAR, raising=False)
  x = jax.random.normal(jax.random.key(0), (96, 64), jnp.float32)
  w = jax.random.normal(jax.random.key(1), (4, 64, 80), jnp.float32)
  group_sizes = jnp.array([20, 30, 40, 6], jnp.int32)
  scope = {"x": x, "w": w, "group_sizes": group_sizes}
  exec(compile(src, "README.md", "exec"), scope)
  want = jax.lax.ragged_dot(x, w, group_sizes, precision="highest")
  np.testing.assert_allclose(scope["y"], want, rtol=1e-5, atol=1e-4)


def test_readme_keeps_the_two_commands_and_ci_runs_the_second():
  bash = [body.strip() for lang, body in _blocks(README.read_text()) if lang == "bash"]
  assert bash[:2] == [FIRST_COMMAND, TEST_COMMAND], bash[:2]
  assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text().splitlines()


def test_readme_is_a_front_page():
  assert len(README.read_text().splitlines()) <= 320


def test_every_readme_example_parses_names_real_files_and_imports():
  cmds, snippets = _examples(README.read_text())
  extras = _extras()
  kinds = [_check_command(c, "README.md", extras) for c in cmds]
  assert kinds.count("ragtune") >= 15 and "pip" in kinds and "python" in kinds, kinds
  assert len(snippets) >= 2
  for src in snippets:
    _check_snippet(src, "README.md")


def test_docs_examples_parse_and_install_hints_have_one_form():
  extras = _extras()
  for page in [README, *DOCS]:
    text = page.read_text()
    where = str(page.relative_to(ROOT))
    # One form for install hints, and extras pyproject has (in pip's normal form).
    for m in re.finditer(r"pip install -e", text):
      line = text.count("\n", 0, m.start()) + 1
      assert text[: m.start()].endswith("python3 -m "), f"{where}:{line}: write `python3 -m pip install -e '.[EXTRA]'`"
    assert "pip install 'ragtune[" not in text, where
    # The pages' commands in code blocks parse too (their paths may be the reader's own, and
    # inline spans may name a command without its arguments).
    cmds, _ = _examples(text, spans=False)
    for cmd in cmds:
      _check_command(cmd, where, extras, paths=False)


def _anchors(text: str) -> set[str]:
  body = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
  return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", body, re.M)}


def test_links_between_readme_and_docs_resolve():
  for page in [README, *DOCS]:
    text = page.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"\w+://", target):
        continue
      path, _, anchor = target.partition("#")
      dest = (page.parent / path).resolve() if path else page
      assert dest.exists(), f"{page.name}: link to {target}"
      if anchor:
        assert anchor in _anchors(dest.read_text()), f"{page.name}: no heading for #{anchor} in {dest.name}"


def test_readme_examples_that_are_cheap_run(tmp_path, monkeypatch):
  shutil.copytree(ROOT / "shapes", tmp_path / "shapes")
  monkeypatch.chdir(tmp_path)
  cmds, _ = _examples(README.read_text())
  ran = []
  for cmd in cmds:
    if shlex.join(cmd).startswith(RUN):
      r = CliRunner().invoke(app, cmd[1:])
      assert r.exit_code == 0, (shlex.join(cmd), r.output)
      ran.append(cmd[1])
  assert sorted(set(ran)) == ["plan", "shapes"], ran


def test_on_a_cpu_auto_runs_xla_and_a_cpu_lut_serves_an_explicit_backend():
  """What README.md's "Using a LUT in a model" says of `kernels.explain` on a CPU."""
  import jax

  import kernels

  if jax.devices()[0].platform != "cpu":
    pytest.skip("a statement about CPU hosts")
  config = {"block_m": 32, "block_k": 32, "block_n": 32, "num_warps": 4, "num_stages": 2, "group_m": 1, "group_k": 1}
  entry = {"op": "fwd", "backend": "pallas_gpu", "dtype": "bfloat16", "m": 96, "k": 64, "n": 80, "g": 4}
  lut = kernels.Lut.from_dict(
    {"schema": "ragtune-lut", "schema_version": 2, "device_kind": "cpu", "entries": [{**entry, "config": config}]}
  )
  with kernels.use_lut(lut):
    auto = kernels.explain((96, 64), (4, 64, 80), "bfloat16")
    explicit = kernels.explain((96, 64), (4, 64, 80), "bfloat16", backend="pallas_gpu")
  shown = {str(c).split(": ", 1)[1] for c in auto.values()}
  assert len(shown) == 1 and shown.pop().startswith("xla (no config) <- none (auto on 'cpu': "), auto
  assert explicit["fwd"].source == "lut-exact"


def _bench_row(op: str, shape: str, variant: str) -> dict:
  with open(ROOT / "results" / "nvidia-h200" / f"bench-{op}.csv", newline="") as f:
    rows = [r for r in csv.DictReader(f) if r["shape"] == shape and r["variant"] == variant]
  assert len(rows) == 1, (op, shape, variant)
  return rows[0]


def _headline(shape: str) -> tuple[dict, dict]:
  """(the faster of our two defaults, {peer: its time over ours}) of a forward in the H200 CSV."""
  ours = min(
    (_bench_row("fwd", shape, f"{b} default") for b in ("pallas_gpu", "mosaic_gpu")), key=lambda r: float(r["ms"])
  )
  peers = {"tokamax": "tokamax ragged_dot", "XLA": "xla ragged_dot", "dense": "dense matmul, same FLOPs"}
  ratios = {}
  for name, variant in peers.items():
    row = _bench_row("fwd", shape, variant)
    if row["status"] == "ok":
      ratios[name] = float(row["ms"]) / float(ours["ms"])
  return ours, ratios


def test_the_front_pages_gpu_figures_are_the_committed_csvs():
  """The figures the README's first paragraph quotes, recomputed from results/nvidia-h200/'s CSV:
  a new bench there that moves them fails here until the text says what it measured."""
  text = " ".join(README.read_text().split("\n\n")[1].split())
  ours, r = _headline("[8192,4096]x[8,4096,14336]")
  assert "(results/nvidia-h200/README.md)" in text
  assert f"forward runs at {float(ours['tflops']):.0f} TF/s: {r['tokamax']:.2f}x tokamax" in text, text
  assert f"{r['XLA']:.2f}x XLA's `ragged_dot` and {r['dense']:.2f}x a dense matmul" in text, text
  (_, up), (_, down) = _headline("[131072,7168]x[256,7168,2048]"), _headline("[131072,2048]x[256,2048,7168]")
  assert f"at {up['tokamax']:.2f}x and {down['tokamax']:.2f}x tokamax" in text, text
  assert f"and {up['dense']:.2f}x and {down['dense']:.2f}x dense" in text, text
