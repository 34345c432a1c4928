"""Results -> kernels LUT: the fastest correct config per (device, op, backend, dtype, shape).

Each problem's correct candidates, fastest first, and its baselines come from
ragtune/records/summary.py, as in `ragtune show`. Only rows with status "ok" (compiled, matched
jax.lax.ragged_dot, timed) are eligible, and a config that failed its check on any
problem of a shape (another draw of group sizes, another folder) is never exported
there. The choice depends only on the set of rows, not their order, so merging folders
in any order gives the same LUT.

XLA is a candidate too: every problem times `baseline:xla` (XLA's own op) in the same
worker as its candidates. Where the fastest of those rows for a (device, op, dtype, m, k,
n, g) beats the best entry of every backend swept there (or no backend has a correct
one), and no XLA row failed there, the LUT also gets an `xla` entry (config {}), so
`Lut.query` and `auto` run XLA there. Each backend keeps its own best entry either way,
for `Lut.query(backend=...)`.

Provenance: the LUT's `exported_with` holds the versions of this export, and `tuned_with`
those every entry's row shares; an entry whose row differs keeps the rest in its own
`versions` (ragtune.provenance.of_entry reads them back).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kernels
from kernels import registry
from ragtune import paths, provenance
from ragtune.errors import RagtuneError
from ragtune.filekind import LUT_MODULE_MARK, Kind
from ragtune.records import summary
from ragtune.records.store import Record


def _extra(
  r: Record,
  xla_s: float | None,
  default_s: float | None,
  dense_s: float | None,
  interpret: bool,
  middle: dict[str, Any],
) -> dict[str, Any]:
  """An entry's measurements: its row r and the baselines beside it; `middle` follows the speedups."""
  t = r.time_s
  return {
    "time_s": t,
    "tflops": r.tflops,
    "gbps": r.gbps,
    "baselines": {"xla_s": xla_s, "default_s": default_s, "dense_s": dense_s},
    "speedup_vs_xla": round(xla_s / t, 4) if xla_s else None,
    "speedup_vs_default": round(default_s / t, 4) if default_s else None,
    **middle,
    "timer": r.timer,
    "interpret": interpret,
    "group_dist": r.problem.group_dist,
    "jax_version": r.jax_version,
    "measured": r.timestamp,
    "versions": r.made_with(),  # made shared or own by _with_versions
  }


def _entries(found: Iterable[summary.ProblemSummary]) -> list[kernels.Entry]:
  """One device kind's LUT entries, from its problems' summaries."""
  by_shape: dict[tuple, list[summary.ProblemSummary]] = {}
  for s in found:
    p = s.problem
    by_shape.setdefault((p.op, p.dtype, p.m, p.k, p.n, p.g), []).append(s)
  entries = []
  for (op, dtype, m, k, n, g), group in by_shape.items():
    kernel_best: list[tuple[float, str]] = []  # (time, backend) of each backend's entry here
    for backend in sorted({s.problem.backend for s in group} - {registry.REFERENCE}):
      mine = [s for s in group if s.problem.backend == backend]
      # A config that failed on any problem of the shape (another draw, another folder) is distrusted.
      distrusted = frozenset().union(*(s.failed for s in mine))
      pick = min(
        ((r, s) for s in mine for r in s.ranked if r.candidate not in distrusted),
        key=lambda rs: (rs[0].time_s, rs[0].candidate, rs[0].origin),
        default=None,
      )
      if pick is None:
        continue
      r, s = pick
      base = s.baselines
      entries.append(
        kernels.Entry(
          op,
          backend,
          dtype,
          m,
          k,
          n,
          g,
          kernels.registry.config_from_dict(backend, r.config),
          _extra(r, base["xla"], base["default"], base["dense"], r.interpret, {}),
        )
      )
      kernel_best.append((r.time_s, backend))
    # XLA as a candidate: its fastest baseline row, whichever backend's problem timed it. Like
    # a config, XLA is distrusted on a shape where any of its rows failed (e.g. a timeout).
    if any("baseline:xla" in s.failed for s in group):
      continue
    xla = min(
      ((s.xla, s) for s in group if s.xla is not None),
      key=lambda rs: (rs[0].time_s, rs[0].origin, rs[1].problem.key),
      default=None,
    )
    rival = min(kernel_best, default=None)
    if xla is None or rival is not None and not xla[0].time_s < rival[0]:
      continue  # none timed, or a kernel is as fast or faster here: no xla entry
    r, s = xla
    runner_up = (
      None if rival is None else {"backend": rival[1], "time_s": rival[0], "speedup": round(rival[0] / r.time_s, 4)}
    )
    entries.append(
      kernels.Entry(
        op,
        registry.REFERENCE,
        dtype,
        m,
        k,
        n,
        g,
        None,
        _extra(r, r.time_s, None, s.baselines["dense"], False, {"runner_up": runner_up}),
      )
    )
  return entries


