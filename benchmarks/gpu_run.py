"""The Python side of benchmarks/gpu_run.sh (see its header and benchmarks/README.md).

  python benchmarks/gpu_run.py versions --out F --slug-file F   # versions of what runs, and the device slug
  python benchmarks/gpu_run.py tests --out DIR --deadline S --timeout S [--jobs N] FILE...
  python benchmarks/gpu_run.py bench-shapes --out F             # [96,64]x[4,64,80] and the anchors, one shape file
  python benchmarks/gpu_run.py report --out DIR                 # the closing tables, from what the steps wrote

`tests` runs pytest on FILEs in N processes at once (a round-robin share of the tests each),
with pytest-timeout's per-test --timeout (thread method: a test that hangs in native code
ends its process with every thread's stack in the log). This module is also the pytest plugin
those processes load (`-p gpu_run`): it writes each test's start and outcome to a JSON-lines
file the moment it has them, so when a process ends on a hang the test that hung is known by
name, and a new process takes the tests after it. Past --deadline the processes are killed
and the tests not reached are listed as such. Exit 0 if every test passed or skipped, 1 if any
failed, hung or crashed, 3 if some were not reached.

Only the standard library is imported at module level: pytest imports this file as a plugin.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
LOG_ENV = "GPU_RUN_TESTLOG"  # the plugin writes its events here (unset: the plugin does nothing)
SHARD_ENV = "GPU_RUN_SHARD"  # "i/N": keep the collected tests whose index is i modulo N
SMALL = {"m": 96, "k": 64, "n": 80, "g": 4}  # shapes/smoke.yaml's first shape: where XLA's fixed cost shows


# --- the pytest plugin ----------------------------------------------------------------------


def _event(**fields) -> None:
  path = os.environ.get(LOG_ENV)
  if path:
    with open(path, "a") as f:
      f.write(json.dumps({"t": time.time(), **fields}) + "\n")
      f.flush()


def pytest_collection_modifyitems(config, items):
  shard = os.environ.get(SHARD_ENV)
  if not os.environ.get(LOG_ENV) or not shard:
    return
  i, n = (int(v) for v in shard.split("/"))
  keep = [it for j, it in enumerate(items) if j % n == i]
  dropped = [it for j, it in enumerate(items) if j % n != i]
  if dropped:
    config.hook.pytest_deselected(items=dropped)
  items[:] = keep


def pytest_collection_finish(session):
  # Each test as a command-line argument that finds it again from any folder: its file's
  # absolute path and the rest of its id.
  ids = [f"{it.path}::{it.nodeid.split('::', 1)[1]}" if "::" in it.nodeid else it.nodeid for it in session.items]
  _event(event="collected", nodeids=[it.nodeid for it in session.items], args=ids)


def pytest_runtest_logstart(nodeid, location):
  _event(event="start", nodeid=nodeid)


def pytest_runtest_logreport(report):
  message = ""
  if report.failed:
    text = report.longreprtext or ""
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    message = (" / ".join(errors[-2:]) or (text.strip().splitlines() or [""])[-1])[:300]
  elif report.skipped and isinstance(report.longrepr, tuple):
    message = str(report.longrepr[2])[:200]
  _event(event="report", nodeid=report.nodeid, when=report.when, outcome=report.outcome, message=message)


# --- tests: pytest in N processes, a hang costs one test ------------------------------------


def _read_events(path: Path) -> list[dict]:
  if not path.is_file():
    return []
  out = []
  for line in path.read_text().splitlines():
    try:
      out.append(json.loads(line))
    except ValueError:
      pass  # a line cut by a kill
  return out


class Shard(threading.Thread):
  """One share of the tests: pytest, restarted after each hang or crash with the tests left."""

  def __init__(self, index: int, count: int, args: argparse.Namespace, deadline: float):
    super().__init__(daemon=True)
    self.index, self.count, self.args, self.deadline = index, count, args, deadline
    self.log = Path(args.out) / f"tests-{index}.log"
    self.events = Path(args.out) / f"tests-{index}.jsonl"
    self.order: list[str] = []  # the share's test ids, in pytest's order
    self.args_of: dict[str, str] = {}  # id -> the argument that runs it
    self.results: dict[str, dict] = {}
    self.proc: subprocess.Popen | None = None
    self.stopped = False
    self.error = ""
    self.log_start = 0

  def command(self, nodeids: list[str] | None) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "gpu_run", "-o", "addopts="]
    # thread: a timer thread that dumps the stacks and ends the process works where a signal
    # cannot reach a main thread blocked in native code (a kernel that never finishes).
    cmd += ["-rfE", "--timeout", str(self.args.timeout), "-o", "timeout_method=thread"]
    return cmd + ([self.args_of.get(n, n) for n in nodeids] if nodeids is not None else self.args.files)

  def run(self) -> None:
    self.log.write_text("")
    self.events.write_text("")
    remaining: list[str] | None = None  # None: the first run collects, with the shard's share
    while not self.stopped:
      left = self.deadline - time.time()
      if left < 5:
        break
      env = dict(os.environ, **{LOG_ENV: str(self.events), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
      env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), str(ROOT), env.get("PYTHONPATH")) if p)
      if remaining is None:
        env[SHARD_ENV] = f"{self.index}/{self.count}"
      else:
        env.pop(SHARD_ENV, None)
      start = len(_read_events(self.events))
      self.log_start = self.log.stat().st_size  # this process's output starts here
      with open(self.log, "a") as logf:
        logf.write(f"\n=== {time.strftime('%H:%M:%S')} pytest, {len(remaining) if remaining else 'all'} tests\n")
        logf.flush()
        self.proc = subprocess.Popen(
          self.command(remaining),
          cwd=ROOT,
          env=env,
          stdout=logf,
          stderr=subprocess.STDOUT,
          start_new_session=True,
        )
        if self.stopped:  # a signal between the loop's test and the start
          self.kill()
        killed = False
        try:
          rc = self.proc.wait(timeout=max(1.0, left))
        except subprocess.TimeoutExpired:
          killed = True
          self.kill()
          rc = self.proc.wait()
      events = _read_events(self.events)[start:]
      self._take(events, rc, killed or self.stopped)
      if killed or self.stopped:
        break
      # pytest's own failures (exit 2: interrupted, e.g. a module that does not import; 3:
      # internal error; 4: usage) and no test running: say so, rather than retry. Exit 5 is
      # "no tests" (a share with none is fine).
      if rc in (2, 3, 4) and not any(e["event"] == "start" for e in events):
        lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        why = [line for line in lines if line.startswith("E ")][-1:] + lines[-1:]
        self.error = f"pytest exit {rc} before any test: " + " | ".join(why)[:400]
        break
      remaining = [n for n in self.order if n not in self.results]
      if not remaining or not any(e["event"] == "start" for e in events):
        break

  def _take(self, events: list[dict], rc: int, killed: bool) -> None:
    """The outcomes of one pytest process's events; a test it started and never finished
    (no teardown report) hung, crashed it, or was cut by the deadline."""
    for e in events:
      if e["event"] == "collected" and not self.order:
        self.order = list(e["nodeids"])
        self.args_of = dict(zip(e["nodeids"], e["args"]))
    started: dict[str, float] = {}
    reports: dict[str, list[dict]] = {}
    for e in events:
      if e["event"] == "start":
        started[e["nodeid"]] = e["t"]
      elif e["event"] == "report":
        reports.setdefault(e["nodeid"], []).append(e)
    for n, t in started.items():
      got = reports.get(n, [])
      seconds = round((got[-1]["t"] if got else time.time()) - t, 1)
      failed = [e for e in got if e["outcome"] == "failed"]
      skipped = [e for e in got if e["outcome"] == "skipped"]
      if failed:
        outcome, why = "failed", failed[0]["message"]
      elif not any(e["when"] == "teardown" for e in got):
        seconds = round(time.time() - t, 1)
        if killed:
          outcome, why = "not finished", f"killed at the step's deadline after {seconds} s"
        elif rc == 1 and b"Timeout" in self.log.read_bytes()[self.log_start :]:
          outcome, why = "hung", f"no result in {self.args.timeout} s (pytest-timeout; stacks in {self.log.name})"
        else:
          outcome, why = "crashed", f"its process ended with status {rc} ({self.log.name})"
      elif skipped:
        outcome, why = "skipped", skipped[0]["message"]
      else:
        outcome, why = "passed", ""
      self.results[n] = {"nodeid": n, "outcome": outcome, "message": why, "seconds": seconds}

  def kill(self) -> None:
    if self.proc is not None and self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass


def tests(args: argparse.Namespace) -> int:
  t0 = time.time()
  deadline = t0 + args.deadline
  Path(args.out).mkdir(parents=True, exist_ok=True)
  shards = [Shard(i, args.jobs, args, deadline) for i in range(args.jobs)]

  def stop(signum, frame):  # the step's backstop: end the tests, then write what is known
    for s in shards:
      s.stopped = True
      s.kill()

  signal.signal(signal.SIGTERM, stop)
  signal.signal(signal.SIGINT, stop)
  for s in shards:
    s.start()
  try:
    while any(s.is_alive() for s in shards):
      time.sleep(0.5)
  finally:
    for s in shards:
      s.kill()
    rows = []
    for s in shards:
      rows += [s.results[n] for n in s.order if n in s.results]
      rows += [
        {"nodeid": n, "outcome": "not run", "message": "not reached before the step's deadline", "seconds": 0.0}
        for n in s.order
        if n not in s.results
      ]
    errors = [f"share {s.index}: {s.error}" for s in shards if s.error]
    (Path(args.out) / "tests.json").write_text(json.dumps({"tests": rows, "errors": errors}, indent=1) + "\n")
  counts: dict[str, int] = {}
  for r in rows:
    counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
  order = ["passed", "skipped", "failed", "hung", "crashed", "not finished", "not run"]
  summary = ", ".join(f"{counts[o]} {o}" for o in order if counts.get(o)) or "no tests"
  lines = [f"tests: {summary} (of {len(rows)}) in {time.time() - t0:.0f} s, {args.jobs} pytest processes at once"]
  for r in rows:
    if r["outcome"] not in ("passed", "skipped"):
      lines.append(f"  {r['outcome'].upper():13} {r['nodeid']}  {r['message']}")
  lines += [f"  ERROR {e}" for e in errors]
  for r in sorted((r for r in rows if r["seconds"] >= 1), key=lambda r: -r["seconds"])[:5]:
    lines.append(f"  slowest: {r['seconds']:6.1f} s  {r['outcome']:8} {r['nodeid']}")
  text = "\n".join(lines)
  (Path(args.out) / "tests.txt").write_text(text + "\n")
  print(text)
  if any(r["outcome"] in ("failed", "hung", "crashed") for r in rows) or errors:
    return 1
  if any(r["outcome"] in ("not finished", "not run") for r in rows):
    return 3
  return 0


# --- versions ---------------------------------------------------------------------------------

PACKAGES = (
  "jax",
  "jaxlib",
  "jax-cuda13-plugin",
  "jax-cuda13-pjrt",
  "jax-cuda12-plugin",
  "jax-cuda12-pjrt",
  "nvidia-cudnn-cu13",
  "nvidia-cudnn-cu12",
  "triton",
  "jax-triton",
  "tokamax",
  "qwix",
  "flax",
  "tune-jax",
  "pydantic",
  "numpy",
  "pytest",
  "pytest-timeout",
)


def _version(name: str) -> str:
  import importlib.metadata as md

  try:
    return md.version(name)
  except md.PackageNotFoundError:
    return "-"


def _cuda_versions() -> dict[str, str]:
  """CUDA runtime, driver API and cuDNN as jax's CUDA plugin loaded them (not the wheels' names)."""
  try:
    from jax._src.lib import cuda_versions as cv
  except ImportError:
    cv = None
  if cv is None:
    return {}

  def num(fn) -> str:
    try:
      v = int(getattr(cv, fn)())
    except Exception as e:  # noqa: BLE001 - a library it cannot load: say which
      return f"unavailable ({str(e)[:80]})"
    return f"{v // 1000}.{v % 1000 // 10}" if fn.startswith("cuda") else f"{v // 10000}.{v % 10000 // 100}.{v % 100}"

  return {
    "cuda runtime": num("cuda_runtime_get_version"),
    "cuda driver API": num("cuda_driver_get_version"),
    "cudnn": num("cudnn_get_version"),
  }


def versions(args: argparse.Namespace) -> int:
  """What runs: the GPU and its driver, the checkout, Python, the packages, jax's devices, CUDA
  and cuDNN as loaded, triton, tokamax; the last line, "in short:", is the summary's."""
  lines = [f"date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"]
  short = {}
  query = "name,driver_version,memory.total,clocks.max.sm,compute_cap"
  smi = subprocess.run(
    f"nvidia-smi --query-gpu={query} --format=csv,noheader", shell=True, capture_output=True, text=True
  )
  if smi.returncode == 0:
    lines.append(f"nvidia-smi ({query}): {smi.stdout.strip()}")
    short["driver"] = "driver " + smi.stdout.split(",")[1].strip() if "," in smi.stdout else ""
  else:
    lines.append(f"nvidia-smi: none ({(smi.stderr or smi.stdout).strip()[:120]})")
  git = subprocess.run(
    "git rev-parse --short HEAD && git status --porcelain | wc -l", shell=True, capture_output=True, text=True, cwd=ROOT
  )
  head = git.stdout.split()
  if len(head) == 2:
    lines.append(f"checkout: {head[0]}" + (f" with {head[1]} changed files" if head[1] != "0" else ""))
  lines.append(f"python: {sys.version.split()[0]}")
  have = {p: _version(p) for p in PACKAGES}
  lines.append("packages: " + ", ".join(f"{p} {v}" for p, v in have.items()))
  plugin = next((f"{p} {v}" for p, v in have.items() if p.endswith("-plugin") and v != "-"), "no CUDA plugin")
  short["jax"] = f"jax {have['jax']} (jaxlib {have['jaxlib']}, {plugin})"
  status, slug = 0, "unknown-device"
  try:
    import jax

    import kernels

    devices = jax.devices()
    d = devices[0]
    slug = kernels.device_slug(d.device_kind)
    Path(args.slug_file).write_text(slug + "\n")  # now: the steps after need it even if this one is cut
    short["device"] = f"{len(devices)} x {d.device_kind}"
    lines.append(f"jax devices: {short['device']} ({d.platform}); default backend {jax.default_backend()}")
    try:
      limit = (d.memory_stats() or {}).get("bytes_limit")
    except Exception:  # noqa: BLE001 - not every backend reports stats
      limit = None
    if limit:
      lines.append(f"device memory jax may use: {limit / 2**30:.1f} GiB")
    cuda = _cuda_versions()
    lines += [f"{k}: {v}" for k, v in cuda.items()] or ["cuda: this jaxlib has no CUDA plugin"]
    short["cudnn"] = f"cuDNN {cuda['cudnn']}" if "cudnn" in cuda else ""
    if d.platform == "cpu" and smi.returncode == 0:
      lines.append("ERROR: nvidia-smi sees a GPU but jax runs on the CPU")
      status = 1
  except Exception as e:  # noqa: BLE001 - report it, and the steps after say the rest
    lines.append(f"ERROR: jax cannot start: {type(e).__name__}: {str(e)[:300]}")
    short["device"] = "jax cannot start"
    status = 1
  try:
    import triton

    lines.append(f"triton: {triton.__version__} (imports)")
    short["triton"] = f"triton {triton.__version__}"
  except Exception as e:  # noqa: BLE001
    lines.append(f"triton: does not import ({type(e).__name__}: {str(e)[:100]})")
    short["triton"] = "no triton"
  try:
    from ragtune.lut import bench

    tok, note = bench.import_tokamax()
    lines.append(f"tokamax: {note}" + (f" ({bench.tokamax_gpu_note()})" if tok is not None else ""))
    short["tokamax"] = f"tokamax {note}" if tok is not None else "no tokamax"
  except Exception as e:  # noqa: BLE001
    lines.append(f"tokamax: not checked: ragtune.lut.bench does not import ({type(e).__name__}: {str(e)[:200]})")
  lines.append(f"device slug: {slug}")
  order = ("device", "driver", "jax", "cudnn", "triton", "tokamax")
  lines.append("in short: " + ", ".join(short[k] for k in order if short.get(k)))
  text = "\n".join(lines)
  Path(args.out).write_text(text + "\n")
  print(text)
  Path(args.slug_file).write_text(slug + "\n")
  return status


