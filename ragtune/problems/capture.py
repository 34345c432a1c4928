"""ragtune.capture: the ragged grouped matmuls of a function, with the group sizes its router
produced on the arguments given.

`capture(fn, *args, **kwargs)` traces fn to a jaxpr (`jax.make_jaxpr`), jit included, as it
would run: after `jax.grad`, `jax.checkpoint`, `lax.scan` and `shard_map`. Each grouped
matmul in it is a site:
- `jax.lax.ragged_dot` / `ragged_dot_general` in the plain grouped form: forward, or, under a
  transpose (the backward of `jax.grad`), dlhs ([m,n] x [g,k,n]^T) and drhs (the ragged
  contraction [m,k] x [m,n] -> [g,k,n]); a rematerialized forward is a forward again;
- `kernels.ragged_dot`, which marks its calls while observed (kernels.ragged_dot.observe): the
  forward, and its backward (dlhs and drhs) where it is differentiated; the XLA ops inside it
  are not sites of their own;
- megablox's `gmm` and `tgmm` (a jit named so around a pallas_call).

The jaxpr is then run once, jitted, with a host callback after each site that hands back its
group sizes (each rank's own under shard_map, each layer's under scan), so the sizes are what
the router really produced. Calls of one problem (m, k, n, g, dtype) are merged into one
shape entry, with its calls a step per op (a rank's: a site under shard_map runs once on
each of its ranks) and one routing: of the call that routed the most rows, the one whose
largest group is the median of theirs.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import functools
import math
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex

import kernels
from kernels.common import DTYPES, OPS
from kernels.ragged_dot import SCOPE as KERNELS_SCOPE
from kernels.ragged_dot import Call, observe
from ragtune.errors import RagtuneError
from ragtune.problems import shapes

LAX = "jax.lax.ragged_dot"
KERNELS = "kernels.ragged_dot"
MEGABLOX = "megablox.gmm"
_MARK = "ragtune_capture"
_MARK_RE = re.compile(re.escape(_MARK) + r"\[([^\]]*)\]")
_OPAQUE = {"pallas_call", "triton_kernel_call", "mosaic_gpu_call"}  # kernels: nothing to find inside
# Frames in these folders are not the model's: jax's, ragtune's and kernels' own.
_OWN_DIRS = tuple(Path(f).resolve().parent for f in (jax.__file__, kernels.__file__)) + (
  Path(__file__).resolve().parents[1],
)


@dataclasses.dataclass(frozen=True)
class Site:
  """One grouped matmul of the traced program. op "bwd" is a kernels call's backward (dlhs
  and drhs); transpose_rhs is None where the op does not tell (drhs)."""

  kind: str
  op: str
  m: int
  k: int
  n: int
  g: int
  dtype: str
  transpose_rhs: bool | None
  out_dtype: str
  offset: bool
  where: str
  replicas: int  # ranks that run it at once (shard_map, pmap)


@dataclasses.dataclass
class Captured:
  """What one capture saw: the sites, the sizes each call reported, and what was left aside."""

  sites: list[Site] = dataclasses.field(default_factory=list)
  calls: dict[int, list[tuple[np.ndarray, int | None]]] = dataclasses.field(
    default_factory=lambda: collections.defaultdict(list)
  )
  skipped: list[str] = dataclasses.field(default_factory=list)

  def report(self, site: int, group_sizes, group_offset=None) -> None:
    offset = None if group_offset is None else int(np.asarray(group_offset))
    self.calls[site].append((np.asarray(group_sizes).astype(np.int64).ravel(), offset))


# --- kernels.ragged_dot: its calls marked while observed -----------------------------------


def _mark(call: Call, group_sizes, group_offset):
  """A kernels call's group sizes (and offset) through an optimization barrier, in a named
  scope that holds the call's static facts: the site the jaxpr walk finds and instruments."""
  facts = ",".join(
    str(v) for v in (call.op, call.m, call.k, call.n, call.g, call.dtype, int(call.transpose_rhs), call.out_dtype)
  )
  with jax.named_scope(f"{_MARK}[{facts}]"):
    if group_offset is None:
      return jax.lax.optimization_barrier(group_sizes), None
    return jax.lax.optimization_barrier((group_sizes, jnp.asarray(group_offset, jnp.int32)))