def _with_versions(entries: list[kernels.Entry]) -> tuple[dict[str, str], list[kernels.Entry]]:
  """The versions all entries' rows share (the LUT's `tuned_with`), and the entries with
  only their own other versions left in `versions` (none when they match)."""
  common = provenance.shared([e.extra["versions"] for e in entries])
  out = []
  for e in entries:
    extra = {k: v for k, v in e.extra.items() if k != "versions"}
    own = {k: v for k, v in e.extra["versions"].items() if k not in common}
    out.append(dataclasses.replace(e, extra={**extra, "versions": own} if own else extra))
  return common, out


def build_luts(records: list[Record]) -> dict[str, kernels.Lut]:
  """device_kind -> Lut, from the records of one or more results folders."""
  created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
  luts = {}
  for kind in sorted({r.device_kind for r in records}):
    entries = _entries(summary.summarize(records, kind).values())
    if entries:
      tuned_with, entries = _with_versions(entries)
      meta = {
        "created": created,
        "generator": "ragtune export-lut",
        "exported_with": provenance.host().to_dict(),
        "tuned_with": tuned_with,
      }
      luts[kind] = kernels.Lut(kind, entries, meta=meta)
  return luts


def lut_json(lut: kernels.Lut) -> str:
  return json.dumps(lut.to_dict(), indent=1, sort_keys=False) + "\n"


PY_TEMPLATE = (
  LUT_MODULE_MARK
  + '''{device_kind!r} ({n} entries), generated by `ragtune export-lut`.

Needs only the `kernels` package (not ragtune):

    import {module}
    {module}.load()            # makes it the LUT kernels.ragged_dot uses
"""

import json

LUT = json.loads(r"""{payload}""")


def load(*, force=False, activate=True):
  import kernels

  lut = kernels.Lut.from_dict(LUT, source=__file__)
  here = kernels.lut.current_device_kind()
  if not kernels.lut.serves(lut.device_kind, here) and not force:
    raise kernels.LutError(f"{{__file__}}: LUT was tuned on {{lut.device_kind!r}} but this device is {{here!r}}")
  if activate:
    kernels.lut.set_active_lut(lut)
  return lut
'''
)


def _module_path(lut_path: Path) -> Path:
  """Where --format python writes a LUT's module: beside it, named to import."""
  return lut_path.with_name(lut_path.stem.replace("-", "_") + ".py")


def write_luts(luts: dict[str, kernels.Lut], output: Path, fmt: str = "json", *, force: bool = False) -> list[Path]:
  """Write each LUT atomically. `output` is a .json file (one device only) or a folder. Before
  any is written, each file already there must be a LUT (a LUT module for --format python),
  unless force."""
  if not luts:
    raise RagtuneError("no correct, timed candidates in the results: nothing to export")
  if fmt not in ("json", "python"):
    raise RagtuneError(f"--format must be json or python, got {fmt!r}")
  if output.suffix == ".json":
    if len(luts) > 1:
      raise RagtuneError(
        f"{output}: results hold {len(luts)} device kinds ({', '.join(sorted(luts))}); "
        "give a folder with -o to write one LUT per device"
      )
    targets = {kind: output for kind in luts}
  else:
    targets = {kind: output / f"{kernels.device_slug(kind)}.json" for kind in luts}
  for path in targets.values():
    paths.output_file(path, "the LUT file", Kind.LUT, force=force)
    if fmt == "python":
      paths.output_file(_module_path(path), "the LUT module", Kind.LUT_MODULE, force=force)
  written = []
  for kind, path in targets.items():
    text = lut_json(luts[kind])
    paths.write_atomic(path, text)
    written.append(path)
    if fmt == "python":
      py = _module_path(path)
      module = py.stem
      paths.write_atomic(
        py,
        PY_TEMPLATE.format(
          device_kind=kind, n=len(luts[kind]), module=module, payload=text.replace('"""', '\\"\\"\\"')
        ),
      )
      written.append(py)
  return written