# --- the bench's shape file -------------------------------------------------------------------


def bench_shapes(args: argparse.Namespace) -> int:
  """shapes/anchors.yaml with the small problem first: one `ragtune bench` process for both."""
  import yaml

  spec = yaml.safe_load((ROOT / "shapes" / "anchors.yaml").read_text())
  spec["name"] = "gpu_run"
  spec["shapes"] = [dict(SMALL), *spec["shapes"]]
  head = "# Written by benchmarks/gpu_run.py: shapes/smoke.yaml's first shape, then shapes/anchors.yaml's.\n"
  Path(args.out).write_text(head + yaml.safe_dump(spec, sort_keys=False, default_flow_style=None))
  return 0


# --- report -----------------------------------------------------------------------------------


def _read_csv(path: Path) -> list[dict]:
  if not path.is_file():
    return []
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _float(v: str | None) -> float | None:
  try:
    return float(v) if v not in (None, "") else None
  except ValueError:
    return None


def _column(variant: str) -> str:
  if variant.startswith("LUT"):
    return "LUT"
  if variant.startswith("xla"):
    return "xla"
  if variant.startswith("tokamax"):
    return "tokamax"
  if variant.startswith("dense"):
    return "dense"
  return variant.split(" ")[0]


def bench_table(rows: list[dict]) -> list[str]:
  """One line per problem and op: each variant's ms (or why it has none), and our best kernel's
  TF/s and its ratio to XLA and tokamax."""
  problems: dict[tuple[str, str], dict[str, dict]] = {}
  notes = []
  for r in rows:
    key = (r["shape"], r["op"])
    cols = problems.setdefault(key, {})
    if r["variant"] == "(all)":
      notes.append(f"  {r['op']} {r['shape']}: {r['status'][:160]}")
      continue
    col, ms = _column(r["variant"]), _float(r["ms"])
    if col in cols and (ms is None or (_float(cols[col]["ms"]) or float("inf")) <= ms):
      continue  # two rows of one peer (tokamax's implementations): the faster one
    cols[col] = r
  names = []
  for cols in problems.values():
    names += [c for c in cols if c not in names]
  first = [c for c in ("LUT",) if c in names]
  peers = [c for c in ("xla", "tokamax", "dense") if c in names]
  columns = first + [c for c in names if c not in first + peers] + peers
  head = f"{'problem':30} {'op':5}" + "".join(f"{c:>13}" for c in columns)
  head += f"{'ours TF/s':>11}{'vs xla':>8}{'vs tokamax':>11}"
  lines = [head]
  for (shape, op), cols in problems.items():
    cells = []
    for c in columns:
      r = cols.get(c)
      ms = _float(r["ms"]) if r else None
      if r is None:
        cells.append("-")
      elif r.get("same_as"):
        cells.append("= " + _column(r["same_as"]))
      elif ms is not None:
        cells.append(f"{ms:.4g} ms")
      else:
        cells.append(r["status"].split(":")[0].split(" (")[0][:12] or "?")
    ours = [
      cols[c] for c in columns if c not in peers and c in cols and _float(cols[c]["ms"]) and not cols[c].get("same_as")
    ]
    best = min(ours, key=lambda r: _float(r["ms"]), default=None)
    tf = _float(best["tflops"]) if best else None
    peer_ms = lambda peer: _float(cols[peer]["ms"]) if peer in cols else None
    ratio = lambda peer: f"{peer_ms(peer) / _float(best['ms']):.2f}x" if best and peer_ms(peer) else ""
    lines.append(
      f"{shape:30} {op:5}"
      + "".join(f"{c:>13}" for c in cells)
      + f"{(f'{tf:.4g}' if tf is not None else ''):>11}{ratio('xla'):>8}{ratio('tokamax'):>11}"
    )
  return lines + notes


