"""Results rows -> kernels LUT: the fastest correct config per (device, op, backend, dtype, shape).

Only rows with status "ok" (compiled, matched jax.lax.ragged_dot, timed) are eligible,
so a config that failed its check anywhere in its own problem is never exported. The
choice depends only on the set of rows, not their order, so merging folders in any
order gives the same LUT.

XLA is a candidate too: every problem times `baseline:xla` (XLA's own op) in the same
worker as its candidates. Where the fastest of those rows for a (device, op, dtype, m, k,
n, g) beats the best entry of every backend swept there (or no backend has a correct
one), and no XLA row failed there, the LUT also gets an `xla` entry (config {}), so `Lut.choose` and `auto` run XLA
there. Each backend keeps its own best entry either way, for `Lut.query(backend=...)`.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import jax

import kernels
from ragtune.errors import RagtuneError
from ragtune.store import candidate_id, write_atomic

KEY_FIELDS = ("device_kind", "op", "backend", "dtype", "m", "k", "n", "g")
SHAPE_FIELDS = ("device_kind", "op", "dtype", "m", "k", "n", "g")


def _is_ok(r: dict[str, Any]) -> bool:
  return r.get("status") == "ok" and isinstance(r.get("time_s"), (int, float)) and r["time_s"] > 0


def build_luts(rows: list[dict[str, Any]]) -> dict[str, kernels.Lut]:
  """device_kind -> Lut, from the rows of one or more results folders."""
  # Candidates that failed on any draw of a shape are distrusted for that shape.
  failed = {(tuple(r[f] for f in KEY_FIELDS), r["candidate"]) for r in rows
            if r.get("kind") == "candidate" and r.get("status") != "ok"}
  best: dict[tuple, dict[str, Any]] = {}
  for r in rows:
    if r.get("kind") != "candidate" or not _is_ok(r) or r.get("backend") == "xla":
      continue
    key = tuple(r[f] for f in KEY_FIELDS)
    if (key, r["candidate"]) in failed:
      continue
    rank = (r["time_s"], r["candidate"], r.get("_source", ""))
    cur = best.get(key)
    if cur is None or rank < (cur["time_s"], cur["candidate"], cur.get("_source", "")):
      best[key] = r

  # XLA as a candidate: its fastest baseline row per shape, whichever backend's problem timed it.
  # Like a config, XLA is distrusted on a shape where any of its rows failed (e.g. a timeout).
  xla_rows = [r for r in rows if r.get("candidate") == "baseline:xla"]
  xla_failed = {tuple(r[f] for f in SHAPE_FIELDS) for r in xla_rows if r.get("status") != "ok"}
  xla_best: dict[tuple, dict[str, Any]] = {}
  for r in xla_rows:
    shape = tuple(r[f] for f in SHAPE_FIELDS)
    if not _is_ok(r) or shape in xla_failed:
      continue
    rank = (r["time_s"], r.get("_source", ""), r["problem"])
    cur = xla_best.get(shape)
    if cur is None or rank < (cur["time_s"], cur.get("_source", ""), cur["problem"]):
      xla_best[shape] = r
  kernel_best: dict[tuple, tuple[float, str]] = {}  # shape -> (time, backend) of the fastest entry
  for key, r in best.items():
    shape = tuple(r[f] for f in SHAPE_FIELDS)
    kernel_best[shape] = min(kernel_best.get(shape, (r["time_s"], r["backend"])), (r["time_s"], r["backend"]))

  # Times of every ok row, so each entry's baselines come from its own run (folder).
  times = {(r.get("_source", ""), r["problem"], r["candidate"]): r["time_s"] for r in rows if _is_ok(r)}

  entries: dict[str, list[kernels.Entry]] = {}
  for shape, r in sorted(xla_best.items(), key=lambda kv: [str(x) for x in kv[0]]):
    rival = kernel_best.get(shape)
    t = r["time_s"]
    if rival is not None and not t < rival[0]:
      continue  # a kernel is as fast or faster here: no xla entry
    dense_s = times.get((r.get("_source", ""), r["problem"], "baseline:dense"))
    extra = {
        "time_s": t, "tflops": r.get("tflops"), "gbps": r.get("gbps"),
        "baselines": {"xla_s": t, "default_s": None, "dense_s": dense_s},
        "speedup_vs_xla": 1.0, "speedup_vs_default": None,
        "runner_up": None if rival is None else {"backend": rival[1], "time_s": rival[0],
                                                 "speedup": round(rival[0] / t, 4)},
        "timer": r.get("timer"), "interpret": False,
        "group_dist": r.get("group_dist"), "jax_version": r.get("jax_version"),
        "measured": r.get("timestamp"),
    }
    device, op, dtype, m, k, n, g = shape
    entries.setdefault(device, []).append(kernels.Entry(op, "xla", dtype, m, k, n, g, None, extra))
  for key, r in sorted(best.items(), key=lambda kv: [str(x) for x in kv[0]]):
    src, prob = r.get("_source", ""), r["problem"]
    default = kernels.registry.default_config(r["backend"], r["op"], r["dtype"], r["m"], r["k"], r["n"], r["g"],
                                     device_kind=r["device_kind"])
    default_s = times.get((src, prob, candidate_id(default))) if default else None
    xla_s = times.get((src, prob, "baseline:xla"))
    dense_s = times.get((src, prob, "baseline:dense"))
    t = r["time_s"]
    extra = {
        "time_s": t, "tflops": r.get("tflops"), "gbps": r.get("gbps"),
        "baselines": {"xla_s": xla_s, "default_s": default_s, "dense_s": dense_s},
        "speedup_vs_xla": round(xla_s / t, 4) if xla_s else None,
        "speedup_vs_default": round(default_s / t, 4) if default_s else None,
        "timer": r.get("timer"), "interpret": r.get("interpret", False),
        "group_dist": r.get("group_dist"), "jax_version": r.get("jax_version"),
        "measured": r.get("timestamp"),
    }
    cfg = kernels.registry.config_from_dict(r["backend"], r["config"])
    entries.setdefault(key[0], []).append(
        kernels.Entry(r["op"], r["backend"], r["dtype"], r["m"], r["k"], r["n"], r["g"], cfg, extra))
  created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
  return {kind: kernels.Lut(kind, es, meta={"created": created, "generator": "ragtune export-lut",
                                            "exported_with_jax": jax.__version__})
          for kind, es in entries.items()}


def lut_json(lut: kernels.Lut) -> str:
  return json.dumps(lut.to_dict(), indent=1, sort_keys=False) + "\n"


PY_TEMPLATE = '''"""ragtune LUT for {device_kind!r} ({n} entries), generated by `ragtune export-lut`.

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
  if lut.device_kind != here and not force:
    raise kernels.LutError(f"{{__file__}}: LUT was tuned on {{lut.device_kind!r}} but this device is {{here!r}}")
  if activate:
    kernels.lut.set_active_lut(lut)
  return lut
'''


def write_luts(luts: dict[str, kernels.Lut], output: Path, fmt: str = "json") -> list[Path]:
  """Write each LUT atomically. `output` is a .json file (one device only) or a folder."""
  if not luts:
    raise RagtuneError("no correct, timed candidates in the results: nothing to export")
  if fmt not in ("json", "python"):
    raise RagtuneError(f"--format must be json or python, got {fmt!r}")
  if output.suffix == ".json":
    if len(luts) > 1:
      raise RagtuneError(f"{output}: results hold {len(luts)} device kinds ({', '.join(sorted(luts))}); "
                         "give a folder with -o to write one LUT per device")
    targets = {kind: output for kind in luts}
  else:
    targets = {kind: output / f"{kernels.device_slug(kind)}.json" for kind in luts}
  written = []
  for kind, path in targets.items():
    text = lut_json(luts[kind])
    write_atomic(path, text)
    written.append(path)
    if fmt == "python":
      module = path.stem.replace("-", "_")
      py = path.with_name(f"{module}.py")
      write_atomic(py, PY_TEMPLATE.format(device_kind=kind, n=len(luts[kind]), module=module,
                                          payload=text.replace('"""', '\\"\\"\\"')))
      written.append(py)
  return written
