"""ragtune.capture and ragtune.tune on a small MoE's train and serving steps (tests/ragtune/moe_model.py):
the shapes, ops, calls a step and the router's own group sizes, under jax.grad, scan with
remat and shard_map; the file it writes; `ragtune shapes from-function`; and tune's LUT used
by the same step afterwards."""

import dataclasses
import functools
import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from typer.testing import CliRunner

import kernels
import ragtune
from ragtune import filekind
from ragtune.cli.app import app
from ragtune.errors import RagtuneError
from ragtune.problems import shapes

HERE = Path(__file__).parent
# The model as `ragtune shapes from-function moe_model:...` imports it (by name, from the folder it runs in).
_spec = importlib.util.spec_from_file_location("moe_model", HERE / "moe_model.py")
mm = sys.modules.setdefault("moe_model", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(mm)
M = mm.TOKENS * mm.TOP_K
UP, DOWN = (M, mm.HIDDEN, mm.FFN, mm.EXPERTS), (M, mm.FFN, mm.HIDDEN, mm.EXPERTS)


def router_sizes(p, x) -> list[int]:
  return [int(s) for s in np.asarray(mm.route(p, x)[2])]


def by_shape(spec) -> dict:
  return {(s.m, s.k, s.n, s.g): s for s in spec.shapes}


def problems(spec) -> set:
  return {(p.op, p.m, p.k, p.n, p.g, p.dtype, p.group_sizes) for p in shapes.expand(spec)}


def hand_written(tmp_path, text: str) -> shapes.ShapeSet:
  f = tmp_path / "hand.yaml"
  f.write_text(text)
  return shapes.load_shape_set(f)


@pytest.fixture(scope="module")
def params():
  return mm.init(), mm.tokens()


def test_train_step_equals_the_hand_written_set(params, tmp_path):
  """A lax train step: fwd and drhs of up (its lhs, the tokens, takes no gradient), fwd, dlhs
  and drhs of down, once a step, with the router's group sizes; the same problems as the shape
  file one would write by hand for the layer."""
  p, x = params
  spec = ragtune.capture(mm.train_step, p, x)
  sizes = router_sizes(p, x)
  assert spec.name == "train_step" and spec.ops == ["fwd", "dlhs", "drhs"]
  got = by_shape(spec)
  assert set(got) == {UP, DOWN}
  assert got[UP].ops == {"fwd": 1, "drhs": 1} and got[DOWN].ops == {"fwd": 1, "dlhs": 1, "drhs": 1}
  assert got[UP].group_sizes == sizes == got[DOWN].group_sizes
  assert got[UP].site == "moe_model.py:41 jax.lax.ragged_dot" and got[DOWN].site.startswith("moe_model.py:42 ")
  hand = hand_written(
    tmp_path,
    f"""dtype: float32
shapes:
  - {{m: {M}, k: {mm.HIDDEN}, n: {mm.FFN}, g: {mm.EXPERTS}, ops: [fwd, drhs], group_sizes: {sizes}}}
  - {{m: {M}, k: {mm.FFN}, n: {mm.HIDDEN}, g: {mm.EXPERTS}, ops: [fwd, dlhs, drhs], group_sizes: {sizes}}}
""",
  )
  assert problems(spec) == problems(hand)


def test_serving_step_is_forward_only(params):
  p, x = params
  spec = ragtune.capture(mm.serve_step, p, x)
  assert spec.ops == ["fwd"]
  assert {k: s.ops for k, s in by_shape(spec).items()} == {UP: {"fwd": 1}, DOWN: {"fwd": 1}}
  assert all(s.group_sizes == router_sizes(p, x) for s in spec.shapes)


def test_kernels_calls_are_found_and_their_inner_ops_are_not(params):
  """kernels.ragged_dot (here on XLA's op, whose ragged_dot_general are not sites of their own):
  its forward, and its backward where the step differentiates it."""
  p, x = params
  train = ragtune.capture(mm.train_step, p, x, rd=kernels.ragged_dot)
  assert {k: s.ops for k, s in by_shape(train).items()} == {
    UP: {"fwd": 1, "dlhs": 1, "drhs": 1},  # a custom_vjp's backward computes both
    DOWN: {"fwd": 1, "dlhs": 1, "drhs": 1},
  }
  assert all(s.site.endswith(" kernels.ragged_dot") and s.group_offset is None for s in train.shapes)
  serve = ragtune.capture(mm.serve_step, p, x, rd=kernels.ragged_dot)
  assert [s.ops for s in serve.shapes] == [{"fwd": 1}, {"fwd": 1}]
  assert all(s.group_sizes == router_sizes(p, x) for s in serve.shapes)


def test_megablox_gmm_is_found(params):
  from jax.experimental.pallas.ops.tpu.megablox import gmm

  p, x = params
  rd = functools.partial(gmm, tiling=(8, 16, 16), interpret=True)
  spec = ragtune.capture(mm.serve_step, p, x, rd=rd)
  assert set(by_shape(spec)) == {UP, DOWN} and all("megablox.gmm" in s.site for s in spec.shapes)
  assert all(s.group_sizes == router_sizes(p, x) for s in spec.shapes)


def test_scanned_layers_with_remat():
  """Three layers under lax.scan, rematerialized: each site runs once a layer, and the forward
  again in the backward; the routing is one of the layers' own."""
  p, x = mm.init(layers=3), mm.tokens()
  spec = ragtune.capture(mm.scanned_train_step, p, x)
  got = by_shape(spec)
  assert got[UP].ops == {"fwd": 6, "dlhs": 3, "drhs": 3}  # the residual sends a gradient to every layer's input
  assert got[DOWN].ops == {"fwd": 6, "dlhs": 3, "drhs": 3}
  layers, h = [], x
  for i in range(3):
    pl = jax.tree.map(lambda a: a[i], p)
    layers.append(router_sizes(pl, h))
    h = mm.layer(pl, h) + h
  assert got[UP].group_sizes in layers and got[DOWN].group_sizes in layers


def test_shard_map_expert_parallel_is_each_ranks_problem(params):
  """Under shard_map over 2 ranks, each holding half the experts (group_offset): m all rows,
  g the rank's experts, the sizes of its own groups, once a step (not once a rank)."""
  p, x = params
  mesh = jax.make_mesh((2,), ("x",))
  sizes = router_sizes(p, x)
  with jax.set_mesh(mesh):
    train = ragtune.capture(jax.jit(lambda p, x: jax.grad(lambda p: (mm.ep_layer(p, x, mesh) ** 2).mean())(p)), p, x)
    serve = ragtune.capture(jax.jit(lambda p, x: mm.ep_layer(p, x, mesh)), p, x)
  g = mm.EXPERTS // 2
  ranks = [sizes[r * g : (r + 1) * g] for r in range(2)]
  busiest = max(ranks, key=sum)  # the rank the step waits for
  assert sum(ranks[0]) != sum(ranks[1]), "a tie would be broken by the median largest group"
  for spec, ops in ((train, {"fwd": 1, "dlhs": 1, "drhs": 1}), (serve, {"fwd": 1})):
    assert set(by_shape(spec)) == {(M, mm.HIDDEN, mm.FFN, g), (M, mm.FFN, mm.HIDDEN, g)}
    for s in spec.shapes:
      assert s.ops == ops
      assert s.group_sizes == busiest and s.group_offset == ranks.index(busiest) * g


def test_shard_map_data_parallel_routes_per_rank(params):
  p, x = params
  mesh = jax.make_mesh((2,), ("x",))
  with jax.set_mesh(mesh):
    spec = ragtune.capture(jax.jit(lambda p, x: mm.dp_layer(p, x, mesh)), p, x)
  half = mm.TOKENS // 2
  ranks = [router_sizes(p, x[r * half : (r + 1) * half]) for r in range(2)]
  assert set(by_shape(spec)) == {(M // 2, mm.HIDDEN, mm.FFN, mm.EXPERTS), (M // 2, mm.FFN, mm.HIDDEN, mm.EXPERTS)}
  assert all(s.ops == {"fwd": 1} and s.group_sizes in ranks for s in spec.shapes)


def test_a_partly_manual_shard_map_counts_its_own_ranks():
  """shard_map manual over axis x (size 1) of a (d=2, x=1) mesh runs its body once a step, not
  once a device: three scanned layers are three calls a step."""
  from jax.sharding import AxisType
  from jax.sharding import PartitionSpec as P

  mesh = jax.make_mesh((2, 1), ("d", "x"), axis_types=(AxisType.Auto,) * 2)
  scanned = lambda p, x: jax.lax.scan(lambda h, pl: (mm.layer(pl, h) + h, None), x, p)[0]
  with jax.set_mesh(mesh):
    step = jax.jit(lambda p, x: jax.shard_map(scanned, mesh=mesh, in_specs=P(), out_specs=P(), axis_names={"x"})(p, x))
    spec = ragtune.capture(step, mm.init(layers=3), mm.tokens())
  assert [s.ops for s in spec.shapes] == [{"fwd": 3}, {"fwd": 3}]


def test_expert_parallel_gradients_are_lax_s(params):
  """kernels.ragged_dot under shard_map with the rows on every rank (lhs the same there): the
  gradient of the rows is the sum of the ranks' (psum), as lax's unsharded layer has it."""
  p, x = params
  mesh = jax.make_mesh((2,), ("x",))
  with jax.set_mesh(mesh):
    got = jax.jit(jax.grad(lambda p, x: (mm.ep_layer(p, x, mesh) ** 2).mean(), argnums=(0, 1)))(p, x)
  want = jax.grad(lambda p, x: (mm.layer(p, x) ** 2).mean(), argnums=(0, 1))(p, x)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_a_ragged_dot_general_that_is_not_a_grouped_matmul_is_said(params):
  p, x = params
  dims = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(([2], [2]), ([0], [1])), lhs_ragged_dimensions=[1], rhs_group_dimensions=[0]
  )

  def batched(p, x):  # a batch dim: not the [m,k] x [g,k,n] form ragtune tunes
    lhs = jnp.stack([x, x])
    rhs = jnp.stack([p["up"][:, :, :4]] * 2, axis=1)
    return jax.lax.ragged_dot_general(lhs, rhs, jnp.array([10, 14] + [0] * 6, jnp.int32), dims)

  said = []
  with pytest.raises(RagtuneError, match="no grouped matmul to tune .*not a plain grouped matmul"):
    ragtune.capture(batched, p, x, say=said.append)
  assert said and "left out" in said[0]
  said.clear()
  spec = ragtune.capture(lambda p, x: (batched(p, x), mm.serve_step(p, x)), p, x, say=said.append)
  assert len(spec.shapes) == 2 and len(said) == 1


def test_how_the_step_calls_it_is_kept(params):
  """transpose_rhs ([g,n,k] weights) and out_dtype (preferred_element_type) of a bfloat16 call;
  a forward a custom_vjp's backward computes is a forward (k and n swapped), not a dlhs."""
  p, x = params
  dims = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(([1], [2]), ([], [])), lhs_ragged_dimensions=[0], rhs_group_dimensions=[0]
  )

  def transposed(p, x):
    _, order, gs = mm.route(p, x)
    xs = jnp.repeat(x, mm.TOP_K, axis=0)[order].astype(jnp.bfloat16)
    w = jnp.swapaxes(p["up"], 1, 2).astype(jnp.bfloat16)  # [g, n, k]
    return jax.lax.ragged_dot_general(xs, w, gs, dims, preferred_element_type=jnp.float32)

  (s,) = ragtune.capture(transposed, p, x).shapes
  assert (s.m, s.k, s.n, s.g, s.transpose_rhs, s.out_dtype) == (*UP, True, "float32")
  assert s.dtype is None  # the set's dtype, bfloat16

  @jax.custom_vjp
  def f(xs, w, gs):
    return jax.lax.ragged_dot(xs, w, gs)

  def f_bwd(res, ct):
    xs, w, gs = res
    again = jax.lax.ragged_dot(xs, w, gs)  # the forward once more: under the transpose, but no dlhs
    back = jax.lax.ragged_dot(ct * again, jnp.swapaxes(w, 1, 2), gs)  # [m,n] x [g,n,k]: the dlhs
    return back, jnp.zeros_like(w), None

  f.defvjp(lambda xs, w, gs: (f(xs, w, gs), (xs, w, gs)), f_bwd)

  def step(p, x):
    _, order, gs = mm.route(p, x)
    xs = jnp.repeat(x, mm.TOP_K, axis=0)[order]
    return jax.grad(lambda xs: f(xs, p["up"], gs).sum())(xs)

  (s,) = ragtune.capture(step, p, x).shapes
  assert ((s.m, s.k, s.n, s.g), s.ops) == (UP, {"fwd": 2, "dlhs": 1})


def test_errors_name_what_went_wrong(params):
  p, x = params

  def raises(p, x):
    raise ValueError("the router diverged")

  with pytest.raises(RagtuneError, match="raises raised while tracing: ValueError: the router diverged"):
    ragtune.capture(raises, p, x)
  with pytest.raises(RagtuneError, match="no grouped matmul to tune"):
    ragtune.capture(lambda p, x: x @ p["router"], p, x)
  with pytest.raises(RagtuneError, match="serve_step raised while tracing: TypeError: .*class 'str'"):
    ragtune.capture(mm.serve_step, p, "tokens")  # a string is passed as it is, as a static argument

  def never(p, x):  # a branch not taken: its call reports no sizes
    return jax.lax.cond(x.sum() > 1e9, lambda: mm.layer(p, x), lambda: x)

  with pytest.raises(RagtuneError, match="did not run on these arguments"):
    ragtune.capture(never, p, x)


def test_write_is_a_shape_file_of_the_same_problems(params, tmp_path):
  p, x = params
  spec = ragtune.capture(mm.train_step, p, x)
  f = spec.write(tmp_path / "captured.yaml")
  lines = f.read_text().splitlines()
  assert lines[0] == filekind.CAPTURED_MARK and lines[1].startswith("# From ") and "train_step" in lines[1]
  assert filekind.classify(f) == filekind.Kind.CAPTURED
  again = shapes.load_shape_set(f)
  assert problems(again) == problems(spec) and [s.ops for s in again.shapes] == [s.ops for s in spec.shapes]
  spec.write(f)  # its own file: replaced
  other = tmp_path / "hand.yaml"
  other.write_text("shapes:\n  - {m: 8, k: 8, n: 8, g: 2}\n")
  with pytest.raises(RagtuneError, match="exists and is a shape file, not a shape file written by ragtune.capture"):
    spec.write(other)
  assert other.read_text() == "shapes:\n  - {m: 8, k: 8, n: 8, g: 2}\n"


def test_from_function_cli(monkeypatch, tmp_path):
  monkeypatch.chdir(HERE)
  monkeypatch.setattr(sys, "path", list(sys.path))  # the command puts the folder it runs in first
  runner = CliRunner()
  out = tmp_path / "moe.yaml"
  res = runner.invoke(app, ["shapes", "from-function", "moe_model:make_train", "-o", str(out)])
  assert res.exit_code == 0, res.output
  assert f"wrote {out}: 2 problems, 5 calls a step" in res.output
  assert problems(shapes.load_shape_set(out)) == problems(ragtune.capture(mm.train_step, mm.init(), mm.tokens()))
  res = runner.invoke(app, ["shapes", "from-function", "moe_model:serve_step", "--args", "moe_model:step_args"])
  assert res.exit_code == 0 and res.output.startswith(filekind.CAPTURED_MARK) and "ops: {fwd: 1}" in res.output
  for argv, said in [
    (["nowhere_model:make"], "cannot import 'nowhere_model' (ModuleNotFoundError"),
    (["moe_model:missing"], "moe_model has no function 'missing'"),
    (["moe_model:step_args"], "it must return (step, args)"),
    (["moe_model:init", "--args", "moe_model:step_args"], "init raised while tracing"),
    (["no-colon"], "must look like module:function"),
  ]:
    res = runner.invoke(app, ["shapes", "from-function", *argv])
    assert res.exit_code == 2 and said in res.output, (argv, res.output)
  (tmp_path / "hand.yaml").write_text("shapes:\n  - {m: 8, k: 8, n: 8, g: 2}\n")
  res = runner.invoke(app, ["shapes", "from-function", "moe_model:make_train", "-o", str(tmp_path / "hand.yaml")])
  assert res.exit_code == 2 and "use --force" in res.output


def test_tune_then_the_step_uses_its_lut(params, tmp_path):
  """tune on the CPU: capture, an interpreted sweep, verify, export; the same step then runs
  the LUT's configs (explain: lut-exact), and a second tune resumes with nothing to measure."""
  p, x = params
  rd = functools.partial(kernels.ragged_dot, backend="pallas_gpu")
  said = []
  lut = ragtune.tune(mm.train_step, p, x, rd=rd, budget=1, out=tmp_path, say=said.append)
  assert (tmp_path / "train_step.shapes.yaml").is_file() and (tmp_path / "cpu.json").is_file()
  assert {(e.op, e.m, e.k, e.n, e.g) for e in lut.entries() if e.backend == "pallas_gpu"} == {
    (op, *shape) for op in ("fwd", "dlhs", "drhs") for shape in (UP, DOWN)
  }
  assert any(line.startswith("verified ") for line in said)
  kernels.load_lut(tmp_path)  # the autouse fixture _no_lut unloads it
  for shape in (UP, DOWN):
    m, k, n, g = shape
    choices = kernels.explain((m, k), (g, k, n), jnp.float32, backend="pallas_gpu")
    assert {c.source for c in choices.values()} == {"lut-exact"}, choices
  grads, want = mm.train_step(p, x, rd=rd), mm.train_step(p, x)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  said.clear()
  again = ragtune.tune(mm.train_step, p, x, rd=rd, budget=1, out=tmp_path, say=said.append)
  assert not any(line.startswith(("sweep: ", "[1/")) for line in said), said  # nothing measured or verified again
  assert "as " in said[0] and "verified when exported" in said[-1] and again.entries() == lut.entries()


def test_calls_a_step_weigh_the_budget_and_the_report(tmp_path):
  """A captured file's {op: calls}: each problem's calls (1 elsewhere), kept in its records;
  a budget shared by them within [budget/2, 2 x budget]; report's step time."""
  import pandas as pd

  from ragtune.candidates.search_strategy import weighted_budgets
  from ragtune.records import report, store

  spec = hand_written(
    tmp_path,
    """shapes:
  - {m: 64, k: 32, n: 16, g: 4, ops: {fwd: 6, drhs: 3}}
  - {m: 64, k: 16, n: 32, g: 4, ops: [fwd]}
""",
  )
  calls = {(p.op, p.k): p.calls for p in shapes.expand(spec)}
  assert calls == {("fwd", 32): 6, ("drhs", 32): 3, ("fwd", 16): 1}
  assert weighted_budgets({"a": 6, "b": 3, "c": 1}, 8) == {"a": 14, "b": 7, "c": 4}  # 8 x 1.8, 0.9 and 0.3 (to 0.5)
  assert weighted_budgets({"a": 2, "b": 2}, 8) == {"a": 8, "b": 8}
  assert weighted_budgets({"a": 6, "b": 1}, None) == {"a": None, "b": None}
  assert weighted_budgets({"a": 9, "b": 1}, 1) == {"a": 2, "b": 1}  # never below one candidate
  from types import SimpleNamespace

  from ragtune.run import plan

  budgets = plan.budgets(shapes.expand(spec), SimpleNamespace(budget=8))  # what plan and sweep give each
  assert sorted(budgets.values()) == [4, 7, 14]
  p = next(p for p in shapes.expand(spec) if p.calls == 6)
  row = store.Record(problem=p, config=None, baseline="xla", status="ok", device_kind="cpu", time_s=0.002)
  assert row.to_dict()["calls"] == 6 and store.Record.from_dict(row.to_dict()).problem == p
  one = dataclasses.replace(p, calls=1)
  assert "calls" not in store.Record(problem=one, config=None, baseline="xla", status="ok", device_kind="cpu").to_dict()
  best = pd.DataFrame(
    [
      {"op": "fwd", "m": 64, "k": 32, "n": 16, "g": 4, "dtype": "bfloat16", "best_ms": 2.0, "xla_ms": 3.0, "calls": 6},
      {"op": "fwd", "m": 64, "k": 32, "n": 16, "g": 4, "dtype": "bfloat16", "best_ms": 1.0, "xla_ms": 3.0, "calls": 6},
      {"op": "drhs", "m": 64, "k": 32, "n": 16, "g": 4, "dtype": "bfloat16", "best_ms": 4.0, "xla_ms": 5.0, "calls": 3},
    ]
  )
  assert report.step_totals(best) == (6 * 1.0 + 3 * 4.0, 6 * 3.0 + 3 * 5.0, 2, 0)  # the faster backend of each
  assert report.step_totals(best.assign(calls=1)) is None
  missing = best.assign(best_ms=[2.0, 1.0, float("nan")])  # drhs: no correct config
  assert report.step_totals(missing) == (6 * 1.0, 6 * 3.0, 1, 1)
