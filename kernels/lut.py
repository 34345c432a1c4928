"""Tuned-config lookup tables: file format, loading, and lookup.

File format (JSON, one file per device kind, named ``<device-slug>.json``)::

  {
    "schema": "ragtune-lut",
    "schema_version": 2,
    "device_kind": "NVIDIA H100 80GB HBM3",      # jax.devices()[0].device_kind
    "created": "2026-11-21T10:00:00Z",
    "exported_with": {"ragtune": "0.1.0", "commit": "f65beb4", "jax": "0.11.2", "jaxlib": "0.11.2"},
    "tuned_with": {"ragtune": "0.1.0", "jax": "0.11.2", "jaxlib": "0.11.2", "platform": "...", "cuda_driver": "12.8"},
    "entries": [
      {"op": "fwd", "backend": "pallas_gpu", "dtype": "bfloat16",
       "m": 8192, "k": 4096, "n": 14336, "g": 8,       # always the forward problem
       "config": {"block_m": 128, ..., "group_m": 16},  # in the op's own frame
       "time_s": 0.0015, "tflops": 640.1,
       "baselines": {"xla_s": 0.0092, "default_s": 0.0021},
       "speedup_vs_xla": 6.1, "speedup_vs_default": 1.4,
       "timer": "...", "group_dist": "multinomial(seed=0)", "jax_version": "0.11.2",
       "versions": {"commit": "0c1d2e3"}}   # only what differs from tuned_with
    ]
  }

Only ``op, backend, dtype, m, k, n, g, config`` are required in an entry; the rest is
provenance, like the top level's versions (older files have ``jax_version`` or
``exported_with_jax`` there). Nearest-shape rule and its regime gate: see ``Lut.query`` and
``regime_mismatch``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterable
from fractions import Fraction
from pathlib import Path
from typing import Any

from kernels import gpus, registry
from kernels.backend import KernelConfig
from kernels.common import FORMATS, OPS, TRAINING_FORMATS, canonical_kind, not_utf8, op_dims, op_order, scheme

SCHEMA = "ragtune-lut"
# 2: the Triton config's grid_order was replaced by the launch-order bands group_m / group_k.
SCHEMA_VERSION = 2
ENV_VAR = "RAGTUNE_LUT"
# "raise" (the default: a misconfigured deployment fails loudly) or "warn": a LUT the default
# search finds but cannot use logs one WARNING and the heuristics run.
ON_ERROR_VAR = "RAGTUNE_LUT_ON_ERROR"
BUNDLED_DIR = Path(__file__).parent / "luts"

# The regime gate (regime_mismatch): a tuned shape serves a query only within these factors.
# Rows per group: a group of r rows takes ceil(r / block_m) row tiles and wastes the rest of
# its last one, so the best row tile follows r across the searched tiles (pallas_gpu block_m
# 16-128, mosaic_gpu 64-256, pallas_tpu tm 64-512), and both GPU defaults switch at 96 rows
# per group (64-row, 4-warp tiles below; 128-row, 8-warp above; kernels/*/config.py::default).
# Within 4x the tuned tile is at most two power-of-two steps off; at 8x the gap spans most of
# the 16-128 range, e.g. a decode entry (~1 row per group) would give 8-row groups its tiles.
# There is no upper cap: the launch-order band (group_m up to 64 row tiles, 8192 rows) keeps
# depending on rows per group long after the largest tile.
ROWS_PER_GROUP_FACTOR = 4
# k and n are a layer's fixed widths: they set block_k/block_n (Mosaic keeps only tiles that
# divide them), the shared-memory/VMEM fit and the column-block count (the grid, the band).
# One log2 step keeps those comparable; past it is another layer. It also keeps an up
# projection's entry off the down projection (k and n swapped, 2.7-3.5x apart: Qwen3-30B-A3B
# hidden_size 2048 / moe_intermediate_size 768, Mixtral-8x7B 4096 / intermediate_size 14336,
# DeepSeek-V3 7168 / moe_intermediate_size 2048; each model's config.json on Hugging Face).
DIM_FACTOR = 2

LutFn = Callable[[int, int, int], "tuple[int, int, int] | None"]


logger = logging.getLogger("kernels")


class LutError(ValueError):
  """A LUT file that cannot be used: corrupt, unknown schema, or for another device."""


def device_slug(device_kind: str) -> str:
  """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
  return re.sub(r"[^a-z0-9]+", "-", device_kind.lower()).strip("-") or "unknown"


