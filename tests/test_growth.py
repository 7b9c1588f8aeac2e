"""Where to grow (dalign_repro.studies.growth): the inserted block, the predictors, the scores and the verdict."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats
from torch import nn

from dalign_repro.studies import growth
from dalign_repro.config import PROFILES
from dalign_repro.experiments import growth as experiment
from dalign_core.capture.hooks import activation_gradients


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU())

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def _toy(seed=0, width=16, blocks=3):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, width), *[Block(width) for _ in range(blocks)], nn.Linear(width, 4)).eval()
    x = torch.randn(256, 8)
    y = (x @ torch.randn(8, 4)).argmax(1)
    batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)]
    return model, batches


def _snapshot(model):
    return ({k: v.clone() for k, v in model.state_dict().items()}, [p.requires_grad for p in model.parameters()],
            model.training, sum(len(m._forward_hooks) for m in model.modules()))


def _same(model, snapshot):
    state, flags, training, hooks = snapshot
    now = model.state_dict()
    return (all(torch.equal(now[k], v) for k, v in state.items()) and flags == [p.requires_grad for p in
            model.parameters()] and model.training == training
            and hooks == sum(len(m._forward_hooks) for m in model.modules()))


def test_inserted_block_is_a_no_op_before_training_and_the_model_is_restored_bit_for_bit():
    model, batches = _toy()
    x = batches[0][0]
    before = model(x)
    snapshot = _snapshot(model)
    block = growth.block_for(model, "2", batches[0], seed=3)
    assert torch.count_nonzero(block.w2) == 0 and torch.count_nonzero(block.w1) > 0
    with growth.inserted(model, "2", block):
        assert torch.equal(model(x), before)  # z + 0 = z exactly
        assert not any(p.requires_grad for p in model.parameters())
    assert _same(model, snapshot)
    result = growth.grow(model, "2", iter(batches * 10), batches, [5, 20], lr=1e-2, seed=3)
    assert _same(model, snapshot) and torch.equal(model(x), before)
    assert set(result["gain"]) == {5, 20}
    with torch.no_grad():
        own = float(nn.functional.cross_entropy(model(torch.cat([b[0] for b in batches])),
                                                torch.cat([b[1] for b in batches])))
    assert result["before"] == pytest.approx(own, rel=1e-6)
    # trained on the very examples it is scored on, the block must lower their loss
    assert result["gain"][20] > 0
    # an error inside leaves the model as it was
    with pytest.raises(RuntimeError, match="boom"):
        with growth.inserted(model, "1", growth.block_for(model, "1", batches[0])):
            raise RuntimeError("boom")
    assert _same(model, snapshot)


def test_grow_is_deterministic_and_refuses_too_few_batches():
    model, batches = _toy()
    one = growth.grow(model, "1", iter(batches * 4), batches[:2], [3], lr=1e-2, seed=1)
    two = growth.grow(model, "1", iter(batches * 4), batches[:2], [3], lr=1e-2, seed=1)
    assert one == two
    with pytest.raises(ValueError, match="ran out"):
        growth.grow(model, "1", iter(batches[:2]), batches[:2], [3], lr=1e-2)


def test_predictors_match_direct_computations():
    model, batches = _toy()
    train, heldout = batches[:4], batches[4:]
    layers = ["1", "2", "3"]
    measured = growth.predictors(model, layers, heldout, train, budgets=(8, 32), block_seed=5)
    assert list(measured) == layers
    for layer in layers:
        values = measured[layer].values
        assert set(values) == set(growth.predictor_names((8, 32)))
        # mu_M . g_K from the first M train rows and the first K held-out rows
        q_train = torch.cat([activation_gradients(model, layer, x, y) for x, y in train]).double()
        q_held = torch.cat([activation_gradients(model, layer, x, y) for x, y in heldout]).double()
        assert values["alignment_8"] == pytest.approx(float(q_train[:8].mean(0) @ q_held[:8].mean(0)), rel=1e-5)
        # the block gradient: autograd of the mean train loss with respect to W2 of the same block
        block = growth.block_for(model, layer, train[0], seed=5)
        with growth.inserted(model, layer, block):
            loss = sum(nn.functional.cross_entropy(model(x), y, reduction="sum") for x, y in train) / 128
            (g,) = torch.autograd.grad(loss, block.w2)
        assert values["grad_norm"] == pytest.approx(float(g.norm()), rel=1e-4)
        lo, hi = measured[layer].intervals["grad_norm"]
        assert lo < values["grad_norm"] < hi
        # B_align is 1 / (1 + n_eff d_align), and its interval comes from d_align's ends
        d = values["d_align"]
        assert values["b_align_32"] == pytest.approx(1 / (1 + 32 * 32 / 65 * max(d, 0)))
        assert measured[layer].intervals["b_align_32"][0] <= values["b_align_32"] <= \
            measured[layer].intervals["b_align_32"][1]
    # B_align orders the points exactly as d_align does (reversed sign)
    by = {layer: measured[layer].values for layer in layers}
    assert growth.order({k: v["d_align"] for k, v in by.items()}, "d_align") == \
        growth.order({k: v["b_align_8"] for k, v in by.items()}, "b_align_8")
    with pytest.raises(ValueError, match="budget"):
        growth.predictors(model, layers, heldout[:1], train, budgets=(64,))


def test_average_ranks_are_scipys_rankdata_exactly():
    """The counts give scipy's average ranks to the bit (ties, ±inf, one value), so ρ is the same number as before."""
    from dalign_repro.studies.growth.scoring import average_ranks

    rng = np.random.default_rng(3)
    for size in (1, 2, 7, 40):
        for values in (rng.normal(size=size), rng.integers(0, 3, size).astype(float),
                       np.where(rng.random(size) < 0.3, np.inf, rng.integers(0, 5, size)).astype(float),
                       np.full(size, -np.inf)):
            distinct, codes = np.unique(values, return_inverse=True)
            ranks = average_ranks(codes, len(distinct))
            assert ranks.dtype == np.float64 and np.array_equal(ranks, stats.rankdata(values)), values