_context_lock = threading.Lock()
_context: list = []


def _fresh_trace():
  """A jit cache context of our own, so that functions jit traced before are traced again,
  with kernels observed (jax.make_user_context; its entries are never hit outside a capture)."""
  with _context_lock:
    if not _context:
      _context.append(jax.make_user_context(default_value=None))
  return _context[0]("ragtune.capture")


# --- the walk: sites found, and a host callback after each ---------------------------------


def _where(eqn) -> str:
  """file:line of the innermost frame outside jax, jaxlib, kernels and ragtune: the model's call."""
  tb = eqn.source_info.traceback
  for frame in getattr(tb, "frames", []) if tb is not None else []:
    if frame.file_name.startswith("<"):  # <frozen ...>, <string>
      continue
    path = Path(frame.file_name).resolve()
    if not any(path.is_relative_to(d) for d in _OWN_DIRS) and not {"jax", "jaxlib"} & set(path.parts[:-1]):
      return f"{path.name}:{frame.line_num}"
  return "?"


def _backward(path: str) -> bool:
  """Under a transpose (jax.grad's backward), unless rematerialized there (a forward again)."""
  return path.rfind("transpose(") > path.rfind("rematted_computation")


def _dtype_of(*avals) -> str:
  return jnp.result_type(*(a.dtype for a in avals)).name


def _site(kind: str, eqn, replicas: int, op: str, dims: tuple, transpose_rhs: bool | None) -> Site:
  """The Site of a lax or megablox eqn (lhs, rhs first): dims its problem's (m, k, n, g)."""
  lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
  m, k, n, g = dims
  return Site(
    kind=kind,
    op=op,
    m=m,
    k=k,
    n=n,
    g=g,
    dtype=_dtype_of(lhs, rhs),
    transpose_rhs=transpose_rhs,
    out_dtype=eqn.outvars[0].aval.dtype.name,
    offset=False,
    where=_where(eqn),
    replicas=replicas,
  )


def _gmm(backward: bool, m: int, c: int, other: int, g: int, transposed: bool) -> tuple[str, tuple, bool]:
  """(op, problem dims, transpose_rhs) of [m,c] x rhs [g,other,c] (transposed) or [g,c,other]:
  a forward, or under the transpose the dlhs ([m,n] x [g,k,n]^T) of the forward [m,other] x
  [g,other,c]."""
  if backward:
    return "dlhs", (m, other, c, g), not transposed
  return "fwd", (m, c, other, g), transposed


def _lax_site(eqn, path: str, replicas: int) -> Site | str:
  """The Site of a ragged_dot_general eqn, or why it is not a plain grouped matmul."""
  dn = eqn.params["ragged_dot_dimension_numbers"]
  (lc, rc), (lb, rb) = (tuple(d) for d in dn.dot_dimension_numbers[0]), dn.dot_dimension_numbers[1]
  lhs, rhs, gs = (v.aval for v in eqn.invars[:3])
  plain = not lb and not rb and lhs.ndim == 2 and gs.ndim == 1 and tuple(dn.lhs_ragged_dimensions) == (0,)
  grouped = tuple(dn.rhs_group_dimensions) == (0,) and rhs.ndim == 3
  if plain and grouped and lc == (1,) and rc in ((1,), (2,)):
    m, c = lhs.shape
    op, dims, transposed = _gmm(_backward(path), m, c, rhs.shape[3 - rc[0]], rhs.shape[0], rc == (2,))
    return _site(LAX, eqn, replicas, op, dims, transposed)
  if plain and not dn.rhs_group_dimensions and rhs.ndim == 2 and lc == (0,) and rc == (0,):
    # jax's transpose for rhs: the forward's lhs [m,k] against dout [m,n] -> [g,k,n]
    return _site(LAX, eqn, replicas, "drhs", (*lhs.shape, rhs.shape[1], gs.shape[0]), None)
  return f"{_where(eqn)}: a ragged_dot_general that is not a plain grouped matmul ({dn}); left out"


