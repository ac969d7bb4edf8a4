"""Default budgets derived from the device's cost table (``budget/defaults.py``,
``MethodOptions.cost_table``, ``--cost-table``): the rule against a brute-force twin, the
shipped gains, where the derivation applies and where the fixed defaults stay, and that a
derived budget changes the speed only (greedy outputs equal ``ar``)."""

import dataclasses
import json
import random

import pytest

from specgraft.api import SpecDecoder
from specgraft.budget.costs import CostTable
from specgraft.methods import DEFAULT_BUDGETS, METHODS, GraftOptions, MethodOptions, derived_budget, fixed_budget, method_budget
from specgraft.budget.acceptance import BudgetGains, GAINS_PATH, budget_gains, gains_meta
from specgraft.budget.defaults import TIE, choose, derive_budget, verify_cost

from tests.helpers.models import tiny_llama, tiny_tokenizer

CPU_TABLE = {1: {1: 0.382, 2: 0.426, 4: 0.541, 8: 0.563, 16: 0.815}}  # the shipped 1.5B table, batch size 1
GPU_TABLE = {1: {1: 0.020, 16: 0.0205, 32: 0.021, 64: 0.023}}  # 64 rows cost ~1.15 steps


def table(tmp_path, seconds, device="cpu") -> str:
    path = tmp_path / f"m-{device}.json"
    CostTable("m", device, seconds).save(path)
    return str(path)


def brute_force(costs: CostTable, gains: BudgetGains, tie: float = TIE) -> int:
    """Every budget's predicted rate, drafting time included and each forward costed at no less
    than any smaller measured row count's; the smallest budget within ``tie`` of the best."""
    step = costs.cost(1, 1)
    rates = {
        k: e / (max(costs.cost(1, m) for m in [1 + n, *(r for r in costs.seconds[1] if r <= 1 + n)]) + d * step)
        for k, e, n, d in zip(gains.budgets, gains.tokens_per_step, gains.nodes_per_step, gains.draft_steps)
    }
    return min(k for k, r in rates.items() if r >= max(rates.values()) * (1 - tie))


@pytest.mark.parametrize("seed", range(30))
def test_choice_matches_the_rule_on_random_gains(seed):
    rng = random.Random(seed)
    budgets = sorted(rng.sample([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 60], rng.randint(1, 6)))
    tokens, nodes, e = [], [], 1.0
    for k in budgets:
        e += rng.uniform(0.0, 0.6)
        tokens.append(e)
        nodes.append(rng.uniform(0.2, 1.0) * k)
    draft = tuple(rng.choice([0.0, 0.01, 0.4, 1.5]) for _ in budgets)
    gains = BudgetGains("x", tuple(budgets), tuple(tokens), tuple(nodes), draft)
    # per-row costs that may dip (a noisy measurement), which the rule must not follow down
    rows = {n: 0.3 + rng.uniform(0.0, 0.05) * n * rng.uniform(0.7, 1.0) for n in (1, 2, 4, 8, 16, 32, 64)}
    costs = CostTable("m", "cpu", {1: rows})
    assert derive_budget("x", costs, gains).budget == brute_force(costs, gains)


def test_a_device_whose_rows_are_free_gets_a_larger_budget():
    gains = BudgetGains("x", (1, 2, 4, 8, 16, 32), (1.4, 1.6, 1.9, 2.2, 2.4, 2.8), (1, 2, 4, 8, 16, 32))
    cpu = derive_budget("x", CostTable("m", "cpu", CPU_TABLE), gains)
    gpu = derive_budget("x", CostTable("m", "cuda", GPU_TABLE), gains)
    assert cpu.budget < gpu.budget == 32
    assert gpu.speedup > cpu.speedup > 1.0


def test_verify_cost_never_falls_with_more_rows():
    t = CostTable("m", "cpu", {1: {1: 0.16, 2: 0.171, 4: 0.168, 8: 0.198}})  # 4 rows measured below 2
    costs = [verify_cost(t, n / 4) for n in range(4, 40)]
    assert costs == sorted(costs) and verify_cost(t, 4) == verify_cost(t, 2) == 0.171


