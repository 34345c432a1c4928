"""Bad input: one clear line naming the file (and key/line), exit != 0, no traceback, nothing written."""

import dataclasses
import json
import os
from pathlib import Path

import pytest
from test_records import WORKER_ROW
from typer.testing import CliRunner

import kernels
from ragtune import paths
from ragtune.cli.app import app
from ragtune.errors import RagtuneError
from ragtune.problems import limits
from ragtune.records import store

runner = CliRunner()
GOOD_SHAPE = "shapes:\n  - {m: 16, k: 16, n: 16, g: 2}\n"

YAML_CASES = {
  "malformed": ("shapes: [\n  {m: 1, k: 2\n", "malformed YAML"),
  "empty": ("", "empty shapes file"),
  "non_list_shapes": ("shapes: 5\n", ":1: shapes"),
  "unknown_key": ("dtype: bfloat16\nshapes:\n  - {m: 8, k: 8, n: 8, g: 2, foo: 1}\n", ":3: shapes[0].foo: unknown key"),
  "unknown_top_key": ("shape:\n  - {m: 8, k: 8, n: 8, g: 2}\n", "shape: unknown key"),
  "non_numeric_dim": ("shapes:\n  - {m: 8, k: abc, n: 8, g: 2}\n", ":2: shapes[0].k"),
  "non_positive_dim": ("shapes:\n  - m: 8\n    k: 8\n    n: 0\n    g: 2\n", ":4: shapes[0].n"),
  "unknown_dtype": ("dtype: int4\n" + GOOD_SHAPE, ":1: dtype"),
  "scales_missing": ("dtype: int8\n" + GOOD_SHAPE, ":1: dtype: int8 operands need scales"),
  "unknown_backend": ("backends: [cuda]\n" + GOOD_SHAPE, ":1: backends[0]"),
  "unknown_op": ("ops: [fwd, bwd]\n" + GOOD_SHAPE, ":1: ops[1]"),
  "sizes_exceed_m": ("shapes:\n  - {m: 10, k: 8, n: 8, g: 2, group_sizes: [6, 5]}\n", "sum to 11, more than m=10"),
  "python_tag": ("shapes: !!python/object/apply:os.system ['touch PWNED']\n", "unsupported YAML tag"),
  "unknown_model": ("models:\n  - {model: gpt-5, tokens: [1]}\n", "unknown model 'gpt-5'"),
  "nothing_to_tune": ("dtype: float32\n", "at least one entry"),
  "duplicate_top_key": (GOOD_SHAPE + "name: x\nshapes: []\n", ":4: duplicate key 'shapes' (first given on line 1)"),
  "duplicate_inner_key": (
    "shapes:\n  - {m: 8, k: 8, n: 8, g: 2, m: 3}\n",
    ":2: duplicate key 'm' (first given on line 2)",
  ),
  "zipf_alpha": (
    "shapes:\n  - {m: 8, k: 8, n: 8, g: 2, group_sizes: {dist: zipf, alpha: -1}}\n",
    "shapes[0].group_sizes.alpha: Input should be greater than 0",
  ),
  "fill": (
    "shapes:\n  - {m: 8, k: 8, n: 8, g: 2, group_sizes: {fill: 2}}\n",
    "shapes[0].group_sizes.fill: Input should be less than",
  ),
  "empty_fraction": (
    "shapes:\n  - {m: 8, k: 8, n: 8, g: 2, group_sizes: {dist: zipf, empty_fraction: 1}}\n",
    "shapes[0].group_sizes.empty_fraction: Input should be less than 1",
  ),
  "seed": (
    "shapes:\n  - {m: 8, k: 8, n: 8, g: 2, group_sizes: {seed: x}}\n",
    "shapes[0].group_sizes.seed: Input should be a valid integer",
  ),
  "negative_seed": (
    "shapes:\n  - m: 8\n    k: 8\n    n: 8\n    g: 2\n    group_sizes: {seed: -1}\n",
    ":6: shapes[0].group_sizes.seed: Input should be greater than or equal to 0",
  ),
  "model_knob": (
    "models:\n  - {model: olmoe-1b-7b, tokens: [2], group_sizes: {dist: zipf, alpha: 0}}\n",
    ":2: models[0].group_sizes.alpha: Input should be greater than 0",
  ),
  "zero_groups": ("shapes:\n  - {m: 8, k: 8, n: 8, g: 0}\n", ":2: shapes[0].g: Input should be greater than 0"),
  # Cross-field rules of a model entry, each named at its key's line.
  "top_k_over_experts": (
    "models:\n  - model: qwen3-30b-a3b\n    tokens: [16]\n    top_k: 200\n",
    ":4: models[0].top_k: 200 is more than the 128 experts of qwen3-30b-a3b",
  ),
  "explicit_top_k": (
    "models:\n  - {name: mine, hidden: 8, intermediate: 8, experts: 4, top_k: 5, tokens: [2]}\n",
    ":2: models[0].top_k: 5 is more than the 4 experts of mine",
  ),
  "ep_divides_experts": (
    "models:\n  - {model: qwen3-30b-a3b, tokens: [16], ep: 3}\n",
    ":2: models[0].ep: 3 does not divide the 128 experts of qwen3-30b-a3b",
  ),
  "tp_divides_intermediate": (
    "models:\n  - model: mixtral-8x7b\n    tokens: [16]\n    tp: 5\n",
    ":4: models[0].tp: 5 does not divide the intermediate size 14336 of mixtral-8x7b",
  ),
  "fused_without_up": (
    "models:\n  - {model: mixtral-8x7b, tokens: [16], projections: [down], fused_gate_up: true}\n",
    ":2: models[0].fused_gate_up: fuses gate into the up projection, but projections leaves up out",
  ),
  "model_and_name": (
    "models:\n  - model: mixtral-8x7b\n    name: mine\n    tokens: [16]\n",
    ":3: models[0].name: give either model: (a preset) or name:",
  ),
  "neither_model_nor_name": ("models:\n  - {tokens: [16]}\n", ":2: models[0]: give either model: (a preset) or name:"),
  "preset_with_layer_key": (
    "models:\n  - model: mixtral-8x7b\n    tokens: [16]\n    hidden: 8\n",
    ":4: models[0].hidden: set by the preset mixtral-8x7b; for other values use name: instead of model:",
  ),
  "explicit_missing_keys": (
    "models:\n  - {name: mine, hidden: 8, experts: 4, tokens: [2]}\n",
    ":2: models[0].name: an explicit layer needs hidden, intermediate, experts, top_k; missing: intermediate, top_k",
  ),
  "name_with_colon": (
    "models:\n  - {name: 'a:b', hidden: 8, intermediate: 8, experts: 4, top_k: 2, tokens: [2]}\n",
    ":2: models[0].name: 'a:b': use letters, digits",
  ),
  "tokens_twice": (
    "models:\n  - {model: mixtral-8x7b, tokens: [16, 64, 16]}\n",
    ":2: models[0].tokens: 16 is given twice",
  ),
  "ops_twice": ("ops: [fwd, fwd]\n" + GOOD_SHAPE, ":1: ops: 'fwd' is given twice"),
  "same_shape_twice": (
    GOOD_SHAPE + "  - {m: 32, k: 16, n: 16, g: 2}\n  - {m: 16, k: 16, n: 16, g: 2}\n",
    ":4: shapes[2]: the same entry as shapes[0]",
  ),
  "same_model_twice": (
    "models:\n  - {model: olmoe-1b-7b, tokens: [2]}\n  - {model: olmoe-1b-7b, tokens: [2]}\n",
    ":3: models[1]: the same entry as models[0]",
  ),
  "sizes_vs_g": (
    "shapes:\n  - m: 8\n    k: 8\n    n: 8\n    g: 2\n    group_sizes: [1, 2, 3]\n",
    ":6: shapes[0].group_sizes: 3 entries, but g=2",
  ),
  "int32_overflow": (
    "backends: [pallas_tpu]\nshapes:\n  - {m: 8, k: 8, n: 8, g: 2}\n  - {m: 70000, k: 70000, n: 16, g: 2}\n",
    "bad.yaml: shapes[1]: fwd pallas_tpu [70000,70000]x[2,70000,16] bfloat16: lhs [m,k] has 4,900,000,000 "
    "elements, beyond pallas_tpu's int32 indexing (2,147,483,647); the problem needs 10,208,240,000 bytes",
  ),
}