def _steps(out: Path) -> list[dict]:
  path = out / "steps.tsv"
  if not path.is_file():
    return []
  keys = ("step", "planned", "cap", "took", "rc", "status")
  return [dict(zip(keys, line.split("\t"))) for line in path.read_text().splitlines() if line.strip()]


def _last(path: Path, contains: str = "") -> str:
  if not path.is_file():
    return ""
  lines = [l.strip() for l in path.read_text(errors="replace").splitlines() if l.strip() and contains in l]
  return lines[-1][:150] if lines else ""


def _result(step: str, out: Path, res: Path) -> str:
  """A few words on what the step left behind."""
  if step == "versions":
    return _last(out / "versions.txt", "in short:").removeprefix("in short: ")
  if step == "tests":
    return _last(out / "tests.txt", "tests:").removeprefix("tests: ")
  if step.startswith("bench-"):
    rows = _read_csv(out / f"{step}.csv")
    if not rows:
      return "no rows"
    timed = sum(1 for r in rows if _float(r["ms"]) is not None)
    bad = [r for r in rows if not r.get("same_as") and r["status"].split(":")[0] in ("wrong", "nan", "error")]
    problems = len({(r["shape"], r["op"]) for r in rows})
    return f"{problems} problems, {timed} variants timed, {len(bad)} failed or did not run"
  if step in ("sweep", "anchors-sweep", "exhaustive"):
    records = res / {"sweep": "smoke", "anchors-sweep": "", "exhaustive": "exhaustive"}[step] / "records.jsonl"
    n = sum(1 for _ in records.open()) if records.is_file() else 0
    return f"{n} rows in {records}"
  if step == "band-probe":
    rows = _read_csv(out / "band_probe.csv")
    timed = sum(1 for r in rows if _float(r["ms"]) is not None)
    bad = sum(1 for r in rows if r["status"] != "ok")
    return f"{len({r['problem'] for r in rows})} problems, {timed} variants timed, {bad} failed" if rows else "no rows"
  if step == "ship":
    verified = _last(out / "ship.log", "verified ")
    bundled = _last(out / "ship.log", "bundled") or "nothing bundled"
    return f"{verified}; {bundled}" if verified else bundled
  if step == "verify":
    return _last(out / "verify.log")
  if step == "export":
    return _last(out / "export.log")
  if step == "setup":
    text = (out / "setup.log").read_text() if (out / "setup.log").is_file() else ""
    return text.strip().splitlines()[0][:100] if text.strip() else ""
  return ""