def test_drafting_time_favours_larger_budgets():
    """A fixed drafting cost per step makes each verified row a smaller share of the step."""
    free = BudgetGains("x", (4, 8), (3.7, 4.2), (3.9, 7.8))
    slow = BudgetGains("x", (4, 8), (3.7, 4.2), (3.9, 7.8), draft_steps=(0.6, 0.6))
    t = CostTable("m", "cpu", {1: {1: 0.16, 4: 0.168, 8: 0.198, 16: 0.231}})
    assert derive_budget("x", t, free).budget == 4 and derive_budget("x", t, slow).budget == 8


def test_the_fixed_default_stays_unless_clearly_beaten():
    gains = BudgetGains("x", (4, 8, 16), (1.40, 1.44, 1.45), (0.9, 1.2, 1.5))
    near = CostTable("m", "cpu", {1: {1: 0.16, 2: 0.17, 4: 0.17, 8: 0.20, 16: 0.23}})
    assert derive_budget("x", near, gains, anchor=16).budget == 16, "16 predicts within TIE of the best"
    assert derive_budget("x", near, gains).budget < 16
    dear = CostTable("m", "cpu", {1: {1: 0.16, 2: 0.30, 4: 0.40}})
    assert derive_budget("x", dear, gains, anchor=16).budget == 4


def test_ties_go_to_the_smaller_budget():
    assert choose([1, 8], [1.0, 1.0 + TIE / 2]) == 0 and choose([1, 8], [1.0, 1.0 + 2 * TIE]) == 1
    assert choose([8, 1], [1.0, 0.995]) == 1, "budgets need not come sorted"
    flat = BudgetGains("x", (1, 4, 16), (1.3, 1.3, 1.3), (0.5, 0.5, 0.5))  # larger caps never filled
    assert derive_budget("x", CostTable("m", "cpu", CPU_TABLE), flat).budget == 1


def test_shipped_gains_cover_the_methods_they_name():
    data = json.loads(GAINS_PATH.read_text())
    assert {"model", "draft_model", "preset", "prompts"} <= set(gains_meta())
    assert {spec.gains_from for spec in METHODS.values() if spec.gains_from} <= set(data["methods"])
    for name, row in data["methods"].items():
        assert name in METHODS
        assert row["budgets"] == sorted(set(row["budgets"])) and len(row["budgets"]) >= 2
        gains = budget_gains(name)
        assert gains.draft_steps is not None
        for k, e, n, d in zip(gains.budgets, gains.tokens_per_step, gains.nodes_per_step, gains.draft_steps):
            assert 1.0 <= e <= 1.0 + k and 0.0 <= n <= k and d >= 0.0
            if METHODS[name].needs_draft_model:
                assert d > 0.05, "a draft model's forwards cost a share of a target step"
    assert budget_gains("ar") is None and budget_gains("reader") is None
    root, graft = budget_gains("graft-root", METHODS["graft-root"].gains_from), budget_gains("graft")
    assert (root.budgets, root.tokens_per_step, root.nodes_per_step) == (graft.budgets, graft.tokens_per_step, graft.nodes_per_step)