def _one_error_line(result):
  lines = [l for l in result.output.strip().splitlines() if l.strip()]
  assert len(lines) == 1, result.output
  assert lines[0].startswith("error: ")
  assert "Traceback" not in result.output
  return lines[0]


@pytest.mark.parametrize("case", list(YAML_CASES))
def test_bad_shapes_file(tmp_path, monkeypatch, case):
  monkeypatch.chdir(tmp_path)
  text, expected = YAML_CASES[case]
  path = tmp_path / "bad.yaml"
  path.write_text(text)
  result = runner.invoke(app, ["sweep", str(path), "-o", str(tmp_path / "out")])
  assert result.exit_code == 2
  line = _one_error_line(result)
  assert str(path) in line and expected in line, line
  assert not (tmp_path / "out").exists(), "no records may be written for bad input"
  assert not (tmp_path / "PWNED").exists()


def test_bad_cli_values(tmp_path):
  path = tmp_path / "ok.yaml"
  path.write_text(GOOD_SHAPE)
  result = runner.invoke(app, ["sweep", str(path), "--backend", "cuda", "-o", str(tmp_path / "out")])
  assert result.exit_code == 2 and "unknown op/backend ['cuda']" in _one_error_line(result)
  assert not (tmp_path / "out").exists()


# Our part of each line; click's own words after it differ between click versions.
@pytest.mark.parametrize(
  "args,expected",
  [
    (["sweep", "{spec}", "--max-candidates", "0"], "error: --max-candidates 0: "),
    (["sweep", "{spec}", "--timeout", "-1"], "error: --timeout -1: "),
    (["sweep", "{spec}", "--budget=0"], "error: --budget 0: "),
    (["sweep", "{spec}", "--max-candidates", "two"], "error: --max-candidates two: "),
    (["plan", "{spec}", "-j", "0"], "error: --jobs 0: "),
    (["compile", "{spec}", "-j", "0"], "error: --jobs 0: "),
    (["verify", "--timeout", "0"], "error: --timeout 0: "),
    (["verify", "--seed", "-1"], "error: --seed -1: "),
    (["export-lut", "--format", "xml"], "error: --format xml: "),
    (["sweep"], "SHAPES_FILE"),
    (["show", "--foo"], "--foo"),
    (["sweeep"], "sweeep"),
  ],
)
def test_usage_errors_are_one_line(tmp_path, monkeypatch, args, expected):
  """Ranges, types, unknown options and missing arguments: the one `error:` line, exit 2, no usage block."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "spec.yaml").write_text(GOOD_SHAPE)
  r = runner.invoke(app, [a.format(spec=tmp_path / "spec.yaml") for a in args], prog_name="ragtune")
  assert r.exit_code == 2, r.output
  line = _one_error_line(r)
  command = "ragtune" if args[0] == "sweeep" else f"ragtune {args[0]}"
  assert expected in line and line.endswith(f"(see '{command} --help')"), line
  assert _tree(tmp_path) == ["spec.yaml"], "nothing written"


def _commands():
  """(words, click command) of every command of the CLI, `shapes from-config` included."""
  import typer.main

  todo = [([], typer.main.get_command(app))]
  while todo:
    words, cmd = todo.pop()
    if hasattr(cmd, "commands"):
      todo += [([*words, name], sub) for name, sub in cmd.commands.items()]
    else:
      yield words, cmd


def test_an_empty_value_is_refused_by_every_option_and_argument(tmp_path, monkeypatch):
  """-o "$OUT" with OUT unset: an empty path is the current folder (records, locks and LUTs
  would land there) and an empty --op all ops; every option that takes a value and every
  argument refuses it, before any work."""
  monkeypatch.chdir(tmp_path)
  seen = set()
  for words, cmd in _commands():
    for p in cmd.params:
      if p.param_type_name == "option" and not p.is_flag:
        given, named = [p.opts[-1], ""], f"{p.opts[-1]} ''"
      elif p.param_type_name == "argument":
        given, named = [""], f"{p.metavar} ''"
      else:
        continue
      seen.add(p.opts[-1])
      r = runner.invoke(app, [*words, *given], prog_name="ragtune")
      assert r.exit_code == 2, (words, given, r.output)
      line = _one_error_line(r)
      assert line.startswith(f"error: {named}: empty (an unset shell variable?)"), line
      assert line.endswith(f"(see 'ragtune {' '.join(words)} --help')"), line
  assert {"-o", "--csv", "--lut", "--op", "--devices", "shapes_file", "dirs", "target", "config"} <= seen, seen
  # As --opt=VALUE, and after other options and arguments.
  for args in (["sweep", "x.yaml", "--out="], ["export-lut", "res", "--format", "json", "-o", ""], ["show", "a", ""]):
    r = runner.invoke(app, args, prog_name="ragtune")
    assert r.exit_code == 2 and ": empty (an unset shell variable?)" in _one_error_line(r), (args, r.output)
  assert _tree(tmp_path) == [], "nothing written"


def test_bad_devices_is_one_line_and_writes_nothing(tmp_path):
  (tmp_path / "spec.yaml").write_text(GOOD_SHAPE)
  r = runner.invoke(app, ["sweep", str(tmp_path / "spec.yaml"), "-o", str(tmp_path / "out"), "--devices", "0"])
  assert r.exit_code == 2 and "--devices 0: a count must be at least 1" in _one_error_line(r)
  assert _tree(tmp_path) == ["spec.yaml"]


def test_missing_file_and_empty_results(tmp_path):
  r = runner.invoke(app, ["sweep", str(tmp_path / "nope.yaml")])
  assert r.exit_code == 2 and "no such shapes file" in _one_error_line(r)
  (tmp_path / "adir").mkdir()
  r = runner.invoke(app, ["sweep", str(tmp_path / "adir"), "-o", str(tmp_path / "out")])
  assert r.exit_code == 2 and "adir: cannot read (Is a directory)" in _one_error_line(r)
  (tmp_path / "adir").rmdir()
  for cmd in (["export-lut"], ["show"], ["report", "-o", str(tmp_path / "rep")], ["verify"]):
    r = runner.invoke(app, cmd[:1] + [str(tmp_path / "missing")] + cmd[1:])
    assert r.exit_code == 2, (cmd, r.output)
    line = _one_error_line(r)
    assert "missing: no such" in line and "records.jsonl" not in line, line
  assert sorted(p.name for p in tmp_path.iterdir()) == []
  (tmp_path / "empty").mkdir()
  r = runner.invoke(app, ["export-lut", str(tmp_path / "empty")])
  assert r.exit_code == 2 and "no records.jsonl here" in _one_error_line(r)
  (tmp_path / "empty" / "records.jsonl").write_text("")
  r = runner.invoke(app, ["export-lut", str(tmp_path / "empty")])
  assert r.exit_code == 2 and "results file is empty" in _one_error_line(r)


def test_a_missing_results_folder_says_how_to_make_one(tmp_path, monkeypatch):
  """A fresh clone's commands other than sweep: the default folder is named with the sweep
  that makes it; a folder given is named with the sweep that makes it there."""
  monkeypatch.chdir(tmp_path)
  default = Path("results") / kernels.device_slug(kernels.lut.current_device_kind())
  for cmd, what in (("verify", "LUT file or results folder"), ("show", "results folder"), ("report", "results folder")):
    line = _one_error_line(runner.invoke(app, [cmd]))
    assert (
      line == f"error: {default}: no such {what} (this device's default; run a sweep first: ragtune sweep SHAPES.yaml)"
    )
  (tmp_path / "shapes").mkdir()
  (tmp_path / "shapes" / "smoke.yaml").write_text(GOOD_SHAPE)  # as in a checkout
  line = _one_error_line(runner.invoke(app, ["export-lut"]))
  assert line.endswith("(this device's default; run a sweep first: ragtune sweep shapes/smoke.yaml)"), line
  line = _one_error_line(runner.invoke(app, ["show", "my results"]))
  assert (
    line
    == "error: my results: no such results folder (a sweep makes one: ragtune sweep shapes/smoke.yaml -o 'my results')"
  )
  line = _one_error_line(runner.invoke(app, ["verify", "lut.json"]))
  assert line.endswith("(export-lut writes one: ragtune export-lut RESULTS_DIR -o lut.json)"), line
  assert sorted(p.name for p in tmp_path.iterdir()) == ["shapes"], "nothing written"


def test_a_record_with_bad_versions_is_named(tmp_path):
  row = {**json.loads(WORKER_ROW), "versions": "0.10.2"}
  (tmp_path / store.RECORDS).write_text(json.dumps(row) + "\n")
  for cmd in (["show", str(tmp_path), "--csv", str(tmp_path / "best.csv")], ["export-lut", str(tmp_path)]):
    r = runner.invoke(app, cmd)
    assert r.exit_code == 2, r.output
    line = _one_error_line(r)
    assert "records.jsonl:1: not a sweep record (versions: expected an object of strings, got '0.10.2')" in line
  assert sorted(p.name for p in tmp_path.iterdir()) == [store.RECORDS], "nothing written"


def _lut_text(kind, version=kernels.lut.SCHEMA_VERSION, **meta):
  return json.dumps(
    {
      "schema": "ragtune-lut",
      "schema_version": version,
      "device_kind": kind,
      **meta,
      "entries": [
        {
          "op": "fwd",
          "backend": "pallas_gpu",
          "dtype": "float32",
          "m": 16,
          "k": 16,
          "n": 16,
          "g": 2,
          "config": {"block_m": 16, "block_k": 16, "block_n": 16, "num_warps": 4, "num_stages": 2},
        }
      ],
    }
  )


@pytest.mark.parametrize(
  "text,expected",
  [
    ("{corrupt", "invalid JSON"),
    (_lut_text(kernels.lut.current_device_kind(), version=7), "schema_version 7 is not supported"),
    (_lut_text("NVIDIA H100 80GB HBM3"), "tuned on 'NVIDIA H100 80GB HBM3'"),
    (_lut_text(kernels.lut.current_device_kind(), tuned_with="0.10.2"), "tuned_with: expected an object, got '0.10.2'"),
    (
      _lut_text(kernels.lut.current_device_kind(), tuned_with={"jax": 10}),
      "versions: expected an object of strings, got {'jax': 10}",
    ),
  ],
)
def test_verify_refuses_bad_luts(tmp_path, text, expected):
  path = tmp_path / "lut.json"
  path.write_text(text)
  r = runner.invoke(app, ["verify", str(path)])
  assert r.exit_code == 2
  line = _one_error_line(r)
  assert str(path) in line and expected in line


def test_help_has_examples():
  for cmd in ("sweep", "verify", "export-lut", "show", "report"):
    r = runner.invoke(app, [cmd, "--help"])
    assert r.exit_code == 0 and "Example: ragtune" in r.output


def _tree(root):
  return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


UNWRITABLE = "/sys/ragtune-test"  # sysfs refuses new entries, even to root


@pytest.mark.parametrize(
  "cmd,expected",
  [
    (["sweep", "{spec}", "-o", "{file}"], "{file}: is a file, but the results folder must be a folder"),
    (["sweep", "{spec}", "-o", "{file}/sub"], "{file} is a file, so it cannot hold the results folder"),
    (["sweep", "{spec}", "-o", "{res}/records.jsonl/x"], "is a file, so it cannot hold"),
    (["sweep", "{spec}", "-o", UNWRITABLE], "cannot write the results folder here"),
    (["export-lut", "{res}", "-o", "{file}"], "{file}: is a file, but the LUT folder"),
    (["export-lut", "{res}", "-o", "{dir}.json"], "{dir}.json: is a folder, but the LUT file must be a file"),
    (["export-lut", "{res}", "-o", UNWRITABLE + ".json"], "cannot write the LUT file"),
    (["report", "{res}", "-o", "{file}"], "{file}: is a file, but the report folder must be a folder"),
    (["report", "{res}", "-o", UNWRITABLE], "cannot write the report folder here"),
    (["show", "{res}", "--csv", "{dir}"], "{dir}: is a folder, but the --csv file must be a file"),
    (["show", "{res}", "--csv", "{file}/x.csv"], "is a file, so it cannot hold the --csv file"),
    (["show", "{res}", "--csv", UNWRITABLE + "/x.csv"], "cannot write the --csv file"),
  ],
)
def test_bad_output_paths(tmp_path, monkeypatch, cmd, expected):
  if os.path.exists(UNWRITABLE) or not os.path.isdir("/sys"):
    pytest.skip("needs a Linux /sys")
  monkeypatch.chdir(tmp_path)
  (tmp_path / "spec.yaml").write_text(GOOD_SHAPE)
  (tmp_path / "afile").write_text("x")
  (tmp_path / "adir").mkdir()
  (tmp_path / "res").mkdir()
  (tmp_path / "res" / "records.jsonl").write_text("{}\n")
  names = {
    "spec": str(tmp_path / "spec.yaml"),
    "file": str(tmp_path / "afile"),
    "dir": str(tmp_path / "adir"),
    "res": str(tmp_path / "res"),
  }
  if "{dir}.json" in cmd:
    (tmp_path / "adir.json").mkdir()
  before = _tree(tmp_path)
  r = runner.invoke(app, [c.format(**names) for c in cmd])
  assert r.exit_code == 2, r.output
  assert expected.format(**names) in _one_error_line(r)
  assert _tree(tmp_path) == before, "nothing is left behind"


QWEN = {"hidden_size": 2048, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8}
CONFIG_CASES = {
  "dense": ('{"hidden_size": 4096, "intermediate_size": 14336}', [], "{cfg}: no MoE layer found (a dense model?); "),
  "not_json": ('{"hidden_size": 2048,', [], "{cfg}: not a JSON file"),
  "not_object": ("[1, 2]", [], "{cfg}: expected a JSON object"),
  "bad_value": (json.dumps({**QWEN, "num_experts": "128"}), [], "{cfg}: num_experts: expected a positive integer"),
  "top_k": (
    json.dumps({**QWEN, "num_experts_per_tok": 200}),
    [],
    "{cfg}: num_experts_per_tok: 200 is more than the 128 experts",
  ),
  "ep": (json.dumps(QWEN), ["--ep", "3"], "{cfg}: --ep: 3 does not divide the 128 experts of cfg"),
  "tp": (json.dumps(QWEN), ["--tp", "5"], "{cfg}: --tp: 5 does not divide the intermediate size 768 of cfg"),
  "dtype": (json.dumps(QWEN), ["--dtype", "int4"], "{cfg}: --dtype: Input should be 'bfloat16'"),
  "dtype_scales": (json.dumps(QWEN), ["--dtype", "int8"], "{cfg}: --dtype: int8 operands need scales"),
  "tokens": (json.dumps(QWEN), ["--tokens", "16,x"], "--tokens '16,x': expected positive integers"),
  "missing": (None, [], "{cfg}: no such config file"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_config_for_from_config(tmp_path, case):
  text, options, expected = CONFIG_CASES[case]
  cfg = tmp_path / "cfg.json"
  if text is not None:
    cfg.write_text(text)
  before = _tree(tmp_path)
  r = runner.invoke(app, ["shapes", "from-config", str(cfg), "-o", str(tmp_path / "out.yaml"), *options])
  assert r.exit_code == 2, r.output
  assert expected.format(cfg=cfg) in _one_error_line(r)
  assert _tree(tmp_path) == before, "nothing is written"


def test_dense_config_names_the_fields_looked_for(tmp_path):
  cfg = tmp_path / "config.json"
  cfg.write_text('{"text_config": {"hidden_size": 4096, "intermediate_size": 14336}}')
  line = _one_error_line(runner.invoke(app, ["shapes", "from-config", str(cfg)]))
  assert line.endswith(
    "looked for experts: text_config.n_routed_experts, text_config.num_local_experts, text_config.num_experts, "
    "text_config.ffn_config.moe_num_experts; top_k: text_config.num_experts_per_tok, "
    "text_config.experts_per_token, text_config.ffn_config.moe_top_k"
  ), line


def test_write_atomic_cleans_up(tmp_path, monkeypatch):
  target = tmp_path / "out.json"

  def fail(*a):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(os, "replace", fail)
  with pytest.raises(RagtuneError, match="out.json: cannot write \\(No space left on device\\)"):
    paths.write_atomic(target, "data")
  assert list(tmp_path.iterdir()) == []
  monkeypatch.undo()
  (tmp_path / "d").mkdir()
  with pytest.raises(RagtuneError, match="is a folder, not a file"):
    paths.write_atomic(tmp_path / "d", "data")
  assert _tree(tmp_path) == ["d"]


def _small_device(monkeypatch, memory):
  from ragtune.run import devices

  real = devices.probe_devices()
  monkeypatch.setattr(devices, "probe_devices", lambda: dict(real, memory_bytes=memory))


def test_problem_bigger_than_device_memory(tmp_path, monkeypatch):
  _small_device(monkeypatch, 1 << 20)
  spec = tmp_path / "s.yaml"
  spec.write_text("ops: [drhs]\nshapes:\n  - {m: 256, k: 128, n: 128, g: 4}\n")
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(tmp_path / "out")])
  assert r.exit_code == 2
  need = limits.bytes_needed("drhs", "bfloat16", 256, 128, 128, 4)
  assert f"{spec}: shapes[0]: drhs pallas_gpu [256,128]x[4,128,128] bfloat16: needs {need:,} bytes" in _one_error_line(
    r
  )
  assert "more than the device's 1,048,576 bytes" in r.output
  assert not (tmp_path / "out").exists()


def test_problems_too_big_for_the_device_are_skipped_with_a_warning(tmp_path, monkeypatch):
  """A shape set for many devices (moe.yaml) runs what fits this one, and says what it skipped."""
  small = limits.bytes_needed("fwd", "bfloat16", 64, 32, 32, 2)
  _small_device(monkeypatch, small)
  spec = tmp_path / "s.yaml"
  spec.write_text("shapes:\n  - {m: 64, k: 32, n: 32, g: 2}\n  - {m: 4096, k: 32, n: 32, g: 2}\n")
  r = runner.invoke(app, ["sweep", str(spec), "-o", str(tmp_path / "out"), "--dry-run"])
  assert r.exit_code == 0, r.output
  assert "warning: skipped: " in r.output and "fwd pallas_gpu [4096,32]x[2,32,32] bfloat16: needs" in r.output
  assert "[64,32]x[2,32,32]" in r.output and "1 problem," in r.output


def test_kernels_need_a_group():
  import jax.numpy as jnp

  with pytest.raises(ValueError, match="at least one group"):
    kernels.ragged_dot(jnp.ones((8, 4)), jnp.ones((0, 4, 4)), jnp.zeros((0,), jnp.int32), backend="xla")
  with pytest.raises(ValueError, match="at least one group"):
    kernels.explain((8, 4), (0, 4, 4), jnp.float32)


def test_full_expert_weights_past_int32_are_not_refused_on_wide_indexing_backends():
  """DeepSeek-V3's rhs [256,7168,2048] has 3.76e9 elements: Pallas Triton (int64 offsets over
  4 GiB), Mosaic GPU (TMA) and XLA address it; megablox is still held to int32."""
  from ragtune.problems import shapes

  problems = shapes.expand(shapes.load_shape_set(Path(__file__).resolve().parents[2] / "shapes" / "moe.yaml"))
  big = [p for p in problems if p.g * p.k * p.n > limits.INT32_MAX]
  assert any(p.source.startswith("deepseek-v3:") for p in big) and any(
    p.source.startswith("llama-4-maverick:") for p in big
  )
  limits.check_fits(problems, memory=1 << 50)  # every backend moe.yaml sweeps: no refusal
  tpu = [dataclasses.replace(big[0], backend="pallas_tpu")]
  with pytest.raises(RagtuneError, match="rhs \\[g,k,n\\] has 3,758,096,384 elements, beyond pallas_tpu's int32"):
    limits.check_fits(tpu, memory=1 << 50)


@pytest.mark.parametrize(
  "cmd,where",
  [
    (["plan", "{shapes}", "-o", "{out}"], "{shapes}:3: not UTF-8 text (byte 0xe9 at column 6)"),
    (["sweep", "{shapes}", "-o", "{out}"], "{shapes}:3: not UTF-8 text (byte 0xe9 at column 6)"),
    (["bench", "{shapes}", "--csv", "{out}.csv"], "{shapes}:3: not UTF-8 text (byte 0xe9 at column 6)"),
    (["show", "{res}"], "{records}:2: not UTF-8 text (byte 0xe9 at column 8); --skip-bad-lines reads past"),
    (["export-lut", "{res}"], "{records}:2: not UTF-8 text (byte 0xe9 at column 8)"),
    (["verify", "{res}"], "{records}:2: not UTF-8 text (byte 0xe9 at column 8)"),
    (["verify", "{lut}"], "{lut}:2: corrupt LUT, not UTF-8 text (byte 0xe9 at column 14)"),
    (["bench", "{good}", "--lut", "{lut}", "--csv", "{out}.csv"], "{lut}:2: corrupt LUT, not UTF-8 text"),
  ],
)
def test_a_byte_that_is_not_utf8_is_named(tmp_path, cmd, where):
  """A shape file, records file or LUT saved in another encoding: its file, line and column, exit 2, nothing written."""
  names = {
    "shapes": str(tmp_path / "latin1.yaml"),
    "good": str(tmp_path / "good.yaml"),
    "res": str(tmp_path / "res"),
    "records": str(tmp_path / "res" / store.RECORDS),
    "lut": str(tmp_path / "lut.json"),
    "out": str(tmp_path / "out"),
  }
  Path(names["good"]).write_text(GOOD_SHAPE)
  Path(names["shapes"]).write_bytes(GOOD_SHAPE.encode() + b"# caf\xe9\n")
  (tmp_path / "res").mkdir()
  Path(names["records"]).write_bytes(WORKER_ROW.encode() + b'\n{"x": "\xe9"}\n')
  Path(names["lut"]).write_bytes(b'{"schema": "ragtune-lut",\n "note": "caf\xe9"}')
  before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  r = runner.invoke(app, [c.format(**names) for c in cmd])
  assert r.exit_code == 2, r.output
  assert where.format(**names) in _one_error_line(r)
  assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before, "files intact, nothing written"


def test_a_records_line_that_is_not_utf8_is_a_bad_line(tmp_path):
  path = tmp_path / store.RECORDS
  path.write_bytes(WORKER_ROW.encode() + b'\n{"x": "\xe9"}\n' + WORKER_ROW.encode() + b"\n")
  skipped: list[int] = []
  assert len(store.read_records(path, skipped=skipped)) == 2 and skipped == [2]


def test_options_are_checked_before_a_finished_sweep_is_called_complete(tmp_path, monkeypatch):
  """--devices foo on a finished folder said "complete", exit 0: every option is checked first."""
  from test_resume import _measure_all

  from ragtune.run import pool

  spec, out = tmp_path / "s.yaml", tmp_path / "D"
  spec.write_text("ops: [fwd]\nmax_candidates: 1\nshapes:\n  - {m: 24, k: 32, n: 32, g: 2}\n")
  monkeypatch.setattr(pool.Pool, "run", _measure_all)
  assert runner.invoke(app, ["sweep", str(spec), "-o", str(out)]).exit_code == 0
  monkeypatch.setattr(pool.Pool, "run", lambda self, tasks: pytest.fail("nothing may run"))
  assert "nothing to do" in runner.invoke(app, ["sweep", str(spec), "-o", str(out)]).output
  before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
  bad = {"foo": "--devices must be all, a count or indices like 0,2,5; got 'foo'", "99": "--devices 99: only"}
  for devices, says in bad.items():
    for dry_run in ([], ["--dry-run"]):
      r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--devices", devices, *dry_run])
      assert r.exit_code == 2, r.output
      assert says in _one_error_line(r)
  assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("value", ["abc", "-5", "0", "1.5e9"])
def test_a_bad_device_memory_variable_is_one_line_naming_it(tmp_path, value):
  """RAGTUNE_DEVICE_MEMORY is checked in the parent before any work; -5 was taken as the device's size."""
  spec = tmp_path / "s.yaml"
  spec.write_text(GOOD_SHAPE)
  for cmd in (["plan", str(spec), "-o", str(tmp_path / "out")], ["sweep", str(spec), "-o", str(tmp_path / "out")]):
    r = runner.invoke(app, cmd, env={limits.MEMORY_ENV: value})
    assert r.exit_code == 2, r.output
    assert (
      _one_error_line(r)
      == f"error: RAGTUNE_DEVICE_MEMORY='{value}': expected a positive whole number of bytes, e.g. 8000000000"
    )
  assert _tree(tmp_path) == ["s.yaml"]


