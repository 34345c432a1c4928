"""The device a call is being built for.

Usually jax's first device. Under `jax.set_mesh(mesh)` with a mesh of another platform's
devices, the mesh's device: that is how a GPU program is compiled ahead of time on a
CPU-only host (`jax.experimental.topologies.get_topology_desc(platform="cuda", ...)`), and
the defaults, the interpret decision and the persistent grid's size must then follow the
GPU the program is compiled for, not the host.
"""

from __future__ import annotations

import dataclasses

import jax

from kernels import gpus

GPU_PLATFORMS = ("gpu", "cuda", "rocm")


@dataclasses.dataclass(frozen=True)
class Target:
  platform: str  # jax's platform name: "gpu", "tpu", "cpu" ("cuda"/"rocm" read as "gpu")
  device_kind: str  # e.g. "NVIDIA H100 80GB HBM3"
  num_cores: int | None  # SMs of a GPU; None when unknown

  @property
  def is_gpu(self) -> bool:
    return self.platform in GPU_PLATFORMS


def current() -> Target:
  """The abstract device of the mesh set by `jax.set_mesh`, when it names one, else
  jax.devices()[0]."""
  mesh = jax.sharding.get_abstract_mesh()
  dev = None if mesh is None or mesh.empty else getattr(mesh, "abstract_device", None)
  if dev is not None and dev.device_kind:
    platform = "gpu" if dev.platform in GPU_PLATFORMS else dev.platform
    if platform == "gpu":  # a mesh of this host's GPUs: theirs (a deviceless target's is noted by ragtune)
      _note(next((d for d in jax.devices() if d.device_kind == dev.device_kind), None))
    return Target(platform, dev.device_kind, dev.num_cores)
  d = jax.devices()[0]
  platform = "gpu" if d.platform in GPU_PLATFORMS else d.platform
  if platform == "gpu":
    _note(d)
  return Target(platform, d.device_kind, getattr(d, "core_count", None) if platform == "gpu" else None)


def _note(d) -> None:
  """A CUDA device's compute capability, by which a GPU with no facts file is placed
  (kernels.gpus.note_capability); a ROCm device's ("gfx942") names no NVIDIA arch."""
  if d is not None and d.platform in ("gpu", "cuda"):
    gpus.note_capability(d.device_kind, getattr(d, "compute_capability", None))