def test_method_budget_uses_the_table_where_it_applies(tmp_path):
    cpu, gpu = table(tmp_path, CPU_TABLE), table(tmp_path, GPU_TABLE, "cuda")
    fixed = MethodOptions(cost_table=None)
    for name in METHODS:
        assert method_budget(name, fixed) == fixed_budget(name, fixed)
        assert method_budget(name, MethodOptions()) == fixed_budget(name, fixed), "an unresolved 'auto' keeps the fixed defaults"
    meta = gains_meta()
    # the tree the draft-model gains were measured with
    unextended = GraftOptions(extend=meta.get("extend", 0), stop_min=meta.get("stop_min", 0.0))
    for name in ("recycling", "ptd", "draft-tree", "graft-prune"):
        on_cpu = derived_budget(name, MethodOptions(cost_table=cpu, graft=unextended))
        on_gpu = derived_budget(name, MethodOptions(cost_table=gpu, graft=unextended))
        assert on_cpu is not None and on_gpu is not None and on_cpu.budget <= on_gpu.budget
        assert method_budget(name, MethodOptions(cost_table=cpu, graft=unextended)) == on_cpu.budget
        assert on_cpu.table == "m-cpu.json"
    # where the fixed default stays
    for name, options in [
        ("ar", MethodOptions(cost_table=cpu)),
        ("reader", MethodOptions(cost_table=cpu)),
        # prompt lookup: its cut decides each step's rows, the budget is a cap
        ("pld", MethodOptions(cost_table=cpu)),
        ("adapld", MethodOptions(cost_table=cpu)),
        ("adapld-full", MethodOptions(cost_table=cpu)),
        ("graft", MethodOptions(cost_table=cpu, graft=GraftOptions(preset="gpu"))),
        ("draft-tree", MethodOptions(cost_table=cpu, graft=GraftOptions(depth=6))),
        # another extension or early stop than the gains were measured with
        ("graft", MethodOptions(cost_table=cpu, graft=dataclasses.replace(unextended, extend=unextended.extend + 1))),
        ("draft-tree", MethodOptions(cost_table=cpu, graft=dataclasses.replace(unextended, stop_min=0.5 - unextended.stop_min / 2))),
        # ... or another number of nodes expanded per layer
        ("draft-tree", MethodOptions(cost_table=cpu, graft=dataclasses.replace(unextended, expand=1))),
        ("graft-prune", MethodOptions(cost_table=cpu, graft=GraftOptions(calibration="benchmarks/calib/graft-int8.json"))),
    ]:
        assert derived_budget(name, options) is None
        assert method_budget(name, options) == fixed_budget(name, options)
    assert fixed_budget("pld", fixed) == DEFAULT_BUDGETS["pld"] and fixed_budget("graft", MethodOptions(graft=GraftOptions(preset="gpu"))) == 60


def test_a_bad_table_path_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="not a specgraft cost table"):
        method_budget("pld", MethodOptions(cost_table=str(bad)))


def test_decoder_resolves_auto_and_stays_exact(tmp_path, monkeypatch):
    """``auto`` finds no table for a tiny model (fixed defaults); a table given by path sets the
    decoder's default budget to the derived one, and greedy outputs still equal ``ar``."""
    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path / "cache"))
    model, tok = tiny_llama(), tiny_tokenizer()
    auto = SpecDecoder(model, tok, method="recycling", progress=False)
    assert auto.options.cost_table is None and auto.default_budget == DEFAULT_BUDGETS["recycling"]
    dear = {1: {1: 0.3, 2: 0.6, 64: 20.0}}  # every row costs a whole step: fewer nodes than the fixed 4
    want = derive_budget("recycling", CostTable("m", "cpu", dear), anchor=DEFAULT_BUDGETS["recycling"]).budget
    assert want < DEFAULT_BUDGETS["recycling"]
    dec = SpecDecoder(model, tok, method="recycling", options=MethodOptions(cost_table=table(tmp_path, dear)), progress=False)
    assert dec.default_budget == want and dec.resolved_config(SpecDecoder.make_config())["generation"]["budget"] == want
    ar = dec.with_method("ar")
    assert dec.with_method("pld").options.cost_table == dec.options.cost_table
    assert dec.with_method("pld").default_budget == DEFAULT_BUDGETS["pld"]  # prompt lookup keeps its cap
    rng = random.Random(0)
    for _ in range(5):
        prompt = [rng.randrange(3, 64) for _ in range(rng.randint(3, 12))] * 2
        assert dec.generate(prompt, max_new_tokens=24).tokens == ar.generate(prompt, max_new_tokens=24).tokens