def serves(lut_kind: str, device_kind: str) -> bool:
  """Whether a LUT tuned on `lut_kind` is used on a device of `device_kind` without force: its
  own kind (a TPU under either spelling), or a GPU of the same compute capability and SM
  count (kernels.gpus.serves: A100 80 GB and 40 GB, SXM and PCIe; H100 SXM, H200 and GH200),
  where every config compiles and launches the same and only the speeds may differ."""
  return canonical_kind(lut_kind) == canonical_kind(device_kind) or gpus.serves(lut_kind, device_kind)


def serving_kinds(device_kind: str) -> list[str]:
  """The device kinds whose LUTs serve `device_kind`: its own first, then the other products
  of its GPU, then other GPUs of its compute capability and SM count."""
  own = gpus.by_kind(device_kind)
  others = [v.device_kind for g in gpus.gpus().values() for v in g.variants if v.device_kind != device_kind]
  others = [k for k in others if gpus.serves(k, device_kind)]
  return [device_kind, *sorted(others, key=lambda k: gpus.by_kind(k) is not own)]


def _refusal_detail(lut_kind: str, device_kind: str) -> str:
  """Why a named GPU's LUT does not serve another named GPU, in parentheses; "" otherwise."""
  a, b = gpus.by_kind(lut_kind), gpus.by_kind(device_kind)
  if a is None or b is None:
    return ""
  fact = lambda g: f"{g.capability[0]}.{g.capability[1]}, {g.sms} SMs"
  return (
    f" (a LUT serves a GPU of its own compute capability and SM count: {a.title} is {fact(a)}, {b.title} {fact(b)})"
  )


def current_device_kind() -> str:
  """The device kind calls are built for (kernels.target.current: jax's first device, or
  the device of the mesh set by jax.set_mesh for an ahead-of-time compile)."""
  from kernels import target

  return target.current().device_kind


def canonical_dtype(dtype: Any) -> str:
  """'bfloat16' for jnp.bfloat16, np.dtype('bfloat16') or the string; a quantized format
  ('float8_e4m3fn:block128', common.QUANT_FORMATS) as it is."""
  import jax.numpy as jnp

  if isinstance(dtype, str) and ":" in dtype:
    if dtype not in FORMATS:
      raise ValueError(f"dtype must be a dtype or one of the formats {FORMATS}, got {dtype!r}")
    return dtype
  return jnp.dtype(dtype).name


@dataclasses.dataclass(frozen=True)
class Entry:
  op: str
  backend: str
  dtype: str
  m: int
  k: int
  n: int
  g: int
  config: KernelConfig | None
  extra: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)

  @property
  def key(self) -> tuple:
    return (self.op, self.backend, self.dtype, self.m, self.k, self.n, self.g)

  def to_dict(self) -> dict[str, Any]:
    d = {
      "op": self.op,
      "backend": self.backend,
      "dtype": self.dtype,
      "m": self.m,
      "k": self.k,
      "n": self.n,
      "g": self.g,
      "config": self.config.to_dict() if self.config else {},
    }
    d.update(self.extra)
    return d