def _kernels_site(eqn, facts: str, replicas: int) -> Site:
  op, m, k, n, g, dtype, transposed, out = facts.split(",")
  return Site(
    kind=KERNELS,
    op=op,
    m=int(m),
    k=int(k),
    n=int(n),
    g=int(g),
    dtype=dtype,
    transpose_rhs=bool(int(transposed)),
    out_dtype=out,
    offset=len(eqn.invars) > 1,
    where=_where(eqn),
    replicas=replicas,
  )


def _has_kernel(jaxpr) -> bool:
  return any(e.primitive.name in _OPAQUE or any(_has_kernel(j) for j in _subjaxprs(e)) for e in jaxpr.eqns)


def _jaxprs(params: dict):
  """The jaxprs (open or closed) among an eqn's parameters, a tuple's (cond's branches) included."""
  for v in params.values():
    for j in v if isinstance(v, (tuple, list)) else (v,):
      if isinstance(j, (jex.ClosedJaxpr, jex.Jaxpr)):
        yield j


def _subjaxprs(eqn):
  for j in _jaxprs(eqn.params):
    yield j.jaxpr if isinstance(j, jex.ClosedJaxpr) else j


def _megablox_site(eqn, path: str, replicas: int) -> Site | None:
  """megablox's gmm / tgmm: a jit of that name around a pallas_call; lhs, rhs, group_sizes first."""
  name = eqn.params.get("name")
  if name not in ("gmm", "tgmm") or len(eqn.invars) < 3 or not any(_has_kernel(j) for j in _subjaxprs(eqn)):
    return None
  lhs, rhs, gs = (v.aval for v in eqn.invars[:3])
  if lhs.ndim != 2 or gs.ndim != 1:
    return None
  if name == "tgmm" and rhs.ndim == 2:  # tgmm(lhs^T [k,m], dout [m,n]) -> [g,k,n]
    return _site(MEGABLOX, eqn, replicas, "drhs", (lhs.shape[1], lhs.shape[0], rhs.shape[1], gs.shape[0]), None)
  if name != "gmm" or rhs.ndim != 3:
    return None
  m, c = lhs.shape
  transposed = rhs.shape[2] == c and rhs.shape[1] != c  # transpose_rhs is static: told by the shapes
  op, dims, transposed = _gmm(_backward(path), m, c, rhs.shape[1 if transposed else 2], rhs.shape[0], transposed)
  return _site(MEGABLOX, eqn, replicas, op, dims, transposed)


def _callback_eqn(fn: Callable, operands: list):
  """A debug_callback eqn calling fn on operands (vars of the jaxpr being rewritten), made by
  tracing one: its parameters are jax's own, whatever the version."""
  avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in operands]
  traced = jax.make_jaxpr(lambda *a: jax.debug.callback(fn, *a))(*avals)
  (eqn,) = [e for e in traced.jaxpr.eqns if e.primitive.name == "debug_callback"]
  return eqn.replace(invars=list(operands))


def _replicas(eqn) -> int:
  """How many ranks run the body of a shard_map or pmap eqn at once."""
  if eqn.primitive.name == "xla_pmap":
    return int(eqn.params.get("axis_size", 1))
  mesh = eqn.params.get("mesh")
  if mesh is None:
    return 1
  # the axes this shard_map makes manual (jax 0.10-0.12); an outer one's are counted there
  axes = eqn.params.get("newly_manual_axes") or eqn.params.get("manual_axes") or getattr(mesh, "axis_names", ())
  return math.prod(int(dict(mesh.shape)[a]) for a in axes)