def test_spearman_and_its_interval():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=12), rng.normal(size=12)
    assert growth.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)
    assert growth.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1)
    assert growth.spearman([1, np.inf, 3], [1, 3, 2]) == pytest.approx(1)  # +inf ranks highest
    assert math.isnan(growth.spearman([1, 1, 1], [1, 2, 3]))
    assert growth.spearman_interval(0.5, 3) == (-1.0, 1.0)
    lo, hi = growth.spearman_interval(0.5, 30)
    assert lo < 0.5 < hi and -1 < lo and hi < 1
    assert growth.spearman_interval(0.5, 300)[1] - growth.spearman_interval(0.5, 300)[0] < hi - lo


def _table(models, points, gain_of, seed=0, budget=10):
    """A grown-models table: per model, ``points`` layers with d_align, grad_norm, random and gain_of(...)."""
    rng = np.random.default_rng(seed)
    rows = []
    for m in range(models):
        d = rng.uniform(0, 1, points)
        g = rng.uniform(0, 1, points)
        gain = gain_of(d, g, rng)
        for i in range(points):
            rows.append(dict(family="toy", model=f"m{m}", width=8, seed=m, layer=f"l{i}", d_align=d[i],
                             grad_norm=g[i], random=rng.uniform(), budget_steps=budget, gain=gain[i]))
    return pd.DataFrame(rows)


def test_verdict_can_go_either_way():
    names = ["d_align", "grad_norm", "random"]
    follows_d = _table(8, 6, lambda d, g, rng: d + 0.05 * rng.normal(size=len(d)))
    scores = growth.score(follows_d, names)
    assert (scores[scores.predictor == "d_align"].rho > 0.7).all()
    assert growth.verdict(scores).label == "reproduced"
    follows_g = _table(8, 6, lambda d, g, rng: g + 0.05 * rng.normal(size=len(d)), seed=1)
    assert growth.verdict(growth.score(follows_g, names)).label == "contradicted"
    neither = _table(4, 6, lambda d, g, rng: rng.normal(size=len(d)), seed=2)
    assert growth.verdict(growth.score(neither, names)).label == "inconclusive"
    one_model = _table(1, 6, lambda d, g, rng: d, seed=3)
    assert growth.verdict(growth.score(one_model, names)).label == "not run"
    assert growth.verdict(pd.DataFrame()).label == "not run"


def _committed_points() -> list[int]:
    """Insertion points per grown model in the committed cpu table (LLaMA's 2-layer models have 2)."""
    from pathlib import Path

    from dalign_repro.report.results import read_table

    table, _ = read_table(Path(__file__).resolve().parents[1] / "results" / "cpu", "growth")
    one_budget = table[table.budget_steps == table.budget_steps.min()]
    return one_budget.groupby(["family", "model", "seed"]).layer.nunique().tolist()


def _design_table(points: list[int], gain_of, rng) -> pd.DataFrame:
    rows = []
    for m, n in enumerate(points):
        d, g = rng.uniform(0, 1, n), rng.uniform(0, 1, n)
        gain = gain_of(d, g, rng)
        rows += [dict(family="toy", model=f"m{m}", width=8, seed=m, layer=f"l{i}", d_align=d[i], grad_norm=g[i],
                      budget_steps=10, gain=gain[i]) for i in range(n)]
    return pd.DataFrame(rows)


