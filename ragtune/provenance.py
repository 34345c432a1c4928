"""Which software made a record or a LUT: ragtune (and its git commit when run from a
checkout), jax, jaxlib, and the compiler stack behind the device where it can be read.

Each part is read once per process. The host part opens no device, so any process may ask
for it; the device part (`for_device`) is read by the process that holds the device, a
sweep's worker, since the parent never opens one (docs/workers.md). What is read:
- GPU: the device client's `platform_version`, as XLA reports it, and the CUDA driver's
  version as jax reads it (`cudaDriverGetVersion`: 1000 * major + 10 * minor,
  https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART____VERSION.html);
- TPU: the client's `platform_version` (libtpu's build) and the `libtpu` package's version;
- the deviceless compile (ragtune.deviceless.aot): the version of the ptxas XLA runs.
jaxlib 0.10 builds Triton into its GPU plugin and exposes no Triton version, so none is kept.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sysconfig
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  import kernels

# The checkout (or unpacked source tree) this package runs from, if it runs from one.
_ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Versions:
  """The versions behind one row or LUT; a field is None where it was not read (or does not
  apply: no CUDA driver on a TPU). Written as a small object of the fields that are set."""

  ragtune: str | None = None
  commit: str | None = None  # short sha, "+dirty" with uncommitted changes; only from a git checkout
  jax: str | None = None
  jaxlib: str | None = None
  platform: str | None = None  # the device client's platform_version (GPU, TPU)
  cuda_driver: str | None = None
  libtpu: str | None = None
  ptxas: str | None = None  # the deviceless compile's

  def to_dict(self) -> dict[str, str]:
    return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

  @classmethod
  def from_dict(cls, d: Any) -> Versions:
    """As written; keys a later ragtune adds are ignored. ValueError says what is wrong."""
    if not isinstance(d, dict) or not all(isinstance(v, str) for v in d.values()):
      raise ValueError(f"versions: expected an object of strings, got {repr(d)[:120]}")
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})

  def __str__(self) -> str:
    """'ragtune 0.1.0 (f65beb4), jax 0.10.2, jaxlib 0.10.2': what `ragtune --version` prints."""
    commit = f" ({self.commit})" if self.commit else ""
    return f"ragtune {self.ragtune}{commit}, jax {self.jax}, jaxlib {self.jaxlib}"


@functools.cache
def ragtune_version() -> str:
  """The version in pyproject.toml when this package runs from its source tree (the code
  that runs is the tree's, whatever an install's metadata says), else the installed
  package's metadata; "unknown" when neither says."""
  try:
    project = tomllib.loads((_ROOT / "pyproject.toml").read_text()).get("project", {})
  except (OSError, tomllib.TOMLDecodeError):
    project = {}
  if project.get("name") == "ragtune" and isinstance(project.get("version"), str):
    return project["version"]
  return _dist_version("ragtune") or "unknown"


def git_commit(root: Path) -> str | None:
  """The short sha of the git checkout at `root`, "+dirty" when tracked files changed; None,
  quietly, when root is no checkout of its own (a package installed inside another
  project's repository must not take that commit) or git is missing or fails."""
  if not (root / ".git").exists():
    return None
  env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # e.g. GIT_DIR set by a hook
  try:
    r = subprocess.run(
      ["git", "-C", str(root), "describe", "--always", "--dirty=+dirty", "--abbrev=7", "--exclude=*"],
      capture_output=True,
      text=True,
      env=env,
      timeout=10,
    )
  except (OSError, subprocess.SubprocessError):
    return None
  return (r.stdout.strip() or None) if r.returncode == 0 else None


def _dist_version(name: str) -> str | None:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


@functools.cache
def host() -> Versions:
  """ragtune's version and commit, jax's and jaxlib's: read without opening a device."""
  import jax
  import jaxlib

  return Versions(ragtune=ragtune_version(), commit=git_commit(_ROOT), jax=jax.__version__, jaxlib=jaxlib.__version__)


def _cuda_driver() -> str | None:
  try:
    from jax._src.lib import cuda_versions  # jax has no public call for it

    v = cuda_versions.cuda_driver_get_version()
  except Exception:  # noqa: BLE001 - no CUDA plugin, or no driver: nothing to record
    return None
  return f"{v // 1000}.{v % 1000 // 10}"


@functools.cache
def for_device(dev) -> Versions:
  """host() and what the device's compiler stack reports. Only where the device is open."""
  parts: dict[str, str | None] = {}
  if dev.platform != "cpu":  # on a CPU, jaxlib is the whole stack
    parts["platform"] = " ".join(str(dev.client.platform_version).split())
  if dev.platform == "gpu":
    parts["cuda_driver"] = _cuda_driver()
  if dev.platform == "tpu":
    parts["libtpu"] = _dist_version("libtpu")
  return dataclasses.replace(host(), **parts)


