"""Shape sets: the YAML schema, its validation, and expansion into tuning problems.

A file (loaded with yaml.safe_load semantics only; tags are never executed)::

  name: smoke
  dtype: bfloat16                       # default dtype: bfloat16 | float16 | float32
  ops: [fwd, dlhs, drhs]                # default [fwd]
  backends: [pallas_gpu]                # default: the first tunable backend of kernels.registry
  group_sizes: {dist: multinomial, seed: 0}   # default; see GroupDist
  shapes:
    - {m: 256, k: 128, n: 128, g: 8}
    - {m: 96, k: 48, n: 80, g: 3, dtype: float32, group_sizes: [40, 0, 50]}
  models:
    - {model: mixtral-8x7b, tokens: [16, 8192]}          # up (k->n) and down (n->k)
    - {model: deepseek-v3, tokens: [64], top_k: 8, projections: [up]}
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from kernels import registry
from kernels.common import DTYPES, OPS
from kernels.registry import NAMES as BACKENDS
from ragtune.errors import RagtuneError
from ragtune.presets import MODEL_PRESETS

Op = Literal["fwd", "dlhs", "drhs"]
Backend = Literal[BACKENDS]  # type: ignore[valid-type]  # the registry's names
Dtype = Literal["bfloat16", "float16", "float32"]


class GroupDist(BaseModel):
  """How tokens are routed to the g groups when drawing group sizes.

  dist: uniform (even split) | multinomial (default: random routing, seeded) |
        zipf (skewed: weights 1/rank**alpha, with `empty_fraction` of experts unused).
  fill: fraction of the m rows that are routed; below 1 leaves trailing rows (output 0).
  """

  model_config = ConfigDict(extra="forbid")
  dist: Literal["uniform", "multinomial", "zipf"] = "multinomial"
  seed: int = 0
  alpha: float = Field(1.2, gt=0)
  empty_fraction: float = Field(0.1, ge=0, lt=1)
  fill: float = Field(1.0, gt=0, le=1)

  def label(self) -> str:
    if self.dist == "uniform":
      core = "uniform"
    elif self.dist == "multinomial":
      core = f"multinomial(seed={self.seed})"
    else:
      core = f"zipf(alpha={self.alpha},empty={self.empty_fraction},seed={self.seed})"
    return core if self.fill == 1 else f"{core},fill={self.fill}"

  def draw(self, m: int, g: int) -> np.ndarray:
    rows = int(round(m * self.fill))
    rng = np.random.default_rng(self.seed)
    if self.dist == "uniform":
      sizes = np.full(g, rows // g)
      sizes[: rows % g] += 1
    elif self.dist == "multinomial":
      sizes = rng.multinomial(rows, np.full(g, 1.0 / g))
    else:
      weights = 1.0 / np.arange(1, g + 1) ** self.alpha
      rng.shuffle(weights)
      n_empty = min(g - 1, int(round(g * self.empty_fraction)))
      weights[rng.choice(g, n_empty, replace=False)] = 0.0
      sizes = rng.multinomial(rows, weights / weights.sum())
    return sizes.astype(np.int32)


GroupSizesField = list[int] | GroupDist


class ShapeSpec(BaseModel):
  model_config = ConfigDict(extra="forbid")
  m: PositiveInt
  k: PositiveInt
  n: PositiveInt
  g: PositiveInt
  dtype: Dtype | None = None
  group_sizes: GroupSizesField | None = None

  @model_validator(mode="after")
  def _explicit_sizes_fit(self):
    gs = self.group_sizes
    if isinstance(gs, list):
      if len(gs) != self.g:
        raise ValueError(f"group_sizes has {len(gs)} entries but g={self.g}")
      if any(s < 0 for s in gs):
        raise ValueError("group_sizes must be non-negative")
      if sum(gs) > self.m:
        raise ValueError(f"group_sizes sum to {sum(gs)}, more than m={self.m}")
    return self


class ModelSpec(BaseModel):
  model_config = ConfigDict(extra="forbid")
  model: str
  tokens: list[PositiveInt] = Field(min_length=1)
  top_k: PositiveInt | None = None
  projections: list[Literal["up", "down"]] = ["up", "down"]
  dtype: Dtype | None = None
  group_sizes: GroupDist | None = None

  @field_validator("model")
  @classmethod
  def _known_model(cls, v: str) -> str:
    if v.lower() not in MODEL_PRESETS:
      raise ValueError(f"unknown model {v!r}; presets: {', '.join(sorted(MODEL_PRESETS))}")
    return v.lower()


class ShapeSet(BaseModel):
  model_config = ConfigDict(extra="forbid")
  name: str | None = None
  dtype: Dtype = "bfloat16"
  ops: list[Op] = Field(default_factory=lambda: ["fwd"], min_length=1)
  backends: list[Backend] = Field(default_factory=lambda: [registry.tunable()[0]], min_length=1)
  group_sizes: GroupDist = Field(default_factory=GroupDist)
  max_candidates: PositiveInt | None = None
  shapes: list[ShapeSpec] = []
  models: list[ModelSpec] = []

  @model_validator(mode="after")
  def _not_empty(self):
    if not self.shapes and not self.models:
      raise ValueError("a shape set needs at least one entry under 'shapes' or 'models'")
    return self


@dataclasses.dataclass(frozen=True)
class Problem:
  """One thing to tune: an op of a backend on a shape with concrete group sizes."""

  op: str
  backend: str
  dtype: str
  m: int
  k: int
  n: int
  g: int
  group_dist: str
  group_sizes: tuple[int, ...]
  source: str = ""

  @functools.cached_property  # a sha1 per call; records and summaries ask for it often
  def key(self) -> str:
    digest = hashlib.sha1(json.dumps(self.group_sizes).encode()).hexdigest()[:8]
    return f"{self.op}|{self.backend}|{self.dtype}|{self.m}x{self.k}x{self.n}x{self.g}|{digest}"

  @property
  def shape_label(self) -> str:
    return f"[{self.m},{self.k}]x[{self.g},{self.k},{self.n}]"

  def fields(self) -> dict[str, Any]:
    return {
      "op": self.op,
      "backend": self.backend,
      "dtype": self.dtype,
      "m": self.m,
      "k": self.k,
      "n": self.n,
      "g": self.g,
      "group_dist": self.group_dist,
    }


# --- loading --------------------------------------------------------------------------


class _DuplicateKey(yaml.constructor.ConstructorError):
  pass


class _NoTagLoader(yaml.SafeLoader):
  """SafeLoader that reports, rather than executes or half-parses, any explicit tag, and
  refuses a key given twice in one mapping (plain YAML keeps the last silently)."""

  def construct_mapping(self, node, deep=False):
    if isinstance(node, yaml.MappingNode):
      seen: dict[Any, int] = {}
      for key_node, _ in node.value:
        key = getattr(key_node, "value", None)
        if isinstance(key_node, yaml.ScalarNode) and key != "<<":
          if key in seen:
            raise _DuplicateKey(
              None, None, f"duplicate key {key!r} (first given on line {seen[key]})", key_node.start_mark
            )
          seen[key] = key_node.start_mark.line + 1
    return super().construct_mapping(node, deep=deep)


def _line_of(root: yaml.Node | None, loc: tuple) -> int | None:
  node, line = root, None
  for part in loc:
    if node is None:
      break
    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
      node = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
    elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
      node = node.value[part]
    else:
      node = None
  if node is not None:
    line = node.start_mark.line + 1
  return line


def _format_loc(loc: tuple) -> str:
  out = ""
  for part in loc:
    if isinstance(part, int):
      out += f"[{part}]"
    elif part in ("list[int]", "GroupDist", "function-after[_explicit_sizes_fit(), ShapeSpec]"):
      continue
    else:
      out += f".{part}" if out else str(part)
  return out or "(top level)"


_UNION_TAGS = ("list[int]", "GroupDist")


def _best_error(errors: list[dict], data: Any) -> dict:
  """The error to report. For `group_sizes` (a list, or a routing mapping) pydantic reports
  both union branches; report the branch the input was written as, so a bad knob such as
  alpha: -1 is named, not 'Input should be a valid list'."""

  def value_at(loc):
    v = data
    for part in loc:
      if part in _UNION_TAGS:
        return v
      try:
        v = v[part]
      except (KeyError, IndexError, TypeError):
        return None
    return v

  def wrong_branch(err):
    loc = err["loc"]
    v = value_at(loc)
    return ("list[int]" in loc and isinstance(v, dict)) or ("GroupDist" in loc and isinstance(v, list))

  return next((err for err in errors if not wrong_branch(err)), errors[0])


def load_shape_set(path: str | Path) -> ShapeSet:
  """Parse and validate a shapes file; errors name the file, key and line."""
  p = Path(path)
  try:
    text = p.read_text()
  except FileNotFoundError:
    raise RagtuneError(f"{p}: no such shapes file") from None
  except OSError as e:
    raise RagtuneError(f"{p}: cannot read ({e.strerror or e})") from None
  try:
    root = yaml.compose(text, Loader=_NoTagLoader)
    data = yaml.load(text, Loader=_NoTagLoader)
  except _DuplicateKey as e:
    raise RagtuneError(f"{p}:{e.problem_mark.line + 1}: {e.problem}") from None
  except yaml.constructor.ConstructorError as e:
    mark = e.problem_mark
    raise RagtuneError(
      f"{p}:{mark.line + 1}: unsupported YAML tag ({e.problem}); "
      "shapes files are plain data and tags are never executed"
    ) from None
  except yaml.YAMLError as e:
    mark = getattr(e, "problem_mark", None)
    where = f"{p}:{mark.line + 1}" if mark else str(p)
    raise RagtuneError(f"{where}: malformed YAML ({getattr(e, 'problem', None) or e})") from None
  if data is None:
    raise RagtuneError(f"{p}: empty shapes file (expected keys such as 'shapes' or 'models')")
  if not isinstance(data, dict):
    raise RagtuneError(f"{p}:1: top level must be a mapping, got {type(data).__name__}")
  try:
    return ShapeSet.model_validate(data)
  except ValidationError as e:
    err = _best_error(e.errors(), data)
    loc = tuple(x for x in err["loc"])
    line = _line_of(root, loc)
    where = f"{p}:{line}" if line else str(p)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
      msg = "unknown key"
    raise RagtuneError(f"{where}: {_format_loc(loc)}: {msg}") from None


# --- expansion ------------------------------------------------------------------------


def _shape_rows(spec: ShapeSet) -> list[tuple[int, int, int, int, str, Any, str]]:
  rows = []
  for i, s in enumerate(spec.shapes):
    rows.append((s.m, s.k, s.n, s.g, s.dtype or spec.dtype, s.group_sizes or spec.group_sizes, f"shapes[{i}]"))
  for mdl in spec.models:
    pre = MODEL_PRESETS[mdl.model]
    top_k = mdl.top_k or pre.top_k
    for t in mdl.tokens:
      m = t * top_k
      for proj in mdl.projections:
        k, n = (pre.hidden, pre.intermediate) if proj == "up" else (pre.intermediate, pre.hidden)
        rows.append(
          (
            m,
            k,
            n,
            pre.experts,
            mdl.dtype or spec.dtype,
            mdl.group_sizes or spec.group_sizes,
            f"{mdl.model}:{proj}:tokens={t}",
          )
        )
  return rows


def expand(spec: ShapeSet, *, ops: list[str] | None = None, backends: list[str] | None = None) -> list[Problem]:
  """Shapes x ops x backends, each with concrete group sizes; duplicates dropped."""
  ops = ops or spec.ops
  backends = backends or spec.backends
  bad = [o for o in ops if o not in OPS] + [b for b in backends if b not in BACKENDS]
  if bad:
    raise RagtuneError(f"unknown op/backend {bad}; ops: {OPS}, backends: {BACKENDS}")
  problems, seen = [], set()
  for m, k, n, g, dtype, gsz, source in _shape_rows(spec):
    assert dtype in DTYPES
    if isinstance(gsz, list):
      sizes, label = np.asarray(gsz, np.int32), "explicit"
    else:
      sizes, label = gsz.draw(m, g), gsz.label()
    for op in ops:
      for backend in backends:
        p = Problem(op, backend, dtype, m, k, n, g, label, tuple(int(s) for s in sizes), source)
        if p.key not in seen:
          seen.add(p.key)
          problems.append(p)
  return problems


# --- selection (sweep and verify) -----------------------------------------------------


def parse_shape(text: str) -> tuple[int, int, int]:
  """'M,K,N' -> (m, k, n), the forward problem's dims."""
  parts = [t.strip() for t in text.split(",")]
  try:
    dims = tuple(int(t) for t in parts)
  except ValueError:
    dims = ()
  if len(dims) != 3 or any(d <= 0 for d in dims):
    raise RagtuneError(f"--shape {text!r}: expected three positive integers M,K,N (e.g. 96,64,80)")
  return dims