class _Walk:
  def __init__(self, seen: Captured):
    self.seen = seen

  def site(self, eqn, path: str, replicas: int):
    """(Site, operands) of a site eqn, or None; a lax one that is not plain goes to skipped."""
    own = str(eqn.source_info.name_stack)
    name = eqn.primitive.name
    if name == "optimization_barrier":
      found = _MARK_RE.search(own)
      return (_kernels_site(eqn, found.group(1), replicas), list(eqn.invars)) if found else None
    if KERNELS_SCOPE in path + "/" + own:  # the ops inside a kernels call
      return None
    if name == "ragged_dot_general":
      site = _lax_site(eqn, path + "/" + own, replicas)
      if isinstance(site, str):
        self.seen.skipped.append(site)
        return None
      return site, [eqn.invars[2]]
    if name in ("pjit", "jit"):
      site = _megablox_site(eqn, path + "/" + own, replicas)
      return (site, [eqn.invars[2]]) if site else None
    return None

  def jaxpr(self, jaxpr, path: str, replicas: int):
    """jaxpr with a callback after every site, inside every sub-jaxpr but kernels' own; the
    same object where it holds none."""
    eqns, changed, effects = [], False, set()
    for eqn in jaxpr.eqns:
      found = self.site(eqn, path, replicas)
      own = f"{path}/{eqn.source_info.name_stack}"
      if found is None and eqn.primitive.name not in _OPAQUE:
        inner = replicas * _replicas(eqn)
        params = {k: self.param(v, f"{own}/{eqn.primitive.name}", inner) for k, v in eqn.params.items()}
        if any(params.get("donated_invars", ())):  # the capture must not consume the caller's arrays
          params["donated_invars"] = (False,) * len(params["donated_invars"])
        if any(params[k] is not eqn.params[k] for k in params):  # a sub-jaxpr rewritten, or donation off
          eqn = eqn.replace(params=params, effects=eqn.effects | set().union(*(j.effects for j in _jaxprs(params))))
          changed = True
          effects |= set(eqn.effects)
      eqns.append(eqn)
      if found is not None:
        site, operands = found
        self.seen.sites.append(site)
        call = _callback_eqn(functools.partial(self.seen.report, len(self.seen.sites) - 1), operands)
        eqns.append(call.replace(source_info=eqn.source_info))
        changed = True
        effects |= set(call.effects)
    if not changed:
      return jaxpr
    return jaxpr.replace(eqns=eqns, effects=jaxpr.effects | effects)

  def param(self, value, path: str, replicas: int):
    if isinstance(value, jex.ClosedJaxpr):
      new = self.jaxpr(value.jaxpr, path, replicas)
      return value if new is value.jaxpr else jex.ClosedJaxpr(new, value.consts)
    if isinstance(value, jex.Jaxpr):
      return self.jaxpr(value, path, replicas)
    if isinstance(value, tuple) and any(isinstance(v, (jex.ClosedJaxpr, jex.Jaxpr)) for v in value):
      new = tuple(self.param(v, path, replicas) for v in value)
      return value if all(a is b for a, b in zip(new, value)) else new
    return value


def _split_arrays(args: tuple, kwargs: dict):
  """(arrays, call): the array leaves of (args, kwargs), and fn's call from them with every
  other leaf (a function, a Python number, a config) passed as given, as a static argument."""
  leaves, tree = jax.tree.flatten((args, kwargs))
  traced = [isinstance(v, (jax.Array, np.ndarray, np.generic)) for v in leaves]
  arrays = [v for v, t in zip(leaves, traced) if t]

  def rebuild(arrays_in):
    it = iter(arrays_in)
    return jax.tree.unflatten(tree, [next(it) if t else v for v, t in zip(leaves, traced)])

  return arrays, rebuild


