"""Shape sets: the YAML schema, its validation, and expansion into tuning problems.

A file (loaded with yaml.safe_load semantics only; tags are never executed)::

  name: smoke
  dtype: bfloat16                       # default dtype: bfloat16 | float16 | float32 | float8_e4m3fn | int8
  scales: block128                      # with float8_e4m3fn or int8: channelwise | block128 (kernels.quant)
  ops: [fwd, dlhs, drhs]                # default [fwd]
  backends: [<backend>]                 # kernels.registry's names; default: its first tunable backend
  group_sizes: {dist: multinomial, seed: 0}   # default; see GroupDist
  shapes:
    - {m: 256, k: 128, n: 128, g: 8}
    - {m: 96, k: 48, n: 80, g: 3, dtype: float32, group_sizes: [40, 0, 50]}
  models:
    - {model: mixtral-8x7b, tokens: [16, 8192]}          # up (k->n) and down (n->k)
    - {model: deepseek-v3, tokens: [64], top_k: 8, projections: [up]}
    - {model: qwen3-30b-a3b, tokens: [4096], ep: 8, tp: 2, fused_gate_up: true}
    - {model: deepseek-v3, tokens: [4096], dtype: shipped}   # the preset's released weights' format
    - {name: my-moe, hidden: 2048, intermediate: 768, experts: 128, top_k: 8, tokens: [64]}

A model entry is laid out over ep x tp ranks and tuned as one rank's local problem, the one
`kernels.ragged_dot` looks up there (m = lhs rows, g = rhs.shape[0], k and n of the local rhs):
  ep: each rank holds experts/ep experts and the ceil(tokens*top_k/ep) rows that balanced
      routing sends it (rounded up: where the share is not whole, the ranks with one row
      more set the step time); its group sizes follow the routing weights of its experts,
      taken from those of all the experts (see GroupDist.draw_shard);
  tp: splits the intermediate dim: up n/tp (column parallel), down k/tp (row parallel);
  fused_gate_up: the up projection computes gate and up at once, n = 2 x intermediate.

Quantized operands (dtype float8_e4m3fn or int8, with `scales`) are tuned as the format
"<dtype>:<scales>" (common.QUANT_FORMATS), the key of their LUT entries, and forward only,
but for a training format (kernels.common.TRAINING_FORMATS: ragged_dot's quantize=), whose
dlhs and drhs are tuned too where an entry (or the file) lists them. An entry without its own
ops takes the file's, [fwd] by default: a serving file's rows stay forward only.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import (
  AfterValidator,
  BaseModel,
  ConfigDict,
  Field,
  NonNegativeInt,
  PositiveInt,
  PrivateAttr,
  ValidationError,
  field_validator,
  model_validator,
)

from kernels import registry
from kernels.common import DTYPES, FORMATS, OPS, QUANT_DTYPES, TRAINING_FORMATS
from kernels.lut import shape_text
from kernels.registry import NAMES as BACKENDS
from ragtune.errors import RagtuneError, read_text
from ragtune.problems.presets import MODEL_PRESETS, SHIPPED_FORMATS, MoePreset
from ragtune.words import count

Op = Literal["fwd", "dlhs", "drhs"]
Backend = Literal[BACKENDS]  # type: ignore[valid-type]  # the registry's names
Dtype = Literal["bfloat16", "float16", "float32", "float8_e4m3fn", "int8"]
Scales = Literal["channelwise", "block128"]
SHIPPED = "shipped"  # a model entry's dtype: the format of the preset's released weights


class GroupDist(BaseModel):
  """How tokens are routed to the g groups when drawing group sizes.

  dist: uniform (even split) | multinomial (default: random routing, seeded) |
        zipf (skewed: weights 1/rank**alpha, with `empty_fraction` of experts unused).
  fill: fraction of the m rows that are routed; below 1 leaves trailing rows (output 0).
  """

  model_config = ConfigDict(extra="forbid")
  dist: Literal["uniform", "multinomial", "zipf"] = "multinomial"
  seed: int = Field(0, ge=0)  # numpy's generators take no negative seed
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
    return self.draw_shard(m, g, 1)[0]

  def draw_shard(self, m: int, g: int, ep: int) -> tuple[np.ndarray, int]:
    """The sizes of one of ep ranks that hold g/ep experts each, and that rank: m rows (times
    fill) over its experts by their share of the routing weights of all g experts, so zipf's
    hot and empty experts stay. The rank is the one with the most weight (the first on a tie),
    the rank an expert-parallel step waits for. ep=1 is the plain draw over g."""
    rows = int(round(m * self.fill))
    g_local = g // ep
    rng = np.random.default_rng(self.seed)
    if self.dist == "uniform":
      sizes = np.full(g_local, rows // g_local)
      sizes[: rows % g_local] += 1
      return sizes.astype(np.int32), 0
    if self.dist == "multinomial":
      return rng.multinomial(rows, np.full(g_local, 1.0 / g_local)).astype(np.int32), 0
    weights = 1.0 / np.arange(1, g + 1) ** self.alpha
    rng.shuffle(weights)
    n_empty = min(g - 1, int(round(g * self.empty_fraction)))
    weights[rng.choice(g, n_empty, replace=False)] = 0.0
    rank = int(np.argmax(weights.reshape(ep, g_local).sum(axis=1)))
    local = weights[rank * g_local : (rank + 1) * g_local]
    return rng.multinomial(rows, local / local.sum()).astype(np.int32), rank


GroupSizesField = list[int] | GroupDist


class At(ValueError):
  """A cross-field error of one key (or entry): `loc` below the model that raised it, so the
  message names that key and its line rather than the whole entry."""

  def __init__(self, loc: tuple[str | int, ...], msg: str):
    super().__init__(msg)
    self.loc = loc


def _no_repeats(values: list) -> list:
  repeated = next((v for i, v in enumerate(values) if v in values[:i]), None)
  if repeated is not None:
    raise ValueError(f"{repeated!r} is given twice")
  return values


Once = AfterValidator(_no_repeats)  # a list whose items are distinct


OutDtype = Literal[DTYPES]  # type: ignore[valid-type]  # kernels.common's unquantized dtypes


class ShapeSpec(BaseModel):
  """One problem. `ops` (the file's when absent) is a list, or {op: calls a step} as
  `ragtune.capture` writes it; transpose_rhs, out_dtype, group_offset and site say how the
  model calls it (the LUT looks a call up by m, k, n, g and dtype alone, in the [g,k,n] frame)."""

  model_config = ConfigDict(extra="forbid")
  m: PositiveInt
  k: PositiveInt
  n: PositiveInt
  g: PositiveInt
  dtype: Dtype | None = None
  scales: Scales | None = None
  group_sizes: GroupSizesField | None = None
  ops: Annotated[list[Op], Once] | dict[Op, PositiveInt] | None = None
  transpose_rhs: bool = False
  out_dtype: OutDtype | None = None
  group_offset: NonNegativeInt | None = None
  site: str | None = None

  @field_validator("ops")
  @classmethod
  def _some_ops(cls, v):
    if v is not None and not v:
      raise ValueError("give at least one op, or leave ops out for the file's")
    return v

  def op_list(self) -> list[str] | None:
    """The entry's own ops, in OPS order for a mapping; None: the file's."""
    if isinstance(self.ops, dict):
      return [o for o in OPS if o in self.ops]
    return self.ops

  @model_validator(mode="after")
  def _explicit_sizes_fit(self):
    gs = self.group_sizes
    if isinstance(gs, list):
      if len(gs) != self.g:
        raise At(("group_sizes",), f"{count(len(gs), 'entry')}, but g={self.g}")
      if any(s < 0 for s in gs):
        raise At(("group_sizes",), "sizes must be non-negative")
      if sum(gs) > self.m:
        raise At(("group_sizes",), f"sizes sum to {sum(gs)}, more than m={self.m}")
    return self


_LAYER_KEYS = ("hidden", "intermediate", "experts", "top_k")


class ModelSpec(BaseModel):
  """A MoE layer at some token counts: a preset (`model:`) or given explicitly (`name:` with
  hidden, intermediate, experts and top_k), tuned as one rank's problem under ep x tp."""

  model_config = ConfigDict(extra="forbid")
  model: str | None = None
  name: str | None = None
  hidden: PositiveInt | None = None
  intermediate: PositiveInt | None = None
  experts: PositiveInt | None = None
  top_k: PositiveInt | None = None
  tokens: Annotated[list[PositiveInt], Once] = Field(min_length=1)
  projections: Annotated[list[Literal["up", "down"]], Once] = Field(["up", "down"], min_length=1)
  fused_gate_up: bool = False
  ep: PositiveInt = 1
  tp: PositiveInt = 1
  dtype: Dtype | Literal["shipped"] | None = None
  scales: Scales | None = None
  group_sizes: GroupDist | None = None

  @field_validator("model")
  @classmethod
  def _known_model(cls, v: str) -> str:
    if v.lower() not in MODEL_PRESETS:
      raise ValueError(f"unknown model {v!r}; presets: {', '.join(sorted(MODEL_PRESETS))}")
    return v.lower()

  @field_validator("name")
  @classmethod
  def _plain_name(cls, v: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v):  # ':' would split a problem's `source`
      raise ValueError(f"{v!r}: use letters, digits, '.', '_' and '-'")
    return v.lower()  # as presets and --model are

  @model_validator(mode="after")
  def _layer_fits(self):
    if (self.model is None) == (self.name is None):
      either = "give either model: (a preset) or name: (a layer with hidden, intermediate, experts and top_k)"
      raise At(("name",), either) if self.name is not None else ValueError(either)
    if self.model is not None:
      given = next((key for key in _LAYER_KEYS[:3] if getattr(self, key) is not None), None)
      if given:
        raise At((given,), f"set by the preset {self.model}; for other values use name: instead of model:")
    else:
      missing = [key for key in _LAYER_KEYS if getattr(self, key) is None]
      if missing:
        raise At(("name",), f"an explicit layer needs {', '.join(_LAYER_KEYS)}; missing: {', '.join(missing)}")
    layer = self.layer()
    if layer.top_k > layer.experts:
      raise At(("top_k",), f"{layer.top_k} is more than the {layer.experts} experts of {self.label}")
    if layer.experts % self.ep:
      raise At(("ep",), f"{self.ep} does not divide the {layer.experts} experts of {self.label}")
    if layer.intermediate % self.tp:
      raise At(("tp",), f"{self.tp} does not divide the intermediate size {layer.intermediate} of {self.label}")
    if self.fused_gate_up and "up" not in self.projections:
      raise At(("fused_gate_up",), "fuses gate into the up projection, but projections leaves up out")
    if self.dtype == SHIPPED:
      if self.model is None:
        raise At(("dtype",), "'shipped' takes a preset's released format; give an explicit layer its dtype")
      if self.scales is not None:
        raise At(("scales",), f"'dtype: shipped' sets the scales of {self.model} ({self.shipped})")
    return self

  @property
  def label(self) -> str:
    return self.model or self.name

  @property
  def shipped(self) -> str:
    """The format of the preset's released weights (presets.SHIPPED_FORMATS), else bfloat16."""
    return SHIPPED_FORMATS.get(self.model or "", "bfloat16")

  def layer(self) -> MoePreset:
    """The whole layer (before ep and tp): the preset's, with a top_k override, or the explicit one."""
    if self.model is not None:
      pre = MODEL_PRESETS[self.model]
      return pre._replace(top_k=self.top_k or pre.top_k)
    return MoePreset(self.hidden, self.intermediate, self.experts, self.top_k)


def trained(op: str, dtype: str) -> bool:
  """Whether `op` of format `dtype` is a gradient of fp8 training (ragged_dot's quantize=):
  dlhs or drhs of a training format, run on float operands that kernels.ragged_dot.train_op
  quantizes as the recipe does. A training format's fwd is tuned as a serving forward, on
  operands that come quantized: the same kernel and LUT entry."""
  return op != "fwd" and dtype in TRAINING_FORMATS


def forward_only(fmt: str, ops: list[str]) -> str:
  """Why a format cannot be tuned for `ops`, or "": a quantized format other than a
  training format runs the forward alone (kernels.ragged_dot differentiates none)."""
  if ":" not in fmt or fmt in TRAINING_FORMATS or ops == ["fwd"]:
    return ""
  return (
    f"{fmt} operands are tuned forward only (ops: [fwd]), got {ops}; "
    f"dlhs and drhs are tuned for the training formats {', '.join(TRAINING_FORMATS)}"
  )


def operand_format(dtype: str, scales: str | None) -> str:
  """The format a (dtype, scales) pair tunes as; ValueError when one needs the other."""
  if dtype in QUANT_DTYPES and scales is None:
    raise ValueError(f"{dtype} operands need scales: channelwise or block128")
  if dtype not in QUANT_DTYPES and scales is not None:
    raise ValueError(f"scales apply to {' or '.join(QUANT_DTYPES)} operands, not {dtype}")
  return f"{dtype}:{scales}" if scales else dtype


class ShapeSet(BaseModel):
  model_config = ConfigDict(extra="forbid")
  name: str | None = None
  dtype: Dtype = "bfloat16"
  scales: Scales | None = None
  ops: Annotated[list[Op], Once] = Field(default_factory=lambda: ["fwd"], min_length=1)
  backends: Annotated[list[Backend], Once] = Field(default_factory=lambda: [registry.tunable()[0]], min_length=1)
  group_sizes: GroupDist = Field(default_factory=GroupDist)
  max_candidates: PositiveInt | None = None
  shapes: list[ShapeSpec] = []
  models: list[ModelSpec] = []
  _origin: str | None = PrivateAttr(default=None)  # how it was made, for write's header

  def text(self) -> str:
    """The shape file's text: first line filekind.CAPTURED_MARK, then how it was made."""
    from ragtune import filekind

    head = filekind.CAPTURED_MARK + "\n" + "".join(f"# {line}\n" for line in (self._origin or "").splitlines())
    data = self.model_dump(mode="json", exclude_unset=True)
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)

  def write(self, path: str | Path, *, force: bool = False) -> Path:
    """Write this set as a shape file every command takes (`text`), atomically. An existing
    file is replaced only if ragtune.capture wrote it, or with force."""
    from ragtune import filekind, paths

    path = paths.output_file(Path(path), "the shapes file", filekind.Kind.CAPTURED, force=force)
    paths.write_atomic(path, self.text())
    return path

  @model_validator(mode="after")
  def _not_empty(self):
    if not self.shapes and not self.models:
      raise ValueError("a shape set needs at least one entry under 'shapes' or 'models'")
    return self

  @model_validator(mode="after")
  def _formats_complete(self):
    """Each entry's dtype and scales make a format (an entry's own dtype brings its own
    scales; one it inherits, the file's), and quantized ones are tuned forward only, but for
    a training format's dlhs and drhs (forward_only)."""
    for i, entry in enumerate(self.shapes):
      own = entry.op_list()
      if own is not None and (why := forward_only(_format(entry, self), own)):
        raise At(("shapes", i, "ops"), why)
    for key in ("shapes", "models"):
      for i, entry in enumerate(getattr(self, key)):
        try:
          fmt = _format(entry, self)
        except ValueError as e:  # the key at fault: the entry's own, else the file's dtype
          own = entry.dtype is not None or entry.scales is not None
          raise At((key, i, "scales" if entry.scales is not None else "dtype") if own else ("dtype",), str(e)) from None
        if ":" in fmt and not any(fmt in registry.get(b).dtypes for b in self.backends):
          computes = [b for b in BACKENDS if fmt in registry.get(b).dtypes]
          raise At((key, i), f"{fmt} is computed by {', '.join(computes)}; backends lists {', '.join(self.backends)}")
    inherit = [*self.models, *(s for s in self.shapes if s.ops is None)]
    why = next((w for e in inherit if (w := forward_only(_format(e, self), self.ops))), "")
    if why:
      raise At(("ops",), why)
    return self

  @model_validator(mode="after")
  def _no_repeated_entries(self):
    for key in ("shapes", "models"):  # a pasted entry twice, most likely a slip
      entries = getattr(self, key)
      for i, entry in enumerate(entries):
        if entry in entries[:i]:
          raise At((key, i), f"the same entry as {key}[{entries.index(entry)}]")
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
  calls: int = 1  # calls a step, where a captured file says (ops: {op: calls}): weighs the budget and report

  @functools.cached_property  # a sha1 per call; records and summaries ask for it often
  def key(self) -> str:
    digest = hashlib.sha1(json.dumps(self.group_sizes).encode()).hexdigest()[:8]
    return f"{self.op}|{self.backend}|{self.dtype}|{self.m}x{self.k}x{self.n}x{self.g}|{digest}"

  @property
  def shape_label(self) -> str:
    return shape_text(self.m, self.k, self.n, self.g)

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