def test_user_table_in_the_cache_is_found(tmp_path, monkeypatch):
    """A table ``specgraft profile`` wrote for this model, device and thread count is the one ``auto`` reads."""
    import torch

    from specgraft.budget.costs import table_name, user_cost_dir

    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path))
    model, tok = tiny_llama(), tiny_tokenizer()
    probe = SpecDecoder(model, tok, method="ar", progress=False)
    path = user_cost_dir() / table_name(probe.target.name, "cpu", torch.get_num_threads())
    CostTable(probe.target.name, "cpu", GPU_TABLE).save(path)
    dec = SpecDecoder(model, tok, method="recycling", progress=False)
    assert dec.options.cost_table == str(path)
    assert dec.default_budget == derived_budget("recycling", dec.options).budget


def test_shipped_gpu_tables_are_found_and_give_gpu_budgets():
    """The tables measured on an H200 for the catalog models (``benchmarks/experiments/gpu/NOTES.md``)
    serve any CUDA device without ``specgraft profile``, and from them every method with
    measured gains gets at least the budget the shipped CPU table gives it."""
    from specgraft.budget.costs import SHIPPED_DIR, find_cost_table

    for model in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"):
        found = find_cost_table(f"/anywhere/{model}", "cuda:0")
        assert found == SHIPPED_DIR / f"{model}-cuda.json"
        costs = CostTable.load(found)
        assert costs.device.startswith("cuda") and costs.cost(1, 64) < 2 * costs.cost(1, 1), "a GPU verifies 64 rows for ~one step"
    cpu, gpu = find_cost_table("qwen2.5-coder-1.5b-instruct", "cpu", 2), find_cost_table("qwen2.5-coder-1.5b-instruct", "cuda")
    unextended = GraftOptions(extend=gains_meta().get("extend", 0), stop_min=gains_meta().get("stop_min", 0.0))
    for name in ("recycling", "ptd", "draft-tree"):
        on_cpu = derived_budget(name, MethodOptions(cost_table=str(cpu), graft=unextended))
        on_gpu = derived_budget(name, MethodOptions(cost_table=str(gpu), graft=unextended))
        assert on_cpu is not None and on_gpu is not None and on_gpu.budget >= on_cpu.budget, name


