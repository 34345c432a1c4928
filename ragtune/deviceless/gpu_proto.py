"""The GpuTargetConfigProto text of a named GPU (kernels.gpus): what XLA's deviceless GPU
compile takes as the device (jax.experimental.topologies.get_topology_desc(target_config=...)).

Its fields are those of XLA's reference specs (openxla/xla: xla/backends/gpu/target_config/specs/)
that jaxlib 0.10 parses: the GPU's facts file gives the SMs, L2, clock and memory; its compute
capability's Arch the shared memory, threads and registers; the rest is the same on every
NVIDIA GPU since sm_80 (CUDA C++ Programming Guide, "Compute Capabilities").
"""

from __future__ import annotations

from kernels import gpus

# sm_90a and sm_100a/sm_103a: the arch-specific features wgmma, setmaxnreg and tcgen05 need.
_ACCELERATED = ("hopper", "blackwell")


def proto_text(gpu: gpus.Gpu, variant: gpus.Variant | None = None) -> str:
  """The proto of `variant` (a device kind of `gpu`; its first when None)."""
  v = variant or gpu.variants[0]
  a = gpu.arch
  major, minor = gpu.capability
  ext = "ACCELERATED_FEATURES" if a.name in _ACCELERATED else "NONE"
  return f"""# {v.device_kind}: made by ragtune from kernels/gpu_facts/{gpu.name}.toml
gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {a.smem_per_sm}
  threads_per_core_limit: {a.threads_per_sm}
  core_count: {gpu.sms}
  fpus_per_core: {a.fp32_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {round(v.memory_bytes_per_s)}
  l2_cache_size: {gpu.l2_bytes}
  clock_rate_ghz: {gpu.clock_ghz}
  device_memory_size: {v.memory_bytes}
  shared_memory_per_block_optin: {a.smem_per_block}
  cuda_compute_capability {{
    major: {major}
    minor: {minor}
    feature_extension: {ext}
  }}
  registers_per_core_limit: {gpus.REGISTERS_PER_SM}
  registers_per_block_limit: {gpus.REGISTERS_PER_SM}
}}
platform_name: "CUDA"
dnn_version_info {{
  major: 9
  minor: 10
}}
runtime_version {{
  major: 12
  minor: 8
}}
device_description_str: "{v.device_kind}"
"""