def trace_and_run(fn: Callable, args: tuple, kwargs: dict) -> Captured:
  """fn's jaxpr with every site instrumented, run once on the arguments."""
  seen = Captured()
  label = getattr(fn, "__name__", None) or type(fn).__name__
  arrays, rebuild = _split_arrays(args, kwargs)

  def call(*arrays_in):
    a, kw = rebuild(arrays_in)
    return fn(*a, **kw)

  first = lambda e: str(e).splitlines()[0] if str(e) else ""
  try:
    with _fresh_trace(), observe(_mark):
      closed = jax.make_jaxpr(call)(*arrays)
  except Exception as e:
    raise RagtuneError(f"{label} raised while tracing: {type(e).__name__}: {first(e)}") from e
  jaxpr = _Walk(seen).jaxpr(closed.jaxpr, "", 1)
  if not seen.sites:
    return seen
  run = jax.jit(lambda *a: jex.jaxpr_as_fun(jex.ClosedJaxpr(jaxpr, closed.consts))(*a))
  try:
    jax.block_until_ready(run(*arrays))
    jax.effects_barrier()
  except Exception as e:  # the step's own error, or one of the instrumented program's
    last = str(e).strip().splitlines()[-1] if str(e).strip() else ""
    raise RagtuneError(f"{label}, instrumented, raised while running: {type(e).__name__}: {last}") from e
  return seen


# --- from calls to a shape set -------------------------------------------------------------


