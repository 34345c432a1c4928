"""Prune a sweep before it spends device time: compile every candidate deviceless for the
target GPU or TPU (ragtune.deviceless.aot), in parallel on the host's cores, and keep the outcome.

Rows go to DIR/compile.jsonl (kind "compile"), one per (device kind, problem shape,
candidate), appended and fsynced like records.jsonl, so a rerun compiles only what is new.
A later `ragtune sweep` on a device of that kind (a GPU facts file's device_description_str,
or a TPU's device_kind in any of jax's spellings) never times a candidate whose compile
failed, overflowed shared memory, VMEM or HBM, spilled (in its wgmma loops or elsewhere) or
serialized its wgmma; see ragtune.run.plan.make_task. A compile whose machine code held no
kernel to check (aot.NO_KERNEL) judged nothing: its candidate is kept, and compiled again
by the next run.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import kernels
from kernels import common
from ragtune import provenance, stop
from ragtune.candidates import search_space
from ragtune.deviceless import aot
from ragtune.errors import RagtuneError
from ragtune.problems.shapes import Problem
from ragtune.provenance import Versions
from ragtune.records.store import JsonLines, candidate_id
from ragtune.words import count

COMPILE_RECORDS = "compile.jsonl"
# The backends that compile for an NVIDIA GPU, and the TPU backends with knobs (XLA's own op
# has no candidates to prune).
GPU_BACKENDS = tuple(name for name, b in kernels.registry.REGISTRY.items() if "cuda" in b.platforms)
TPU_BACKENDS = tuple(
  name for name, b in kernels.registry.REGISTRY.items() if "tpu" in b.platforms and b.config_type is not None
)


def backends_for(platform: str) -> tuple[str, ...]:
  return TPU_BACKENDS if platform == "tpu" else GPU_BACKENDS


def target_facts(target: str) -> dict[str, Any]:
  """platform, device_kind and memory_bytes of a target, from its facts file or chip (no jax
  needed)."""
  t = aot.resolve_target(target)
  if t.platform == "tpu":
    return {"platform": "tpu", "device_kind": t.chip.device_kinds[0], "memory_bytes": t.chip.hbm}
  kind = aot.proto_device_kind(t.spec)
  mem = re.search(r"device_memory_size:\s*(\d+)", t.spec)
  if not kind:
    raise RagtuneError(f"--target {target}: its GpuTargetConfigProto has no device_description_str")
  return {"platform": "gpu", "device_kind": kind, "memory_bytes": int(mem.group(1)) if mem else None}


def shape_key(device_kind: str, p: Problem) -> str:
  """What a compile depends on: the device and the problem's shape, not its group sizes."""
  return f"{common.canonical_kind(device_kind)}|{p.op}|{p.backend}|{p.dtype}|{p.m}x{p.k}x{p.n}x{p.g}"


def _store(out_dir: Path) -> JsonLines:
  return JsonLines(Path(out_dir) / COMPILE_RECORDS)


_cache: dict[Path, tuple[tuple[int, int], dict[str, dict[str, dict[str, Any]]]]] = {}


