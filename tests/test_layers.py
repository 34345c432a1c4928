"""The import layers of docs/layout.md hold: no import cycle in ragtune/ or kernels/, and no
module importing a layer above its own; kernels imports neither ragtune nor the CLI's
libraries. Every import counts, wherever it is written: at the top, inside a function, under
`if TYPE_CHECKING:`, and importlib.import_module of a name the code spells out. Read with
`ast` alone, nothing imported."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / "docs" / "layout.md"
PACKAGES = ("ragtune", "kernels")
KERNELS_NEVER = ("ragtune", "typer", "rich", "pandas")  # the runtime a model imports stays small


def layers(text: str) -> list[tuple[str, list[str]]]:
  """(layer, its paths) from the first code block under "## Import layers", lowest first
  (the block lists them highest first, as the diagram above it)."""
  section = text.split("\n## Import layers\n", 1)[1]
  block = re.search(r"^```\w*\n(.*?)^```", section, re.M | re.S).group(1)
  rows = [line.split() for line in block.splitlines() if line.strip()]
  return [(row[0], row[1:]) for row in reversed(rows)]


def modules(root: Path = ROOT) -> dict[str, Path]:
  """Dotted name -> file of every module of PACKAGES."""
  out = {}
  for pkg in PACKAGES:
    for path in sorted((root / pkg).rglob("*.py")):
      parts = path.relative_to(root).with_suffix("").parts
      out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return out


def layer_of(path: Path, table: list[tuple[str, list[str]]], root: Path = ROOT) -> int | None:
  """The index (0 lowest) of the layer that lists the file or the deepest folder holding it."""
  rel = path.relative_to(root).as_posix()
  found = [
    (len(p), i) for i, (_, paths) in enumerate(table) for p in paths if rel == p or rel.startswith(p.rstrip("/") + "/")
  ]
  return max(found)[1] if found else None


def _constants(node: ast.AST | None, assigned: dict[str, list[str]]) -> list[str]:
  """The strings an expression can be: a constant, a tuple or list of them, or a module-level name bound to one."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return [node.value]
  if isinstance(node, (ast.Tuple, ast.List)):
    return [s for e in node.elts for s in _constants(e, assigned)]
  if isinstance(node, ast.Name):
    return assigned.get(node.id, [])
  return []


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[int, str]]:
  """(line, imported module) of every import in the file: a module of PACKAGES by its full
  name (the deepest one the import names: `from ragtune.records import store` is
  ragtune.records.store), any other by its top-level name."""
  tree = ast.parse(path.read_text(), str(path))
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  # Names bound to strings, so that importlib.import_module(m) `for m in _MODULES` is read too.
  assigned: dict[str, list[str]] = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Assign):
      for t in node.targets:
        if isinstance(t, ast.Name) and (found := _constants(node.value, assigned)):
          assigned[t.id] = found
    elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
      if found := _constants(node.iter, assigned):
        assigned[node.target.id] = found

  def resolved(dotted: str) -> str:
    if dotted.split(".")[0] not in PACKAGES:
      return dotted.split(".")[0]
    while dotted not in known and "." in dotted:
      dotted = dotted.rpartition(".")[0]
    return dotted

  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [(node.lineno, resolved(a.name)) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: from the module's package, one level up per extra dot
        up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join(up + ([node.module] if node.module else []))
      out += [(node.lineno, resolved(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)) for a in node.names]
    elif isinstance(node, ast.Call) and node.args:
      f = node.func
      called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
      if called == "import_module":
        out += [(node.lineno, resolved(s)) for s in _constants(node.args[0], assigned) if not s.startswith(".")]
  return sorted({(line, m) for line, m in out if m != name})


def graph(root: Path = ROOT) -> dict[str, list[tuple[int, str]]]:
  known = modules(root)
  return {m: imports(m, p, known) for m, p in known.items()}


def cycles(edges: dict[str, list[tuple[int, str]]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
  succ = {m: sorted({t for _, t in e if t in edges}) for m, e in edges.items()}
  index, low, stack, on, out = {}, {}, [], set(), []
  for start in succ:
    if start in index:
      continue
    work = [(start, iter(succ[start]))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on.add(start)
    while work:
      v, it = work[-1]
      w = next(it, None)
      if w is None:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[v])
        if low[v] == index[v]:
          comp = []
          while True:
            x = stack.pop()
            on.discard(x)
            comp.append(x)
            if x == v:
              break
          if len(comp) > 1:
            out.append(sorted(comp))
      elif w not in index:
        index[w] = low[w] = len(index)
        stack.append(w)
        on.add(w)
        work.append((w, iter(succ[w])))
      elif w in on:
        low[v] = min(low[v], index[w])
  return out


def cycle_path(
  comp: list[str], edges: dict[str, list[tuple[int, str]]], known: dict[str, Path], root: Path = ROOT
) -> str:
  """One cycle through the component's first module, each step with the file and line of its import."""
  inside, start = set(comp), comp[0]
  came: dict[str, tuple[str, int]] = {}
  frontier = [start]
  while frontier and start not in came:
    nxt = []
    for v in frontier:
      for line, w in edges[v]:
        if w in inside and w not in came:
          came[w] = (v, line)
          nxt.append(w)
    frontier = nxt
  steps, v = [], start
  while True:
    u, line = came[v]
    steps.append(f"{u} ({known[u].relative_to(root)}:{line}) -> {v}")
    v = u
    if v == start:
      break
  return "; ".join(reversed(steps))


_SAMPLE = {
  "ragtune/__init__.py": "",
  "ragtune/top.py": "",
  "ragtune/a/__init__.py": "",
  "ragtune/a/y.py": "name_in_y = 1\n",
  "ragtune/b/__init__.py": "",
  "ragtune/b/z.py": "",
  "ragtune/b/w.py": "class Thing: ...\n",
  "ragtune/a/x.py": """import importlib
from typing import TYPE_CHECKING
from . import y
from .. import top
from ..b import z as zz
import ragtune.b.z
if TYPE_CHECKING:
  from ragtune.b.w import Thing
_MODS = ("ragtune.b", "json")
def f():
  from .y import name_in_y
  for m in _MODS:
    importlib.import_module(m)
  return [importlib.import_module(n) for n in ("ragtune.top",)]
""",
}


def test_imports_are_read_in_every_form(tmp_path):
  """Relative imports, `from package import module`, TYPE_CHECKING and lazy ones, and
  import_module of names bound to constants, each resolved to the module it loads."""
  for name, text in _SAMPLE.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
  known = modules(tmp_path)
  got = imports("ragtune.a.x", known["ragtune.a.x"], known)
  assert got == [
    (1, "importlib"),
    (2, "typing"),
    (3, "ragtune.a.y"),
    (4, "ragtune.top"),
    (5, "ragtune.b.z"),
    (6, "ragtune.b.z"),
    (8, "ragtune.b.w"),
    (11, "ragtune.a.y"),
    (13, "json"),
    (13, "ragtune.b"),
    (14, "ragtune.top"),
  ], got
  edges = {"p": [(1, "q")], "q": [(2, "r")], "r": [(3, "p")], "s": [(4, "p")]}
  assert cycles(edges) == [["p", "q", "r"]]
  paths = {m: tmp_path / f"{m}.py" for m in edges}
  assert cycle_path(["p", "q", "r"], edges, paths, tmp_path) == "p (p.py:1) -> q; q (q.py:2) -> r; r (r.py:3) -> p"


def test_layers_list_every_module_once_and_only_paths_that_exist():
  table = layers(LAYOUT.read_text())
  assert [n for n, _ in table][0] == "kernels", "kernels is the lowest layer"
  listed = [p for _, paths in table for p in paths]
  assert len(listed) == len(set(listed)), f"a path in two layers: {listed}"
  assert not [p for p in listed if not (ROOT / p).exists()], "docs/layout.md names paths that are not there"
  stray = [str(p.relative_to(ROOT)) for p in modules().values() if layer_of(p, table) is None]
  assert not stray, f"modules in no layer of docs/layout.md (## Import layers): {stray}"


def test_no_import_cycle():
  known, edges = modules(), graph()
  found = cycles(edges)
  assert not found, "import cycles:\n" + "\n".join(
    f"{len(c)} modules {c}: {cycle_path(c, edges, known)}" for c in found
  )


def test_each_module_imports_only_its_layer_and_those_below():
  table, known, edges = layers(LAYOUT.read_text()), modules(), graph()
  names = [n for n, _ in table]
  up = [
    f"{known[m].relative_to(ROOT)}:{line}: {m} ({names[mine]}) imports {t} ({names[theirs]})"
    for m, e in edges.items()
    for line, t in e
    if t in known and (mine := layer_of(known[m], table)) is not None and (theirs := layer_of(known[t], table)) > mine
  ]
  assert not up, "imports of a layer above (order in docs/layout.md, ## Import layers):\n" + "\n".join(up)


def test_kernels_imports_no_ragtune_nor_cli_libraries():
  known = modules()
  bad = [
    f"{p.relative_to(ROOT)}:{line}: imports {t}"
    for m, p in known.items()
    if m.split(".")[0] == "kernels"
    for line, t in imports(m, p, known)
    if t.split(".")[0] in KERNELS_NEVER
  ]
  assert not bad, bad