def _entry_from_dict(d: Any, where: str) -> Entry:
  if not isinstance(d, dict):
    raise LutError(f"{where}: expected an object, got {type(d).__name__}")
  missing = [f for f in ("op", "backend", "dtype", "m", "k", "n", "g", "config") if f not in d]
  if missing:
    raise LutError(f"{where}: missing key(s) {missing}")
  if d["op"] not in OPS:
    raise LutError(f"{where}.op: expected one of {OPS}, got {d['op']!r}")
  if d["backend"] not in registry.NAMES:
    raise LutError(f"{where}.backend: expected one of {registry.NAMES}, got {d['backend']!r}")
  if d["dtype"] not in FORMATS:
    raise LutError(f"{where}.dtype: expected one of {FORMATS}, got {d['dtype']!r}")
  if ":" in d["dtype"] and d["op"] != "fwd" and d["dtype"] not in TRAINING_FORMATS:
    raise LutError(
      f"{where}.op: {d['dtype']} operands are forward only (training formats: {TRAINING_FORMATS}), got {d['op']!r}"
    )
  for dim in ("m", "k", "n", "g"):
    if not isinstance(d[dim], int) or isinstance(d[dim], bool) or d[dim] <= 0:
      raise LutError(f"{where}.{dim}: expected a positive integer, got {d[dim]!r}")
  if not isinstance(d["config"], dict):
    raise LutError(f"{where}.config: expected an object, got {type(d['config']).__name__}")
  try:
    cfg = registry.config_from_dict(d["backend"], d["config"])
  except (TypeError, ValueError) as e:
    raise LutError(f"{where}.config: {e}") from None
  extra = {k: v for k, v in d.items() if k not in ("op", "backend", "dtype", "m", "k", "n", "g", "config")}
  return Entry(d["op"], d["backend"], d["dtype"], d["m"], d["k"], d["n"], d["g"], cfg, extra)


def _log2_ratio(a: int, b: int) -> float:
  return abs(math.log2(a / b))


def shape_distance(e: Entry, m: int, k: int, n: int, g: int | None) -> float:
  """How far the tuned shape of `e` is from the query (the rule of `Lut.query`); 0 is exact."""
  d = _log2_ratio(m, e.m) + 4 * (_log2_ratio(k, e.k) + _log2_ratio(n, e.n))
  if g is not None:
    d += 0.5 * _log2_ratio(g, e.g)
  return d


def shape_text(m: int, k: int, n: int, g: int) -> str:
  """The forward problem as lhs x rhs: '[m,k]x[g,k,n]'."""
  return f"[{m},{k}]x[{g},{k},{n}]"


def rows_per_group(m: int, g: int) -> Fraction:
  """m / g, at least 1: with fewer rows than groups each routed group holds about one row in
  one row tile, whatever m / g is. Exact, so the gate does not depend on rounding."""
  return Fraction(max(m, g), g)


def _apart(a: Fraction | int, b: Fraction | int, factor: int) -> bool:
  return max(a, b) > factor * min(a, b)


def _num(x: Fraction) -> str:
  return f"{float(x):.0f}" if x >= 10 else f"{float(x):.2g}"


def regime_mismatch(e: Entry, m: int, k: int, n: int, g: int | None) -> str | None:
  """Why the tuned shape of `e` is in another tile regime than the query (rows per group more
  than ROWS_PER_GROUP_FACTOR apart, or k or n more than DIM_FACTOR apart), or None when it
  may serve it. A query with no g (a megablox LutFn) is taken to have the entry's g."""
  here, tuned = rows_per_group(m, e.g if g is None else g), rows_per_group(e.m, e.g)
  reasons = []
  if _apart(here, tuned, ROWS_PER_GROUP_FACTOR):
    reasons.append(f"rows per group {_num(tuned)} tuned vs {_num(here)} here (>{ROWS_PER_GROUP_FACTOR}x apart)")
  for name, q, t in (("k", k, e.k), ("n", n, e.n)):
    if _apart(q, t, DIM_FACTOR):
      reasons.append(f"{name} {t} tuned vs {q} here (>{DIM_FACTOR}x apart)")
  return "; ".join(reasons) or None


@dataclasses.dataclass(frozen=True)
class Rejection:
  """The nearest tuned entry for a query that `Lut.query` did not use, and why."""

  entry: Entry
  reason: str

  def __str__(self) -> str:
    e = self.entry
    return f"nearest tuned {shape_text(e.m, e.k, e.n, e.g)} ({e.backend}) not used: {self.reason}"