def _branch(part) -> str | None:
  """Which branch of a union a pydantic location part names: 'list' or 'mapping' (group_sizes,
  an entry's ops), else None."""
  if not isinstance(part, str):
    return None
  if part.startswith(("list[", "function-after[_no_repeats(), list[")):
    return "list"
  if part == "GroupDist" or part.startswith("dict["):
    return "mapping"
  return None


def _format_loc(loc: tuple) -> str:
  out = ""
  for part in loc:
    if isinstance(part, int):
      out += f"[{part}]"
    elif _branch(part) or part.startswith("function-after[") or part == "[key]":
      continue
    else:
      out += f".{part}" if out else str(part)
  return out or "(top level)"


def _best_error(errors: list[dict], data: Any) -> dict:
  """The error to report. For a union (group_sizes and an entry's ops: a list, or a mapping)
  pydantic reports both branches; report the branch the input was written as, so a bad knob
  such as alpha: -1 is named, not 'Input should be a valid list'."""

  def value_at(loc):
    v = data
    for part in loc:
      if _branch(part):
        return v
      try:
        v = v[part]
      except (KeyError, IndexError, TypeError):
        return None
    return v

  def wrong_branch(err):
    branch = next((b for b in map(_branch, err["loc"]) if b), None)
    v = value_at(err["loc"])
    return (branch == "list" and isinstance(v, dict)) or (branch == "mapping" and isinstance(v, list))

  return next((err for err in errors if not wrong_branch(err)), errors[0])