def test_the_verdict_is_calibrated_at_the_committed_cpu_design():
    """At the cpu design's models and points: with no effect "reproduced" comes out at most 5% of the time
    (and "contradicted" as rarely); with gains that follow d_align about as closely as ρ ≈ 0.5 per model, it
    comes out most of the time."""
    points = _committed_points()
    assert len(points) >= 20 and min(points) >= 2
    rng = np.random.default_rng(0)
    names = ["d_align", "grad_norm"]

    def labels(gain_of, trials=200):
        found = [growth.verdict(growth.score(_design_table(points, gain_of, rng), names)).label
                 for _ in range(trials)]
        return {label: found.count(label) / trials for label in set(found)}

    null = labels(lambda d, g, rng: rng.normal(size=len(d)))
    bound = growth.CALIBRATION["null_reproduced"]  # the bound the claims' rule text states
    assert null.get("reproduced", 0) <= bound and null.get("contradicted", 0) <= bound, null
    effect = labels(lambda d, g, rng: d + 0.35 * rng.normal(size=len(d)))
    assert effect.get("reproduced", 0) >= growth.CALIBRATION["effect_reproduced"], effect


def test_hit_rate_and_regret_on_a_hand_made_table():
    rows = []
    for model, gains, d, g in [("a", [0.1, 0.5, 0.2], [1, 3, 2], [3, 2, 1]),
                               ("b", [0.4, 0.1, 0.3], [1, 2, 3], [3, 1, 2])]:
        for i in range(3):
            rows.append(dict(family="toy", model=model, width=1, seed=0, layer=f"l{i}", d_align=d[i],
                             grad_norm=g[i], b_align_4=-d[i], budget_steps=5, gain=gains[i]))
    scores = growth.score(pd.DataFrame(rows), ["d_align", "grad_norm", "b_align_4"]).set_index(
        ["model", "predictor"])
    assert scores.loc[("a", "d_align"), "hit"] == 1 and scores.loc[("a", "d_align"), "regret"] == 0
    assert scores.loc[("b", "d_align"), "hit"] == 0
    assert scores.loc[("b", "d_align"), "regret"] == pytest.approx(0.4 - 0.3)
    assert scores.loc[("a", "grad_norm"), "regret"] == pytest.approx(0.5 - 0.1)
    assert scores.loc[("b", "grad_norm"), "hit"] == 1
    assert scores.loc[("a", "d_align"), "rho"] == pytest.approx(1.0)
    # B_align points the other way: lowest first (here -d_align, so it ranks as d_align does)
    assert scores.loc[("a", "b_align_4"), "rho"] == pytest.approx(1.0)
    summary = growth.summarize(scores.reset_index(), by=("budget_steps",)).set_index("predictor")
    assert summary.loc["d_align", "hit"] == pytest.approx(0.5)
    assert summary.loc["grad_norm", "regret"] == pytest.approx(0.2)


def test_order_and_points():
    values = {"a": 1.0, "b": float("nan"), "c": float("inf"), "d": 1.0}
    assert growth.order(values, "d_align") == ["c", "a", "d", "b"]
    assert growth.order({"a": 0.2, "b": 0.1}, "b_align_16") == ["b", "a"]
    assert experiment.choose_points([f"l{i}" for i in range(12)], 6) == ["l0", "l2", "l4", "l7", "l9", "l11"]
    assert experiment.choose_points(["a", "b"], 6) == ["a", "b"]


def test_config_profiles():
    for profile in PROFILES:
        config = experiment.Config.for_profile(profile)
        assert config.budgets and max(config.budgets) <= config.examples
    assert "lab" in experiment.Config.PROFILES
    assert experiment.Config.for_profile("smoke").run_sweeps and not experiment.Config.for_profile("cpu").run_sweeps
    with pytest.raises(ValueError):
        experiment.Config(budgets=(1000,), examples=10)


def test_a_family_without_sweep_results_is_not_run(tmp_path):
    config = experiment.Config.for_profile("cpu", families=("resnet",))
    tables, facts = experiment.compute(config, tmp_path)
    assert facts["families"]["resnet"]["status"] == "not run"
    assert "resnet_width" in facts["families"]["resnet"]["reason"]
    assert tables["growth"].empty and list(tables["growth"].columns[:5]) == experiment.COLUMNS


def _decision_table(gains: dict[str, list[float]], d: list[float], g: list[float], se: float = 0.01) -> pd.DataFrame:
    rows = []
    for m, gain in gains.items():
        for i, value in enumerate(gain):
            rows.append(dict(family="toy", model=m, seed=0, layer=f"l{i}", layer_index=i, d_align=d[i],
                             grad_norm=g[i], budget_steps=10, gain=value, gain_lo=value - 12.706 * se,
                             gain_hi=value + 12.706 * se, repeats=2))
    return pd.DataFrame(rows)