class Lut:
  """A loaded LUT for one device kind."""

  def __init__(
    self, device_kind: str, entries: Iterable[Entry] = (), *, meta: dict | None = None, source: str | None = None
  ):
    self.device_kind = device_kind
    self.meta = dict(meta or {})
    self.source = source
    self._entries: dict[tuple, Entry] = {}
    for e in entries:
      self._entries[e.key] = e

  # --- construction / serialisation ---------------------------------------------------
  @classmethod
  def from_dict(cls, data: Any, source: str = "<dict>") -> Lut:
    if not isinstance(data, dict):
      raise LutError(f"{source}: not a ragtune LUT (top level is {type(data).__name__}, expected an object)")
    if data.get("schema") != SCHEMA:
      raise LutError(f"{source}: not a ragtune LUT (schema is {data.get('schema')!r}, expected {SCHEMA!r})")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
      raise LutError(
        f"{source}: schema_version {version!r} is not supported (this kernels package reads "
        f"version {SCHEMA_VERSION}); upgrade ragtune/kernels or re-export the LUT"
      )
    kind = data.get("device_kind")
    if not isinstance(kind, str) or not kind:
      raise LutError(f"{source}: device_kind must be a non-empty string")
    entries = data.get("entries")
    if not isinstance(entries, list):
      raise LutError(f"{source}: entries must be a list")
    parsed = [_entry_from_dict(e, f"{source}: entries[{i}]") for i, e in enumerate(entries)]
    meta = {k: v for k, v in data.items() if k not in ("entries",)}
    return cls(kind, parsed, meta=meta, source=source)

  @classmethod
  def from_file(cls, path: str | os.PathLike) -> Lut:
    p = Path(path)
    try:
      raw = p.read_bytes()
    except OSError as e:
      raise LutError(f"{p}: cannot read LUT ({e.strerror or e})") from None
    try:
      data = json.loads(raw.decode())
    except UnicodeDecodeError as e:
      line, why = not_utf8(raw, e)
      raise LutError(f"{p}:{line}: corrupt LUT, {why}") from None
    except json.JSONDecodeError as e:
      if not raw.lstrip().startswith(b"{"):  # a LUT cut short is still a JSON object's start
        raise LutError(f"{p}: not a ragtune LUT (a LUT is a JSON object; this file is not JSON)") from None
      raise LutError(f"{p}:{e.lineno}: corrupt LUT, invalid JSON ({e.msg})") from None
    return cls.from_dict(data, source=str(p))

  def to_dict(self) -> dict[str, Any]:
    meta = {k: v for k, v in self.meta.items() if k not in ("schema", "schema_version", "device_kind")}
    return {
      "schema": SCHEMA,
      "schema_version": SCHEMA_VERSION,
      "device_kind": self.device_kind,
      **meta,
      "entries": [e.to_dict() for e in sorted(self._entries.values(), key=lambda e: e.key)],
    }

  # --- queries ------------------------------------------------------------------------
  def __len__(self) -> int:
    return len(self._entries)

  def entries(self) -> list[Entry]:
    return sorted(self._entries.values(), key=lambda e: (op_order(e.op), *e.key))

  def shapes(self) -> list[tuple[int, int, int]]:
    return sorted({(e.m, e.k, e.n) for e in self._entries.values()})

  def query(
    self, op: str, m: int, k: int, n: int, g: int | None, dtype: Any = None, backend: str | None = None
  ) -> Entry | None:
    """The entry to run the forward problem (m, k, n, g) as `op` with, or None.

    Candidates: entries of this op (and dtype, and backend when given) in the query's
    regime (`regime_mismatch`: rows per group within ROWS_PER_GROUP_FACTOR, k and n within
    DIM_FACTOR; an exact shape always is) whose config fits the query on this LUT's device
    (shared-memory/VMEM estimate). Among them the exact (m, k, n, g) if present, else the
    one minimising
        |log2 m/m'| + 4 (|log2 k/k'| + |log2 n/n'|) + 0.5 |log2 g/g'|
    (k and n are a model's fixed dims, m moves with the token count). Ties go to the
    larger tuned m, then the larger k, n and g, then the dtype's name: the answer never
    depends on the entries' order. `nearest_rejected` says why nothing was returned.

    With no backend, every backend's entries compete (an xla entry, with no config,
    always fits): among the candidates at the nearest shape, the fastest by its
    measured `time_s` wins. Entries carry only correct candidates (export-lut writes rows
    that matched jax.lax.ragged_dot); one with no time ranks after every timed one, and
    ties go to the registry's backend order.
    """
    return self._lookup(op, m, k, n, g, dtype, backend)[0]

  def nearest_rejected(
    self, op: str, m: int, k: int, n: int, g: int | None, dtype: Any = None, backend: str | None = None
  ) -> Rejection | None:
    """When `query` returns None although this LUT has entries of this op (and dtype and
    backend): the nearest of them by shape distance and why it was not used. None when
    `query` has an entry, or there is none to reject."""
    return self._lookup(op, m, k, n, g, dtype, backend)[1]

  def _unusable(self, e: Entry, op: str, m: int, k: int, n: int, g: int | None) -> str | None:
    """Why `e` cannot serve the query, or None. (An exact shape is always in its regime.)"""
    mismatch = regime_mismatch(e, m, k, n, g)
    if mismatch is None and e.config is not None and not e.config.fits(op, e.dtype, m, k, n, self.device_kind):
      return f"its config does not fit this shape on {self.device_kind!r}"
    return mismatch

  def _lookup(
    self, op: str, m: int, k: int, n: int, g: int | None, dtype: Any, backend: str | None
  ) -> tuple[Entry | None, Rejection | None]:
    dt = canonical_dtype(dtype) if dtype is not None else None
    same = [
      e
      for e in self._entries.values()
      if e.op == op and (not dt or e.dtype == dt) and (not backend or e.backend == backend)
    ]
    nearness = lambda e: (shape_distance(e, m, k, n, g), -e.m, -e.k, -e.n, -e.g, e.dtype)
    usable = [e for e in same if self._unusable(e, op, m, k, n, g) is None]
    if not usable:
      if not same:
        return None, None
      e = min(same, key=nearness)
      return None, Rejection(e, self._unusable(e, op, m, k, n, g))
    best = min(usable, key=nearness)
    if backend is not None:
      return best, None
    order = {name: i for i, name in enumerate(registry.NAMES)}

    def rank(e: Entry):
      t = e.extra.get("time_s")
      timed = isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0
      return (0, t, order[e.backend]) if timed else (1, 0.0, order[e.backend])

    shape = (best.dtype, best.m, best.k, best.n, best.g)
    return min((e for e in usable if (e.dtype, e.m, e.k, e.n, e.g) == shape), key=rank), None

  def lut_fn(
    self, op: str = "fwd", *, dtype: Any = None, g: int | None = None, fallback: tuple[int, int, int] | None = None
  ) -> LutFn:
    """A megablox-compatible LutFn over this LUT's entries of the megablox backend
    (pallas_tpu) for `op` on plain operands; entries of other backends and of quantized
    formats are not read, so a GPU's LUT has none.

    It takes the op's own (m, k, n), as megablox passes them: (m, k, n) for fwd and
    tgmm, (m, n, k) for dlhs; and returns plain-int (tm, tk, tn): the nearest entry's
    tiling, else `fallback`, else None (on which megablox raises). megablox needs m % tm
    == 0 where kernels.ragged_dot pads m, so tm is cut to the largest multiple of 8 up to
    it that divides m (else m, one row tile): (128, 128, 128) runs at m = 96 as (96, 128, 128).
    """
    if op not in OPS:
      raise ValueError(f"op must be one of {OPS}, got {op!r}")
    # megablox multiplies plain operands: a quantized format's tiling is not for it.
    plain = Lut(self.device_kind, [e for e in self.entries() if not scheme(e.dtype)], source=self.source)

    def fn(m: int, k: int, n: int):
      fm, fk, fn_ = op_dims(op, int(m), int(k), int(n))  # op_dims is its own inverse
      e = plain.query(op, fm, fk, fn_, g, dtype, backend=registry.megablox_backend())
      tiling = e.config.tiling() if e is not None else fallback
      if tiling is None:
        return None
      tm, tk, tn = (int(x) for x in tiling)
      rows = int(m)  # the ragged rows megablox passes as m (lhs's rows for gmm, its columns for tgmm)
      return next((t for t in range(min(tm, rows) // 8 * 8, 0, -8) if rows % t == 0), rows), tk, tn

    return fn

  def __repr__(self) -> str:
    return f"Lut(device_kind={self.device_kind!r}, entries={len(self)}, source={self.source!r})"


# --- locating and activating a LUT --------------------------------------------------

_active: Lut | None = None
_active_resolved = False
_env_checked: str | None = None  # the RAGTUNE_LUT value check_unused_env_lut last read without error
# The RAGTUNE_LUT_ON_ERROR=warn messages already logged: a process that loads the default LUT
# again (each load_lut(), each reset) warns of the same broken LUT once.
_warned: set[str] = set()


def locate_lut(path: str | os.PathLike | None, device_kind: str) -> Path | None:
  """The LUT file for a device of `device_kind`.

  path: a LUT file, or a folder holding ``<device-slug>.json``, or that of a device kind that
  serves this one (serving_kinds). When None: the env var RAGTUNE_LUT (read the same way),
  then the LUTs bundled in ``kernels/luts/``; None if neither names one. Raises LutError for a
  path that holds no LUT for this device.
  """
  if path is None and os.environ.get(ENV_VAR):
    path = os.environ[ENV_VAR]
  names = [f"{device_slug(k)}.json" for k in serving_kinds(device_kind)]
  if path is None:
    return next((BUNDLED_DIR / name for name in names if (BUNDLED_DIR / name).is_file()), None)
  path = Path(path)
  if path.is_dir():
    cand = next((path / name for name in names if (path / name).is_file()), None)
    if cand is not None:
      return cand
    found = sorted(p.name for p in path.glob("*.json"))
    raise LutError(
      f"{path}: no LUT for device {device_kind!r} (looked for {', '.join(names)}; found {found or 'no .json files'})"
    )
  if not path.exists():
    raise LutError(f"{path}: no such LUT file or folder")
  return path


# The (LUT kind, device kind) pairs already said to serve each other in this process.
_served: set[tuple[str, str]] = set()


def _read_lut(file: Path, kind: str, force: bool) -> Lut:
  """The LUT in `file` (as locate_lut found it), refused when made for a device kind that does
  not serve this one (serves), unless force."""
  lut = Lut.from_file(file)
  if lut.device_kind == kind:
    return lut
  if serves(lut.device_kind, kind):
    if (lut.device_kind, kind) not in _served:
      _served.add((lut.device_kind, kind))
      logger.info(
        "%s: LUT tuned on %r serves this %r (same compute capability and SMs)", lut.source, lut.device_kind, kind
      )
    return lut
  if not force:
    raise LutError(
      f"{lut.source}: LUT was tuned on {lut.device_kind!r} but this device is {kind!r}"
      f"{_refusal_detail(lut.device_kind, kind)}; pass force=True to use it anyway"
    )
  return lut


def _from_env(value: str, message: str) -> str:
  """`message` about the LUT that RAGTUNE_LUT=value names, led by the variable: a deployment's
  environment, not its code, holds the path to fix."""
  p = str(Path(value))
  rest = message[len(p) :] if message.startswith(p + ":") else f": {message}"
  return f"{ENV_VAR}={value}{rest}"


def default_lut(device_kind: str | None = None, *, force: bool = False) -> Lut | None:
  """The LUT the default search finds for a device of `device_kind` (this process's when
  None), without making it active: RAGTUNE_LUT, then the LUTs bundled in ``kernels/luts/``;
  None when neither names one. One that cannot be used (corrupt, or made for another device
  kind unless force=True) raises LutError, its message led by ``RAGTUNE_LUT=<path>`` when the
  variable named it; with RAGTUNE_LUT_ON_ERROR=warn it logs a WARNING instead (once per
  process for each distinct error) and the LUT is empty (source None)."""
  kind = device_kind or current_device_kind()
  env = os.environ.get(ENV_VAR)
  try:
    found = locate_lut(None, kind)
    return None if found is None else _read_lut(found, kind, force)
  except LutError as e:
    _default_search_failed(_from_env(env, str(e)) if env else str(e))
    return Lut(kind, source=None)


def load_lut(path: str | os.PathLike | None = None, *, force: bool = False) -> Lut:
  """Load a LUT and make it the one `kernels.ragged_dot` uses when config is None.

  path: a LUT file, or a folder holding ``<device-slug>.json``. When None: the default
  search (default_lut, whose errors follow RAGTUNE_LUT_ON_ERROR); if it finds none for this
  device, an empty LUT (so the built-in heuristics apply).
  A LUT made for another device kind raises LutError unless force=True.
  """
  global _active, _active_resolved
  kind = current_device_kind()
  lut = default_lut(kind, force=force) if path is None else _read_lut(locate_lut(path, kind), kind, force)
  if lut is None:
    lut = Lut(kind, source=None)
  _active, _active_resolved = lut, True
  return lut


def _default_search_failed(message: str) -> None:
  """A LUT the default search cannot use: LutError(message), or with RAGTUNE_LUT_ON_ERROR=warn
  one WARNING per process for each distinct message, and the caller goes on with no LUT."""
  mode = os.environ.get(ON_ERROR_VAR) or "raise"
  if mode not in ("raise", "warn"):
    raise LutError(f"{ON_ERROR_VAR}={mode}: expected 'raise' or 'warn' (on this LUT error: {message})") from None
  if mode == "raise":
    raise LutError(message) from None
  if message not in _warned:
    _warned.add(message)
    logger.warning("%s=warn: %s; using no LUT, the built-in heuristics run", ON_ERROR_VAR, message)


def check_unused_env_lut() -> None:
  """For a call that asks no LUT (backend="auto" where XLA's op runs, as on a CPU; or
  backend="xla"): read the file RAGTUNE_LUT names all the same, so a broken one shows here,
  before it ships to the device it is for. A file that cannot be read raises LutError, led by
  RAGTUNE_LUT= (with RAGTUNE_LUT_ON_ERROR=warn, logs it), as load_lut does. Its device kind is
  not held against it, nor is a folder without this device's LUT: nothing here would use
  them. Nothing is read once a LUT was chosen in code or loaded; a file is read once (a
  broken one each call when it raises, once when it warns)."""
  global _env_checked
  value = os.environ.get(ENV_VAR)
  if not value or value == _env_checked or _active_resolved or _scoped.get() is not _UNSET:
    return
  if not Path(value).is_dir():
    try:
      Lut.from_file(locate_lut(value, current_device_kind()))
    except LutError as e:
      _default_search_failed(_from_env(value, str(e)))  # raises, or warns once: then not read again
  _env_checked = value  # a folder too: not looked at again on every call


def set_active_lut(lut: Lut | None) -> None:
  """Make `lut` (or, with None, no LUT: heuristics only) the process's LUT for config=None
  calls, as load_lut does with a file; use_lut overrides it within a block."""
  global _active, _active_resolved
  _active, _active_resolved = lut, True


_UNSET = object()
_scoped: contextvars.ContextVar = contextvars.ContextVar("kernels_lut", default=_UNSET)


@contextlib.contextmanager
def use_lut(lut: Lut | None):
  """Within the block (this thread or task only), config=None calls use `lut`; None: no
  LUT, the built-in heuristics. The process's LUT (load_lut) is back after it."""
  token = _scoped.set(lut)
  try:
    yield lut
  finally:
    _scoped.reset(token)


def active_lut() -> Lut | None:
  """The LUT in use: use_lut's, else the process's, loading the default one on first call."""
  scoped = _scoped.get()
  if scoped is not _UNSET:
    return scoped
  if not _active_resolved:
    load_lut()
  return _active


def reset_active_lut() -> None:
  """Forget the active LUT; the next call loads the default again."""
  global _active, _active_resolved, _env_checked
  _active, _active_resolved, _env_checked = None, False, None