def cuda_data_dir() -> str | None:
  """The CUDA folder ragtune.deviceless.aot hands XLA's GPU compiler (xla_gpu_cuda_data_dir; its ptxas
  is bin/ptxas): jax's own (CUDA_ROOT, or the nvidia-cuda-nvcc wheel) when it holds a ptxas,
  else that wheel's. jax 0.10 to 0.12 take an importable `nvidia.cu13` first, which the
  cuobjdump and nvdisasm 13 wheels of the gpu-compile extra make, and with no ptxas there hand
  XLA the folder "None" (jax/_src/lib/__init__.py, _cuda_path); XLA then runs the first ptxas
  on PATH, so the same build compiled with a host's own CUDA where it had one."""
  from jax._src import lib  # jax has no public name for the CUDA path it hands XLA

  candidates = [getattr(lib, "cuda_path", None)]
  try:
    spec = importlib.util.find_spec("nvidia.cuda_nvcc")
  except ImportError:  # no nvidia package at all
    spec = None
  candidates += list(spec.submodule_search_locations or ()) if spec else []
  return next((str(c) for c in candidates if c and (Path(str(c)) / "bin" / "ptxas").is_file()), None)


def find_tool(name: str) -> str | None:
  """An NVIDIA tool on PATH, or from the nvidia-cuda-* wheels in this environment."""
  found = shutil.which(name)
  if found:
    return found
  site = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
  for cand in sorted(site.glob(f"*/bin/{name}")):
    return str(cand)
  return None


def xla_ptxas() -> str | None:
  """The ptxas XLA runs: cuda_data_dir's, else the first of PATH, /usr/local/cuda and the
  nvidia wheels, the order in which jaxlib 0.10's XLA probes them (seen with strace on a
  deviceless compile)."""
  data_dir = cuda_data_dir()
  candidates = [Path(data_dir) / "bin" / "ptxas" if data_dir else None, shutil.which("ptxas")]
  candidates += [Path("/usr/local/cuda/bin/ptxas"), find_tool("ptxas")]
  return next((str(c) for c in candidates if c and Path(c).is_file()), None)


@functools.cache
def for_aot(platform: str = "gpu") -> Versions:
  """host() and the version of the compiler the deviceless compile (ragtune.deviceless.aot) runs: for a
  GPU the ptxas, for a TPU the libtpu package."""
  if platform == "tpu":
    return dataclasses.replace(host(), libtpu=_dist_version("libtpu"))
  return dataclasses.replace(host(), ptxas=ptxas_version(xla_ptxas()))


def ptxas_version(tool: str | None) -> str | None:
  """A ptxas's version ("12.9.86"), None where it is missing or does not run."""
  try:
    out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30).stdout if tool else ""
  except (OSError, subprocess.SubprocessError):
    out = ""
  found = re.search(r"\bV(\d+(?:\.\d+)+)", out)  # "Cuda compilation tools, release 12.9, V12.9.86"
  return found.group(1) if found else None


def sorted_versions(versions: set[str]) -> list[str]:
  """Oldest first: 0.4.35 before 0.10.2."""
  return sorted(versions, key=lambda v: [(0, int(x), "") if x.isdigit() else (1, 0, x) for x in re.split(r"[.+-]", v)])


# --- rows and LUTs ----------------------------------------------------------------------------


def shared(dicts: list[dict[str, str]]) -> dict[str, str]:
  """The versions (key and value) every one of `dicts` has."""
  first, *rest = dicts or [{}]
  return {k: v for k, v in first.items() if all(d.get(k) == v for d in rest)}


def of_entry(meta: dict[str, Any], e: kernels.Entry) -> Versions:
  """A LUT entry's versions: the LUT's `tuned_with` overlaid by the entry's own `versions`
  (export-lut writes those only where the entries differ). A LUT from before them has
  only the entry's jax_version. ValueError names a malformed field."""
  d: dict[str, Any] = {}
  for where, part in (("tuned_with", meta.get("tuned_with")), ("versions", e.extra.get("versions"))):
    if part is not None and not isinstance(part, dict):
      raise ValueError(f"{where}: expected an object, got {repr(part)[:120]}")
    d.update(part or {})
  if "jax" not in d and isinstance(e.extra.get("jax_version"), str):
    d["jax"] = e.extra["jax_version"]
  return Versions.from_dict(d)
