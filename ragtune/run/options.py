"""What a sweep is asked to do: its options, read by the planning and the pool."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

DEFAULT_BUILDER = "ragtune.device.measure:build_op"
DEFAULT_TIMEOUT_S = 120.0  # seconds for one candidate: compile, check, time


@dataclasses.dataclass
class SweepOptions:
  out_dir: Path
  max_candidates: int | None = None
  timeout_s: float = DEFAULT_TIMEOUT_S
  interpret: bool = False
  builder: str = DEFAULT_BUILDER  # module:function, imported by the workers
  devices: tuple[int, ...] = (0,)  # one worker per local device index
  platform: str = "cpu"  # of those devices: "gpu" pins by CUDA_VISIBLE_DEVICES
  budget: int | None = None  # candidates timed per problem (staged search)
  wait_for_lock: bool = False
  ceilings: bool = True  # measure the device's matmul/copy ceilings once
  lut: Any = None  # kernels.Lut whose nearest entry seeds a budgeted search
  device_kind: str | None = None  # the tuned device (probe_devices): search space and defaults
  spare_workers: bool = True  # after a first replacement, keep a started spare per device
  skip_bad_lines: bool = False  # read past lines of records.jsonl that are not records
  retry_failed: bool = False  # measure again the rows environment.retryable() names
  sharded: bool = False  # out_dir is a shard's folder (ragtune.run.shard) in the results folder