def select(
  items: list,
  *,
  ops: list[str] | None = None,
  shapes: list[str] | None = None,
  models: list[str] | None = None,
  what: str = "problem",
) -> list:
  """The items (Problems, or LUT entries: anything with op, m, k, n) that every given selector
  keeps: op among `ops`, (m, k, n) among `shapes` ('M,K,N'), and, for Problems, expanded
  from one of `models` (presets). An empty result is an error naming the selectors.
  """
  bad = [o for o in ops or [] if o not in OPS]
  if bad:
    raise RagtuneError(f"--op {', '.join(bad)}: unknown op; ops: {', '.join(OPS)}")
  dims = {parse_shape(s) for s in shapes or []}
  names = [m.lower() for m in models or []]
  unknown = [m for m in names if m not in MODEL_PRESETS]
  if unknown:
    raise RagtuneError(f"--model {', '.join(unknown)}: unknown model; presets: {', '.join(sorted(MODEL_PRESETS))}")
  out = [
    x
    for x in items
    if (not ops or x.op in ops)
    and (not dims or (x.m, x.k, x.n) in dims)
    and (not names or getattr(x, "source", "").split(":")[0] in names)
  ]
  if not out and items:
    given = " ".join(
      [f"--op {o}" for o in ops or []] + [f"--shape {s}" for s in shapes or []] + [f"--model {m}" for m in models or []]
    )
    raise RagtuneError(f"no {what} matches {given} (of {len(items)} {what}s)")
  return out