def test_cost_tables_are_found_for_the_cpu_kind(tmp_path, monkeypatch):
    """A user's table (this machine's) first; then the shipped table of this CPU's kind (AVX-512
    or not) at this thread count, the generic shipped one, and the same at any thread count."""
    import json

    from specgraft.budget import costs as profile
    from specgraft import machine

    user, shipped = tmp_path / "user", tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(profile, "SHIPPED_DIR", shipped)
    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path))  # user_cost_dir() = tmp_path / "costs"
    user = tmp_path / "costs"

    def put(folder, name):
        folder.mkdir(exist_ok=True)
        (folder / name).write_text(json.dumps({"model": "m", "device": "cpu", "seconds": {"1": {"1": 1.0}}}))
        return folder / name

    generic = put(shipped, "m-cpu-t2.json")
    assert profile.find_cost_table("m", "cpu", 2, kind="avx512") == generic, "no table of the kind: the generic one"
    wide = put(shipped, "m-cpu-avx512-t2.json")
    assert profile.find_cost_table("m", "cpu", 2, kind="avx512") == wide
    assert profile.find_cost_table("m", "cpu", 2, kind=None) == generic
    assert profile.find_cost_table("m", "cpu", 4, kind="avx512") == wide, "another thread count, the kind still first"
    assert profile.find_cost_table("m", "cpu", 4, kind=None) == generic
    assert profile.find_cost_table("m", "cuda", kind="avx512") is None, "GPUs have no CPU kind"
    mine = put(user, "m-cpu-t2.json")
    assert profile.find_cost_table("m", "cpu", 2, kind="avx512") == mine, "the user's own table wins"
    monkeypatch.setattr(machine, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert machine.cpu_kind() == "avx512"
    monkeypatch.setattr(machine, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert machine.cpu_kind() is None and profile.find_cost_table("m", "cpu", 4) == mine


def test_an_amx_build_of_llamacpp_reads_its_own_tables_first(tmp_path, monkeypatch):
    """llama.cpp built with AMX costs rows differently from its AVX-512 kernels: its ``amx``
    table first, then the ``avx512`` one; torch's tables and a build without AMX ignore ``amx``."""
    import json

    from specgraft.budget import costs as profile
    from specgraft import machine

    monkeypatch.setattr(profile, "SHIPPED_DIR", tmp_path)
    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(machine, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "amx_int8"}))
    for name in ("m-llamacpp-avx512-t2.json", "m-llamacpp-amx-t2.json", "m-cpu-avx512-t2.json"):
        (tmp_path / name).write_text(json.dumps({"model": "m", "device": "llamacpp", "seconds": {"1": {"1": 1.0}}}))
    monkeypatch.setattr(machine, "llamacpp_amx", lambda: True)
    monkeypatch.setattr(machine, "llamacpp_amx_rows", lambda: True)
    assert machine.cost_kinds("llamacpp") == ["amx-rows", "amx", "avx512"], "the small-batch kernels' table first"
    assert profile.find_cost_table("m", "llamacpp", 2).name == "m-llamacpp-amx-t2.json", "none for them: stock AMX's"
    (tmp_path / "m-llamacpp-amx-rows-t2.json").write_text("{}")
    assert profile.find_cost_table("m", "llamacpp", 2).name == "m-llamacpp-amx-rows-t2.json"
    (tmp_path / "m-llamacpp-amx-rows-t2.json").unlink()
    monkeypatch.setattr(machine, "llamacpp_amx_rows", lambda: False)
    assert machine.cost_kinds("llamacpp") == ["amx", "avx512"] and machine.cost_kinds("cpu") == ["avx512"]
    assert profile.find_cost_table("m", "llamacpp", 2).name == "m-llamacpp-amx-t2.json"
    assert profile.find_cost_table("m", "cpu", 2).name == "m-cpu-avx512-t2.json"
    (tmp_path / "m-llamacpp-amx-t2.json").unlink()
    assert profile.find_cost_table("m", "llamacpp", 2).name == "m-llamacpp-avx512-t2.json", "no amx table: the avx512 one"
    (tmp_path / "m-llamacpp-amx-t2.json").write_text("{}")
    monkeypatch.setattr(machine, "llamacpp_amx", lambda: False)
    assert profile.find_cost_table("m", "llamacpp", 2).name == "m-llamacpp-avx512-t2.json"


def test_shipped_cpu_tables_of_both_kinds(tmp_path, monkeypatch):
    """The two shipped CPU tables of the 1.5B: measured on the CPU kind their names say, and the
    AVX-512 one's extra rows cost less (so its budgets are at least the AVX2 one's)."""
    from specgraft.budget.costs import SHIPPED_DIR, find_cost_table

    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path))  # no table of this machine's

    avx2 = find_cost_table("qwen2.5-coder-1.5b-instruct", "cpu", 2, kind=None)
    wide = find_cost_table("qwen2.5-coder-1.5b-instruct", "cpu", 2, kind="avx512")
    assert avx2 == SHIPPED_DIR / "qwen2.5-coder-1.5b-instruct-cpu-t2.json"
    assert wide == SHIPPED_DIR / "qwen2.5-coder-1.5b-instruct-cpu-avx512-t2.json"
    narrow_costs, wide_costs = CostTable.load(avx2), CostTable.load(wide)
    assert wide_costs.meta["cpu_kind"] == "avx512" and wide_costs.meta["cpu_id"]["vector"].startswith("avx512")
    assert wide_costs.cost(1, 16) / wide_costs.cost(1, 1) < narrow_costs.cost(1, 16) / narrow_costs.cost(1, 1)
    for name in ("recycling", "ptd", "draft-tree", "graft-prune"):
        assert method_budget(name, MethodOptions(cost_table=str(wide))) >= method_budget(name, MethodOptions(cost_table=str(avx2))), name