def test_the_device_probe_reports_a_bad_device_memory_variable_in_one_line(monkeypatch):
  """The child that lists the devices sends the error back, not its traceback's last lines."""
  from ragtune.run import devices

  monkeypatch.setenv(limits.MEMORY_ENV, "abc")
  with pytest.raises(RagtuneError) as e:
    devices.probe_devices.__wrapped__()
  assert str(e.value) == "RAGTUNE_DEVICE_MEMORY='abc': expected a positive whole number of bytes, e.g. 8000000000"


@pytest.mark.parametrize("cmd", [["sweep"], ["sweep", "--dry-run"], ["plan"]])
def test_max_candidates_and_budget_are_not_given_together(tmp_path, cmd):
  """They are two searches; --max-candidates was silently ignored beside --budget."""
  spec = tmp_path / "s.yaml"
  spec.write_text(GOOD_SHAPE)
  r = runner.invoke(app, [*cmd, str(spec), "-o", str(tmp_path / "out"), "--max-candidates", "2", "--budget", "4"])
  assert r.exit_code == 2, r.output
  assert _one_error_line(r).startswith("error: --max-candidates 2 and --budget 4: give one")
  assert _tree(tmp_path) == ["s.yaml"]


def test_a_last_line_cut_off_mid_write_is_said_not_skipped_silently(tmp_path):
  """A sweep killed while writing a row leaves a last line with no newline: each reader reads
  the rest and says so (a bad line mid-file is still an error); the next sweep removes it."""
  res = tmp_path / "res"
  res.mkdir()
  records = res / store.RECORDS
  records.write_text(WORKER_ROW + "\n" + WORKER_ROW[:40])
  (tmp_path / "s.yaml").write_text(GOOD_SHAPE)
  before = records.read_bytes()
  said = f"warning: {records}:2: the last line was cut off mid-write (a sweep stopped while writing it) and is not read"
  for cmd in (
    ["show", str(res)],
    ["export-lut", str(res), "-o", str(tmp_path / "lut.json")],
    ["plan", str(tmp_path / "s.yaml"), "-o", str(res)],
  ):
    r = runner.invoke(app, cmd)
    assert r.exit_code == 0, r.output
    assert [line for line in r.output.splitlines() if line.startswith("warning:")] == [
      said + "; the next sweep that writes here removes it"
    ], r.output
  assert records.read_bytes() == before, "readers leave the file as it is"
  records.write_text(WORKER_ROW[:40] + "\n" + WORKER_ROW + "\n")
  assert "records.jsonl:1: corrupt record (not JSON)" in _one_error_line(runner.invoke(app, ["show", str(res)]))