@dataclasses.dataclass
class _Problem:
  m: int
  k: int
  n: int
  g: int
  dtype: str
  calls: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  routings: list[tuple[np.ndarray, int | None]] = dataclasses.field(default_factory=list)
  transposed: set = dataclasses.field(default_factory=set)
  out_dtypes: set = dataclasses.field(default_factory=set)
  where: set = dataclasses.field(default_factory=set)

  def routing(self) -> tuple[list[int], int | None]:
    """Of the calls that routed the most rows, the one whose largest group is their median."""
    most = max(int(s.sum()) for s, _ in self.routings)
    top = sorted((r for r in self.routings if int(r[0].sum()) == most), key=lambda r: (int(r[0].max()), r[0].tolist()))
    sizes, offset = top[len(top) // 2]
    return [int(s) for s in sizes], offset

  def entry(self, default_dtype: str) -> dict:
    sizes, offset = self.routing()
    e: dict[str, Any] = {"m": self.m, "k": self.k, "n": self.n, "g": self.g}
    element, _, scales = self.dtype.partition(":")
    if element != default_dtype or scales:
      e["dtype"] = element
    if scales:
      e["scales"] = scales
    e["group_sizes"] = sizes
    e["ops"] = {op: self.calls[op] for op in OPS if self.calls[op]}
    if True in self.transposed:
      e["transpose_rhs"] = True
    outs = self.out_dtypes - {element}
    if len(outs) == 1 and next(iter(outs)) in DTYPES:
      e["out_dtype"] = next(iter(outs))
    if offset is not None:
      e["group_offset"] = offset
    e["site"] = "; ".join(sorted(self.where))
    return e


def _local(site: Site, sizes: np.ndarray, offset: int | None) -> np.ndarray:
  """A call's sizes of the groups its rhs holds: those from the offset, with group_offset."""
  return sizes[offset : offset + site.g] if offset is not None else sizes


def _forwards_again(sites: list[Site]) -> list[Site]:
  """A grouped matmul under a transpose is taken as a dlhs ([m,n] x [g,k,n]^T) of a forward the
  step also runs; where the step runs no such forward (a custom_vjp's backward that computes
  a forward of its own), it is that forward: k and n swapped, the other layout."""
  key = lambda s: (s.m, s.k, s.n, s.g, s.dtype)
  forwards = {key(s) for s in sites if s.op == "fwd"}
  return [
    dataclasses.replace(s, op="fwd", k=s.n, n=s.k, transpose_rhs=not s.transpose_rhs)
    if s.op == "dlhs" and s.kind != KERNELS and key(s) not in forwards
    else s
    for s in sites
  ]


def problems_of(seen: Captured) -> tuple[list[_Problem], list[str]]:
  """The merged problems, and notices: sites that never ran, sizes that do not fit."""
  merged: dict[tuple, _Problem] = {}
  notices = list(seen.skipped)
  for i, site in enumerate(_forwards_again(seen.sites)):
    calls = seen.calls.get(i, [])
    if not calls:
      notices.append(f"{site.where}: a {site.kind} {site.op} call that did not run on these arguments; left out")
      continue
    if site.dtype not in DTYPES and ":" not in site.dtype:  # a quantized format comes from kernels, scaled
      notices.append(f"{site.where}: {site.kind} on {site.dtype} operands, which ragtune does not tune; left out")
      continue
    if len(calls) % site.replicas:
      notices.append(
        f"{site.where}: {len(calls)} calls reported by {site.replicas} ranks; calls a step rounded to "
        f"{max(1, round(len(calls) / site.replicas))}"
      )
    local = [(_local(site, s, o), o) for s, o in calls]
    bad = next((s for s, _ in local if len(s) != site.g or s.min(initial=0) < 0 or s.sum() > site.m), None)
    if bad is not None:
      notices.append(
        f"{site.where}: {site.kind} group sizes {bad.tolist()[:8]}{'...' if len(bad) > 8 else ''} do not fit "
        f"m={site.m}, g={site.g}; left out"
      )
      continue
    p = merged.setdefault(
      (site.m, site.k, site.n, site.g, site.dtype), _Problem(site.m, site.k, site.n, site.g, site.dtype)
    )
    per_step = max(1, round(len(calls) / site.replicas))
    for op in ("dlhs", "drhs") if site.op == "bwd" else (site.op,):
      p.calls[op] += per_step
    p.routings += local
    if site.transpose_rhs is not None:
      p.transposed.add(site.transpose_rhs)
    p.out_dtypes.add(site.out_dtype)
    p.where.add(f"{site.where} {site.kind}")
  return list(merged.values()), notices


def capture(fn: Callable, *args, name: str | None = None, say: Callable[[str], None] | None = None, **kwargs):
  """The ShapeSet of every ragged grouped matmul fn runs on these arguments (see the module
  doc): one shape entry per problem, with its ops and calls a step (`ops: {fwd: 2, ...}`),
  the group sizes of its calls (`group_sizes: [...]`), and where the model calls it. Runs fn
  once. `ShapeSet.write(path)` writes it as a shape file.

  args and kwargs are passed as given: their arrays (pytree leaves) are traced, any other
  leaf (a function, a Python number) goes in as a static argument. `say` gets a line for
  each call left out (not a plain grouped matmul, never run, operands of a dtype ragtune
  does not tune). Raises RagtuneError when fn raises, or holds
  no grouped matmul that ran."""
  label = name or getattr(fn, "__name__", None) or type(fn).__name__
  seen = trace_and_run(fn, args, kwargs)
  found, notices = problems_of(seen)
  for line in notices:
    if say is not None:
      say(f"notice: {line}")
  if not found:
    why = "; ".join(notices) if notices else "no jax.lax.ragged_dot, kernels.ragged_dot or megablox gmm in it"
    raise RagtuneError(f"{label}: no grouped matmul to tune ({why})")
  dtypes = collections.Counter(p.dtype.split(":")[0] for p in found)
  default = max(dtypes, key=lambda d: (dtypes[d], d in DTYPES))
  ops = [op for op in OPS if any(p.calls[op] for p in found)]
  data = {"name": label, "dtype": default, "ops": ops, "shapes": [p.entry(default) for p in found]}
  spec = shapes.validate(data, lambda loc: f"{label}: captured {shapes._format_loc(loc)}")
  when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
  calls = sum(sum(p.calls.values()) for p in found)
  spec._origin = (
    f"From {getattr(fn, '__module__', '?')}:{label} on {jax.devices()[0].device_kind} ({jax.device_count()} devices), "
    f"jax {jax.__version__}, {when}.\n"
    f"{len(found)} problems, {calls} calls a step (ops: {{op: calls}}); group_sizes: what the router produced."
  )
  return spec