def _by_shape(out_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
  """shape_key -> candidate id -> row of DIR/compile.jsonl; read once per change of the
  file, since a sweep asks for every problem."""
  path = Path(out_dir) / COMPILE_RECORDS
  if not path.exists():
    return {}
  st = path.stat()
  stamp = (st.st_mtime_ns, st.st_size)
  if path not in _cache or _cache[path][0] != stamp:
    index: dict[str, dict[str, dict[str, Any]]] = {}
    for r in _store(out_dir).rows():
      if "id" in r and "candidate" in r:
        index.setdefault(r["id"][: -len(r["candidate"]) - 1], {})[r["candidate"]] = r
    _cache[path] = (stamp, index)
  return _cache[path][1]


def compile_rows(out_dir: Path) -> dict[str, dict[str, Any]]:
  """id -> row of DIR/compile.jsonl (empty when the folder has none)."""
  return {f"{key}|{cid}": r for key, rows in _by_shape(out_dir).items() for cid, r in rows.items()}


@dataclasses.dataclass(frozen=True)
class Rejection:
  """Why a deviceless compile rejected a candidate, and the versions of that compile (None
  in rows from before they were recorded)."""

  reason: str
  versions: Versions | None


def _versions(out_dir: Path, row: dict[str, Any]) -> Versions | None:
  try:
    return Versions.from_dict(row["versions"]) if row.get("versions") is not None else None
  except ValueError as e:
    raise RagtuneError(f"{Path(out_dir) / COMPILE_RECORDS}: {row.get('id', '?')}: {e}") from None


def rejected(out_dir: Path, device_kind: str, p: Problem) -> dict[str, Rejection]:
  """candidate id -> Rejection, for p's candidates whose deviceless compile for this device
  kind was not clean: the compiler's own verdict (no fit, a spill in the wgmma loops or
  elsewhere, serialized wgmma, VMEM or HBM exhausted, an unsupported device, a compile error
  or a compiler crash). A NO_KERNEL row is no verdict: its candidate is not rejected."""
  rows = _by_shape(out_dir).get(shape_key(device_kind, p), {})
  return {
    cid: Rejection(
      f"deviceless compile for {device_kind}: {r['outcome']}: {r.get('error', '')}"[:600],
      _versions(out_dir, r),
    )
    for cid, r in rows.items()
    if r.get("outcome") not in aot.NO_VERDICT_AGAINST
  }


def _compile_one(target: str, p: Problem, config) -> dict[str, Any]:
  """In a worker process (JAX_PLATFORMS=cpu): one candidate's CompileReport as a dict. A
  failure of the set-up (plugin, ptxas, cuobjdump, the machine-code reader) is no verdict
  on the candidate: it comes back as setup_error and stops the run."""
  try:
    report = aot.compile_op(target, p.backend, p.op, p.dtype, p.m, p.k, p.n, p.g, config)
    return report.to_dict()
  except Exception as e:
    return {
      "outcome": aot.ERROR,
      "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:600],
      "compile_s": 0.0,
      "kernels": [],
      "setup_error": True,
    }


def compile_class(cfg):
  """The config with its launch-order knobs (group_m, group_k) at 1. They
  only change the few integer instructions that pick each program's output cell, not the
  k loop that sets registers, spills and shared memory (tests/ragtune/test_prune.py compares a pair
  per backend), so the kernels that differ in them alone are compiled once: the first one
  met stands for all, and the others' rows name it in `compiled_as`."""
  names = {f.name for f in dataclasses.fields(cfg)} & {"group_m", "group_k"}
  return dataclasses.replace(cfg, **{n: 1 for n in names})


def default_jobs() -> int:
  """Every core, but no more workers than GiBs of memory (a worker holds ~0.6 GiB)."""
  try:
    mem_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 30)
  except (ValueError, OSError, AttributeError):
    mem_gib = 1 << 10
  return max(1, min(os.cpu_count() or 1, mem_gib))


COMPILE_TIMEOUT_S = 600.0  # per compile; ptxas on a spilling kernel takes seconds, not minutes


def compile_many(
  target: str, items: list[tuple[Problem, Any]], jobs: int | None = None, timeout_s: float = COMPILE_TIMEOUT_S, fn=None
):
  """Compile each (problem, config) for `target` in `jobs` worker processes (default:
  default_jobs()), yielding (index into items, CompileReport as a dict) as each finishes.
  The workers run jax on the CPU only, so the CUDA plugin serves a compile-only GPU.

  A compile that kills its worker (a compiler crash, the OOM killer) or overruns
  `timeout_s` is retried alone in a fresh worker; if it fails there too it comes back as
  compile_error naming why, and the rest go on. A set-up failure raises RagtuneError.
  Ctrl-C (or any error) kills the workers at once. fn(target, problem, config) -> dict
  replaces the compile (tests inject faults with it; it must be importable by name)."""
  fn = fn or _compile_one
  jobs = max(1, min(len(items), jobs or default_jobs()))
  saved = os.environ.get("JAX_PLATFORMS")
  os.environ["JAX_PLATFORMS"] = "cpu"  # inherited by the spawned workers
  try:
    queue = list(range(len(items)))
    suspects: list[int] = []  # in flight when a worker died or hung: each retried alone
    while queue or suspects:
      alone = bool(suspects)
      batch = [suspects.pop(0)] if alone else queue
      results, lost = yield from _pool_pass(fn, target, items, batch, 1 if alone else jobs, timeout_s)
      if alone:
        if lost:
          i, why = lost[0]
          yield (
            i,
            {"outcome": aot.ERROR, "error": f"the compiler {why} (retried alone)", "compile_s": 0.0, "kernels": []},
          )
      else:
        queue = [i for i in queue if i not in results and i not in dict(lost)]
        suspects = [i for i, _ in lost]
  finally:
    if saved is None:
      os.environ.pop("JAX_PLATFORMS", None)
    else:
      os.environ["JAX_PLATFORMS"] = saved