def load_shape_set(path: str | Path) -> ShapeSet:
  """Parse and validate a shapes file; errors name the file, key and line (or what else the
  file is: a LUT, a records file, a model's config.json)."""
  from ragtune import filekind

  p = Path(path)
  filekind.check_input(p, {filekind.Kind.SHAPES, filekind.Kind.FROM_CONFIG, filekind.Kind.CAPTURED}, "a shape file")
  try:
    text = read_text(p)
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

  def key_at(loc: tuple) -> str:
    line = _line_of(root, loc)
    return f"{p}:{line}: {_format_loc(loc)}" if line else f"{p}: {_format_loc(loc)}"

  return validate(data, key_at)


def validate(data: dict, where: Callable[[tuple], str]) -> ShapeSet:
  """The ShapeSet of `data`, or a RagtuneError '<where(loc)>: <why>' for the one key at fault,
  where `where` names the file and that key from its pydantic location."""
  try:
    return ShapeSet.model_validate(data)
  except ValidationError as e:
    err = _best_error(e.errors(), data)
    cause = err.get("ctx", {}).get("error")
    loc = tuple(err["loc"]) + (cause.loc if isinstance(cause, At) else ())
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
      msg = "unknown key"
    raise RagtuneError(f"{where(loc)}: {msg}") from None