def report(args: argparse.Namespace) -> int:
  out, res = Path(args.out), Path(args.res)
  lines = ["", "== summary"]
  steps = _steps(out)
  lines.append(f"{'step':11}{'planned':>8}{'cap':>5}{'took':>6}  {'status':26} result")
  total = 0
  for s in steps:
    total += int(s["took"] or 0)
    try:
      result = _result(s["step"], out, res)
    except Exception as e:  # noqa: BLE001 - a summary line must not stop the summary
      result = f"(unread: {e})"
    lines.append(f"{s['step']:11}{s['planned']:>8}{s['cap']:>5}{s['took']:>6}  {s['status']:26} {result}")
  planned = sum(int(s["planned"] or 0) for s in steps)
  lines.append(f"{'total':11}{planned:>8}{'':>5}{total:>6}  (seconds)")
  rows = []
  for op in ("fwd", "dlhs", "drhs"):
    rows += _read_csv(out / f"bench-{op}.csv")
  if rows:
    lines += ["", "== bench (ms of one call; ours TF/s: our fastest kernel variant; vs: its speedup over the peer)"]
    lines += bench_table(rows)
    try:
      sys.path.insert(0, str(HERE))
      import anchors

      files = [out / f"bench-{op}.csv" for op in ("fwd", "dlhs", "drhs")]
      targets = anchors.target_summary([r for f in files if f.is_file() for r in anchors.read_rows(f)])
      if targets:
        lines += ["", "== targets (benchmarks/anchors.py)"] + targets
    except Exception as e:  # noqa: BLE001
      lines += ["", f"targets: not computed ({type(e).__name__}: {str(e)[:200]})"]
  text = "\n".join(lines)
  (out / "summary.txt").write_text(text + "\n")
  print(text)
  return 0


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = ap.add_subparsers(dest="cmd", required=True)
  v = sub.add_parser("versions")
  v.add_argument("--out", required=True)
  v.add_argument("--slug-file", required=True)
  t = sub.add_parser("tests")
  t.add_argument("--out", required=True, help="folder for tests.txt, tests.json and the logs")
  t.add_argument("--deadline", type=float, required=True, help="seconds for all of it")
  t.add_argument("--timeout", type=int, default=60, help="seconds per test (pytest-timeout)")
  t.add_argument("--jobs", type=int, default=4, help="pytest processes at once")
  t.add_argument("files", nargs="+")
  b = sub.add_parser("bench-shapes")
  b.add_argument("--out", required=True)
  r = sub.add_parser("report")
  r.add_argument("--out", required=True)
  r.add_argument("--res", required=True)
  args = ap.parse_args(argv)
  return {"versions": versions, "tests": tests, "bench-shapes": bench_shapes, "report": report}[args.cmd](args)


if __name__ == "__main__":
  sys.exit(main())