def test_the_next_append_keeps_a_whole_last_line_and_cuts_a_torn_one(tmp_path):
  path = tmp_path / store.RECORDS
  row = json.loads(WORKER_ROW)
  for tail, kept in ((WORKER_ROW, 2), (WORKER_ROW[:40], 1)):
    path.write_text(WORKER_ROW + "\n" + tail)
    store.JsonLines(path).append(row)
    assert len(store.read_records(path)) == kept + 1 and path.read_text().endswith("}\n")


@pytest.mark.parametrize(
  "cmd,expected",
  [
    (["bench", "{good}", "--lut", "{good}"], "{good}: is a shape file, not a ragtune LUT or a folder holding one"),
    (["bench", "{good}", "--lut", "{records}"], "{records}: is a records file (records.jsonl), not a ragtune LUT"),
    (["show", "{readme}"], "{readme}: is a file of another kind, not a results folder or its records.jsonl"),
    (["show", "{readme}", "--skip-bad-lines"], "{readme}: is a file of another kind, not a results folder"),
    (["export-lut", "{readme}", "-o", "{out}.json"], "{readme}: is a file of another kind, not a results folder"),
    (["report", "{readme}", "-o", "{out}"], "{readme}: is a file of another kind, not a results folder"),
    (["verify", "{readme}"], "{readme}: not a ragtune LUT (a LUT is a JSON object; this file is not JSON)"),
    (["bench", "{good}", "--lut", "{readme}"], "{readme}: not a ragtune LUT (a LUT is a JSON object"),
  ],
)
def test_a_file_of_another_kind_is_named_as_what_it_is(tmp_path, cmd, expected):
  """Not "corrupt LUT, invalid JSON" for a shape file, nor "corrupt record" for a README."""
  names = {
    "good": str(tmp_path / "good.yaml"),
    "records": str(tmp_path / store.RECORDS),
    "readme": str(tmp_path / "README.md"),
    "out": str(tmp_path / "out"),
  }
  Path(names["good"]).write_text(GOOD_SHAPE)
  Path(names["records"]).write_text(WORKER_ROW + "\n")
  Path(names["readme"]).write_text("# ragtune\n\nTunes grouped matmul, {m, k, n}.\n")
  before = _tree(tmp_path)
  r = runner.invoke(app, [c.format(**names) for c in cmd])
  assert r.exit_code == 2, r.output
  line = _one_error_line(r)
  assert line.startswith(f"error: {expected.format(**names)}"), line
  assert _tree(tmp_path) == before