def test_the_decision_reads_regret_against_random_and_the_gradient_norm():
    d, g = [1, 2, 3, 4], [4, 3, 2, 1]
    # d_align's top point (the last) is the best in every model; the gradient norm's (the first) the worst
    follows = _decision_table({f"m{k}": [0.1, 0.2, 0.3, 0.4 + 0.01 * k] for k in range(5)}, d, g)
    judged = growth.decision(follows)
    assert judged.label == "reproduced" and judged.models == 5
    assert judged.regret["d_align"][0] == pytest.approx(0)
    assert judged.regret["random"][0] == pytest.approx(np.mean([0.4 + 0.01 * k - np.mean([0.1, 0.2, 0.3,
                                                                  0.4 + 0.01 * k]) for k in range(5)]))
    assert judged.best_fixed == "last" and "always last" in judged.regret
    # a win that comes only from the baseline running backwards: d_align no better than random
    backwards = _decision_table({f"m{k}": [0.4 + 0.01 * k, 0.1, 0.3, 0.2] for k in range(5)}, [2, 4, 1, 3], g)
    assert growth.decision(backwards).label != "reproduced"
    # gains within their noise: the experiment cannot tell the points apart
    noisy = _decision_table({f"m{k}": [0.1, 0.2, 0.3, 0.4] for k in range(5)}, d, g, se=0.5)
    judged = growth.decision(noisy)
    assert judged.label == "inconclusive" and "below their noise" in judged.reason
    assert all(ratio < growth.NOISE_RATIO for _, ratio in judged.ratios)
    # two points a model: no ranking to judge
    two = _decision_table({f"m{k}": [0.1, 0.2] for k in range(5)}, d[:2], g[:2])
    assert growth.decision(two).label == "not estimable"
    # one model decides: leaving it out changes the label, so the label is inconclusive
    fragile = _decision_table({**{f"m{k}": [0.1, 0.2, 0.3, 0.4] for k in range(2)}, "m2": [0.4, 0.3, 0.2, 0.1]},
                              d, g)
    assert growth.decision(fragile).label == "inconclusive"
    assert "reproduced" in growth.decision(follows).sentence() and growth.decision(pd.DataFrame()).label == "not run"


def test_the_decision_is_calibrated_at_the_committed_cpu_design():
    """At each family's committed design (its models, points and repeats), with gains measured above their noise:
    gains that follow d_align give "reproduced" most of the time; gains unrelated to d_align, or that only run
    against the gradient norm (a baseline worse than random), at most 5% of the time."""
    from pathlib import Path

    from dalign_repro.report.results import read_table

    table, _ = read_table(Path(__file__).resolve().parents[1] / "results" / "cpu", "growth")
    one = table[table.budget_steps == table.budget_steps.max()]
    for family, part in one.groupby("family"):
        points = part.groupby(["model", "seed", "depth"], dropna=False).layer.nunique().tolist()
        repeats = int(part.repeats.iloc[0])
        assert len(points) >= 12 and min(points) >= growth.MIN_POINTS and repeats >= 10, (family, points, repeats)
        effect = growth.simulate_decision(points, 0.8, repeats=repeats, trials=100)
        assert effect.get("reproduced", 0) >= 0.8, (family, effect)
        for kwargs in (dict(effect=0.0), dict(effect=0.0, backwards=0.8)):
            found = growth.simulate_decision(points, repeats=repeats, trials=100, seed=1, **kwargs)
            assert found.get("reproduced", 0) <= 0.05, (family, kwargs, found)
        # below the noise gate the rule cannot say reproduced, whatever the effect
        assert growth.simulate_decision(points, 0.8, ratio=0.8, repeats=repeats, trials=20).get("reproduced", 0) == 0


def test_llamas_grown_models_come_from_the_depth_4_sweep(tmp_path, monkeypatch):
    """LLaMA's width sweep has 2 decoder layers, too few to rank: growth grows the depth-4 models, one point per
    layer, every seed the config asks for; the other families' models come from their width sweeps."""
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "checkpoints"))
    from dalign_repro.experiments import interventions, llama_depth

    assert experiment.SOURCES["llama"].runs_table("llama") == "llama_depth_runs"
    assert experiment.SOURCES["pythia"] is interventions.SOURCES["pythia"]
    config = experiment.Config.for_profile("smoke", families=("llama",), runs_by_family=(("llama", 1),))
    tables, facts = experiment.compute(config, tmp_path)
    grown = tables["growth"]
    assert set(grown.depth) == {4} and grown.groupby("model").layer.nunique().min() == growth.MIN_POINTS
    assert set(grown.seed) == {0} and (tmp_path / "llama_depth_runs.csv").is_file()
    assert len(grown.model.unique()) == len(llama_depth.Config.for_profile("smoke").widths)
    with pytest.raises(ValueError, match="runs_by_family"):
        experiment.Config(runs_by_family=(("gpt", 2),))