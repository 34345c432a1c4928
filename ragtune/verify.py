"""Re-check every LUT entry on fresh inputs and adversarial group sizes.

Draws per entry: a fresh multinomial routing, a skewed one with empty groups, rows
left over (sum(group_sizes) < m), and all rows in a single group. fwd entries are run
forward; dlhs and drhs entries are run through jax.vjp of kernels.ragged_dot with the
entry's config for that op, against jax.vjp of jax.lax.ragged_dot.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import kernels
from ragtune import measure
from ragtune.errors import RagtuneError
from ragtune.numerics import TOLERANCE, NumericsResult, compare
from ragtune.shapes import GroupDist, Problem


@dataclasses.dataclass
class DrawResult:
  draw: str
  group_sizes: list[int]
  numerics: NumericsResult | None
  error: str = ""

  @property
  def passed(self) -> bool:
    return self.numerics is not None and self.numerics.passed


@dataclasses.dataclass
class EntryResult:
  entry: kernels.Entry
  draws: list[DrawResult]

  @property
  def passed(self) -> bool:
    return all(d.passed for d in self.draws)

  def worst(self) -> DrawResult:
    failing = [d for d in self.draws if not d.passed]
    if failing:
      return failing[0]
    return max(self.draws, key=lambda d: d.numerics.rel_error)


def group_size_draws(m: int, g: int, seed: int) -> dict[str, np.ndarray]:
  one = np.zeros(g, np.int32)
  one[seed % g] = m
  return {
      "multinomial": GroupDist(dist="multinomial", seed=seed).draw(m, g),
      "skewed+empty": GroupDist(dist="zipf", seed=seed, empty_fraction=0.25).draw(m, g),
      "sum<m": GroupDist(dist="multinomial", seed=seed + 1, fill=0.75).draw(m, g),
      "one-group": one,
  }


def _vjp_outputs(e: kernels.Entry, x, interpret: bool):
  gs = x["group_sizes"]
  f = lambda a, b: kernels.ragged_dot(a, b, gs, backend=e.backend, config={e.op: e.config},
                                      interpret=interpret)
  hi = jax.lax.Precision.HIGHEST
  r = lambda a, b: jax.lax.ragged_dot(a, b, gs, precision=hi)
  f32 = lambda a: a.astype(jnp.float32)
  _, vjp = jax.vjp(f, x["lhs"], x["rhs"])
  _, vjp_ref = jax.vjp(r, f32(x["lhs"]), f32(x["rhs"]))
  i = 0 if e.op == "dlhs" else 1
  return vjp(x["dout"])[i], vjp_ref(f32(x["dout"]))[i]


def verify_entry(e: kernels.Entry, *, seed: int = 1234, interpret: bool = False) -> EntryResult:
  draws = []
  for name, sizes in group_size_draws(e.m, e.g, seed).items():
    p = Problem(e.op, e.backend, e.dtype, e.m, e.k, e.n, e.g, name, tuple(int(s) for s in sizes))
    x = measure.make_inputs(p, salt=f"verify{seed}")
    try:
      if e.op == "fwd":
        out = jax.jit(measure.build_op(p, e.backend, e.config, interpret))(*measure.op_args("fwd", x))
        ref = measure.reference("fwd", x)
      else:
        out, ref = _vjp_outputs(e, x, interpret)
      res = compare(np.asarray(ref, np.float64), np.asarray(jnp.asarray(out, jnp.float32)),
                    rtol=TOLERANCE[e.dtype])
      draws.append(DrawResult(name, list(p.group_sizes), res))
    except Exception as exc:  # noqa: BLE001 - a crash is a failed check, reported
      draws.append(DrawResult(name, list(p.group_sizes), None, f"{type(exc).__name__}: {exc}"[:300]))
  return EntryResult(e, draws)


def load_lut_for_verify(target: Path) -> kernels.Lut:
  """A LUT file, or a folder holding LUTs or records (then the LUT those records export)."""
  from ragtune import export, store

  if target.is_file():
    try:
      return kernels.Lut.from_file(target)
    except kernels.LutError as e:
      raise RagtuneError(str(e)) from None
  if target.is_dir():
    kind = kernels.current_device_kind()
    lut_path = target / f"{kernels.device_slug(kind)}.json"
    if lut_path.is_file():
      return load_lut_for_verify(lut_path)
    if (target / store.RECORDS).exists():
      luts = export.build_luts(store.load_results([target]))
      if kind not in luts:
        raise RagtuneError(f"{target}: no correct results for this device ({kind!r}); found {sorted(luts)}")
      return luts[kind]
    raise RagtuneError(f"{target}: neither a LUT ({lut_path.name}) nor {store.RECORDS} here")
  raise RagtuneError(f"{target}: no such LUT file or results folder")
