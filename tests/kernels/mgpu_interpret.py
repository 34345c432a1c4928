"""Test-only support for running kernels/mosaic_gpu/*.py in jax 0.10's Mosaic GPU interpreter.

jax 0.11 reads transposed shared-memory tiles in the interpreter itself (its
`interpret_utils.to_access` carries a permutation), so there `transposed_wgmma` does nothing.

The interpreter's wgmma reads its operands with `to_range`, which knows only indexing
transforms, so a wgmma on `plgpu.transpose_ref(tile)` fails with
"AttributeError: 'TransposeTransform' object has no attribute 'indices'". Hopper's wgmma
does read 16-bit operands transposed from shared memory, so `transposed_wgmma` teaches the
interpreter the same: it reads the tile under the indexing transforms, then transposes.
Everything else in the kernels runs on the interpreter as it ships.
"""

from __future__ import annotations

import contextlib

import numpy as np
from jax._src.pallas.mosaic.interpret import utils as interpret_utils
from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
from jax._src.state.types import TransposeTransform

_original_wgmma = gpu_callbacks.wgmma


def _read(shared_memory, key_array, transforms, thread, logging_info):
  transforms = gpu_callbacks._remove_noop_transforms(transforms)
  perms = [t.permutation for t in transforms if isinstance(t, TransposeTransform)]
  indexers = tuple(t for t in transforms if not isinstance(t, TransposeTransform))
  key = gpu_callbacks.HostAllocationKey.from_array(key_array)
  value, _, _ = shared_memory.get_buffer_content(
    key, interpret_utils.to_range(indexers), thread, logging_info=logging_info
  )
  for perm in perms:  # the kernels transpose the last two dims of an already sliced tile
    value = np.transpose(value, perm)
  return value


def _wgmma(
  *,
  token,
  device_id,
  grid_point_coords,
  thread_id,
  acc_allocation_key_as_array,
  acc_transforms,
  acc_dtype,
  a_allocation_key_as_array,
  a_transforms,
  b_allocation_key_as_array,
  b_transforms,
  source_info=None,
):
  import jax

  device_id, thread_id = int(device_id), int(thread_id)
  coords = tuple(int(x) for x in grid_point_coords)
  shared_memory = gpu_callbacks._get_shared_memory()
  thread = shared_memory.get_global_thread_id(device_id, thread_id)
  info = interpret_utils.GPULoggingInfo(
    device_id=device_id, grid_point_coords=coords, thread_id=thread_id, source_info=source_info
  )
  as_int = lambda ts: jax.tree.map(int, ts)
  a = _read(shared_memory, a_allocation_key_as_array, as_int(a_transforms), thread, info)
  b = _read(shared_memory, b_allocation_key_as_array, as_int(b_transforms), thread, info)
  acc_key = gpu_callbacks.HostAllocationKey.from_array(acc_allocation_key_as_array)
  acc_range = interpret_utils.to_range(gpu_callbacks._remove_noop_transforms(as_int(acc_transforms)))
  acc, _, _ = shared_memory.get_buffer_content(acc_key, acc_range, thread, logging_info=info)
  shared_memory.store_buffer_content(
    acc_key, acc_range, acc + np.matmul(a, b, dtype=acc_dtype), thread, logging_info=info
  )
  return token


# jax >= 0.11: the interpreter's own wgmma (whose arguments differ) handles transposes.
INTERPRETER_READS_TRANSPOSES = hasattr(interpret_utils, "to_access")


@contextlib.contextmanager
def transposed_wgmma():
  """Within this context, the interpreter's wgmma accepts transposed operands."""
  if INTERPRETER_READS_TRANSPOSES:
    yield
    return
  gpu_callbacks.wgmma = _wgmma
  try:
    yield
  finally:
    gpu_callbacks.wgmma = _original_wgmma