# --- expansion ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Row:
  """One shape to tune, before ops and backends: the local problem of one rank."""

  m: int
  k: int
  n: int
  g: int  # the rank's groups
  dtype: str
  group_sizes: list[int] | GroupDist
  source: str
  ep: int = 1  # the g groups are one of ep ranks' share of g * ep experts
  ops: list[str] | dict[str, int] | None = None  # the entry's own ops (or {op: calls a step}); None: the file's


def _model_rows(mdl: ModelSpec, spec: ShapeSet) -> list[_Row]:
  """A model entry's (tokens, projection) problems, each one rank's under ep x tp (see the module doc)."""
  layer = mdl.layer()
  layout = "".join(f":{key}={v}" for key, v in (("ep", mdl.ep), ("tp", mdl.tp)) if v > 1)
  rows = []
  for t in mdl.tokens:
    for proj in mdl.projections:
      fused = mdl.fused_gate_up and proj == "up"
      inner = layer.intermediate // mdl.tp * (2 if fused else 1)
      k, n = (layer.hidden, inner) if proj == "up" else (inner, layer.hidden)
      rows.append(
        _Row(
          m=math.ceil(t * layer.top_k / mdl.ep),
          k=k,
          n=n,
          g=layer.experts // mdl.ep,
          dtype=_format(mdl, spec),
          group_sizes=mdl.group_sizes or spec.group_sizes,
          source=f"{mdl.label}:{'gate_up' if fused else proj}:tokens={t}{layout}",
          ep=mdl.ep,
        )
      )
  return rows