def _pool_pass(fn, target, items, batch, jobs, timeout_s):
  """Run `batch` (indices) in one pool, at most `jobs` in flight; yields finished results.
  Returns (indices finished, [(index, why) in flight when the pool broke or hung])."""
  # Its processes leave Ctrl-C to this one (they start as it is submitted to).
  with stop.ctrl_c_blocked():
    pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
  done: set[int] = set()
  pending = list(batch)
  # The pool's processes as they start: its manager thread forgets them when the pool breaks
  # (a worker killed by a signal), and those must be killed and reaped here all the same.
  procs: dict[int, multiprocessing.Process] = {}
  flight: dict[cf.Future, tuple[int, float]] = {}
  try:
    while pending or flight:
      while pending and len(flight) < jobs:
        i = pending.pop(0)
        p, cfg = items[i]
        with stop.ctrl_c_blocked():
          flight[pool.submit(fn, target, p, cfg)] = (i, time.monotonic())
        procs.update((getattr(pool, "_processes", None) or {}).items())
      with stop.deferred():  # Ctrl-C inside the wait's lock could come out as a RuntimeError
        finished, _ = cf.wait(flight, timeout=min(0.5, timeout_s / 4), return_when=cf.FIRST_COMPLETED)
      # Before reading them: SIGTERM to the process group kills the workers too, which is this
      # command's stop, not a compile's crash.
      stop.check()
      for fut in finished:
        i, _ = flight.pop(fut)
        try:
          rep = fut.result()
        except cf.process.BrokenProcessPool:
          return done, [(i, "process died")] + [(j, "process died") for j, _ in flight.values()]
        if rep.pop("setup_error", False):
          raise RagtuneError(f"--target {target}: cannot compile here: {rep['error']}")
        done.add(i)
        yield i, rep
      now = time.monotonic()
      hung = [i for i, t0 in flight.values() if now - t0 > timeout_s]
      if hung:
        return done, [(i, f"ran past {timeout_s:.0f}s") for i in hung] + [
          (i, "was stopped beside a hung compile") for i, t0 in flight.values() if i not in hung
        ]
    return done, []
  finally:
    procs.update((getattr(pool, "_processes", None) or {}).items())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs.values():
      if proc.is_alive():
        proc.kill()
    for proc in procs.values():
      proc.join(5)  # reaped: none is left behind when this process exits (on Ctrl-C at once)


def run(
  problems: list[Problem],
  target: str,
  out_dir: Path,
  jobs: int | None = None,
  log=lambda msg: print(msg, file=sys.stderr, flush=True),
) -> dict[str, int]:
  """Compile every not-yet-compiled candidate of `problems` for `target` into
  DIR/compile.jsonl; returns counts by outcome of the rows this run wrote. Ctrl-C keeps
  every row written. A NO_KERNEL row counts as not compiled: compiled again, and named in a
  warning when it comes back NO_KERNEL."""
  facts = target_facts(target)
  kind = facts["device_kind"]
  done = {rid: r for rid, r in compile_rows(out_dir).items() if r.get("outcome") != aot.NO_KERNEL}
  classes: dict[tuple, list[tuple[str, Problem, Any]]] = {}  # (shape, class) -> members to write
  for p in problems:
    if p.backend not in backends_for(facts["platform"]):
      continue  # backends without knobs have no candidates; others compile for another platform
    for cfg in search_space.candidates(p, device_kind=kind):
      rid = f"{shape_key(kind, p)}|{candidate_id(cfg)}"
      if rid not in done:
        done[rid] = {}
        classes.setdefault((shape_key(kind, p), compile_class(cfg)), []).append((rid, p, cfg))
  counts: dict[str, int] = {}
  if not classes:
    return counts
  groups = list(classes.values())
  store = _store(out_dir)
  versions = provenance.for_aot(facts["platform"]).to_dict()  # the workers run this jax, ptxas and libtpu
  log(f"compiling {count(len(groups), 'kernel')} for {kind} ({count(sum(map(len, groups)), 'candidate')})")
  start = last = time.monotonic()
  unjudged = ""  # a NO_KERNEL row's error
  for i, (index, rep) in enumerate(compile_many(target, [(g[0][1], g[0][2]) for g in groups], jobs), 1):
    group = groups[index]
    first = candidate_id(group[0][2])
    for rid, p, cfg in group:
      cid = candidate_id(cfg)
      store.append(
        {
          "id": rid,
          "kind": "compile",
          "candidate": cid,
          **p.fields(),
          "config": cfg.to_dict(),
          **rep,
          "compiled_as": None if cid == first else first,
          "device_kind": kind,
          "versions": versions,
        }
      )
      counts[rep["outcome"]] = counts.get(rep["outcome"], 0) + 1
    unjudged = unjudged or (rep["error"] if rep["outcome"] == aot.NO_KERNEL else "")
    now = time.monotonic()
    if now - last >= 10 or i == len(groups):
      last = now
      summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
      log(f"compiled {i}/{len(groups)} kernels in {now - start:.0f}s; candidates: {summary}")
  if unjudged:
    log(
      f"WARNING: {counts[aot.NO_KERNEL]} candidates could not be judged ({aot.NO_KERNEL}: {unjudged}); "
      "they are kept, not pruned, and compiled again by the next run"
    )
  return counts