def test_a_corrupt_ragtune_lut_follows_the_runtimes_rule_in_bench_and_a_budgeted_search(tmp_path, monkeypatch, caplog):
  """bench, and sweep/plan --budget (which seed their search from the LUT a model here would
  load), meet RAGTUNE_LUT as a model does: by default an error led by RAGTUNE_LUT=; with
  RAGTUNE_LUT_ON_ERROR=warn, one warning, and no LUT."""
  import logging

  from ragtune.lut import bench as bench_mod

  spec, corrupt = tmp_path / "s.yaml", tmp_path / "corrupt.json"
  spec.write_text(GOOD_SHAPE)
  corrupt.write_text("{corrupt")
  said = f"RAGTUNE_LUT={corrupt}:1: corrupt LUT, invalid JSON"
  out = ["-o", str(tmp_path / "out")]
  for cmd in (
    ["bench", str(spec), "--csv", str(tmp_path / "b.csv")],
    ["sweep", str(spec), "--budget", "2", "--dry-run", *out],
    ["plan", str(spec), "--budget", "2", *out],
  ):
    r = runner.invoke(app, cmd, env={kernels.lut.ENV_VAR: str(corrupt)})
    assert r.exit_code == 2, r.output
    assert _one_error_line(r).startswith(f"error: {said}"), r.output
  assert _tree(tmp_path) == ["corrupt.json", "s.yaml"]
  monkeypatch.setenv(kernels.lut.ENV_VAR, str(corrupt))
  monkeypatch.setenv(kernels.lut.ON_ERROR_VAR, "warn")
  monkeypatch.setattr(kernels.lut, "_warned", set())
  with caplog.at_level(logging.WARNING, logger="kernels"):
    assert bench_mod.find_lut(None, kernels.lut.current_device_kind(), tmp_path) == (None, None)
    r = runner.invoke(app, ["plan", str(spec), "--budget", "2", *out])
  assert r.exit_code == 0, r.output
  assert [m.getMessage() for m in caplog.records if m.name == "kernels"] == [
    f"RAGTUNE_LUT_ON_ERROR=warn: {said} (Expecting property name enclosed in double quotes); using no LUT, "
    "the built-in heuristics run"
  ], "once per process"