def _format(entry: ShapeSpec | ModelSpec, spec: ShapeSet) -> str:
  """An entry's format (checked by ShapeSet._formats_complete)."""
  if entry.dtype == SHIPPED:
    return entry.shipped
  if entry.dtype is not None or entry.scales is not None:
    return operand_format(entry.dtype or spec.dtype, entry.scales)
  return operand_format(spec.dtype, spec.scales)


def _shape_rows(spec: ShapeSet) -> list[_Row]:
  rows = [
    _Row(
      s.m,
      s.k,
      s.n,
      s.g,
      _format(s, spec),
      s.group_sizes or spec.group_sizes,
      s.site or f"shapes[{i}]",
      ops=s.ops,
    )
    for i, s in enumerate(spec.shapes)
  ]
  return rows + [row for mdl in spec.models for row in _model_rows(mdl, spec)]


def _untunable(b, op: str, row: _Row) -> str:
  """Why a training format's gradient is not tuned on backend b, or "": its default config
  does not fit the problem (Lut.query would take no entry of it; the op runs its default)."""
  if not trained(op, row.dtype) or b.config_type is None:
    return ""
  cfg = b.default_config(op, row.dtype, row.m, row.k, row.n, row.g, None)
  if cfg.fits(op, row.dtype, row.m, row.k, row.n, None):
    return ""
  return f"{b.name} tunes no {op} of {row.dtype} (a LUT entry would never be taken; it runs its default)"


def expand(
  spec: ShapeSet, *, ops: list[str] | None = None, backends: list[str] | None = None, skipped: list | None = None
) -> list[Problem]:
  """Shapes x ops x backends, each with concrete group sizes (an entry's own ops, those of
  `ops` among them when it is given, else the file's); duplicates dropped, and the
  (op, backend) pairs that cannot compute a row's format: a quantized format's ops other
  than fwd (but a training format's), and backends without it or its weight gradient. Each
  of those goes to `skipped` as (backend, format, why), for a notice."""
  chosen = ops
  ops = ops or spec.ops
  backends = backends or spec.backends
  bad = [o for o in ops if o not in OPS] + [b for b in backends if b not in BACKENDS]
  if bad:
    raise RagtuneError(f"unknown op/backend {bad}; ops: {OPS}, backends: {BACKENDS}")
  problems, seen = [], set()
  for row in _shape_rows(spec):
    assert row.dtype in FORMATS
    gsz = row.group_sizes
    if isinstance(gsz, list):
      sizes, label = np.asarray(gsz, np.int32), "explicit"
    else:
      sizes, rank = gsz.draw_shard(row.m, row.g * row.ep, row.ep)
      label = gsz.label() + (f",ep={row.ep},rank={rank}" if row.ep > 1 else "")
    row_ops = ops if row.ops is None else [o for o in OPS if o in row.ops and (not chosen or o in chosen)]
    for op in row_ops:
      for backend in backends:
        why = ""
        if ":" in row.dtype:  # a quantized format: forward only (but a training format), where computed
          b = registry.get(backend)
          why = "quantized operands are forward only" if forward_only(row.dtype, [op]) else ""
          why = why or ("" if row.dtype in b.dtypes else f"{backend} computes no {row.dtype}")
          if not why and op == "drhs" and b.grad_rhs_quantized is None:
            why = f"{backend} runs {row.dtype} forward only"
          why = why or _untunable(b, op, row)
        if why:
          if skipped is not None:
            skipped.append((op, backend, row.dtype, why))
          continue
        calls = row.ops.get(op, 1) if isinstance(row.ops, dict) else 1
        p = Problem(
          op, backend, row.dtype, row.m, row.k, row.n, row.g, label, tuple(int(s) for s in sizes), row.source, calls
        )
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
  from one of `models` (presets, or names of explicit layers). An empty result is an error naming the selectors.
  """
  bad = [o for o in ops or [] if o not in OPS]
  if bad:
    raise RagtuneError(f"--op {', '.join(bad)}: unknown op; ops: {', '.join(OPS)}")
  dims = {parse_shape(s) for s in shapes or []}
  names = [m.lower() for m in models or []]
  model_of = lambda x: getattr(x, "source", "").split(":")[0]
  unknown = [m for m in names if m not in MODEL_PRESETS and m not in {model_of(x) for x in items}]
  if unknown:
    raise RagtuneError(
      f"--model {', '.join(unknown)}: unknown model; presets: {', '.join(sorted(MODEL_PRESETS))} "
      "(or a name: of the shapes file)"
    )
  out = [
    x
    for x in items
    if (not ops or x.op in ops) and (not dims or (x.m, x.k, x.n) in dims) and (not names or model_of(x) in names)
  ]
  if not out and items:
    given = " ".join(
      [f"--op {o}" for o in ops or []] + [f"--shape {s}" for s in shapes or []] + [f"--model {m}" for m in models or []]
    )
    raise RagtuneError(f"no {what} matches {given} (of {count(len(items), what)})")
  return out
