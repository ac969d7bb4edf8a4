"""A calibration file is only applied to the draft settings and budget it was made for; gated
variants without one say that they run on uncalibrated thresholds."""

from __future__ import annotations

import dataclasses

import pytest

from specgraft.calibration import save_calibration
from specgraft.drafters.draft_model import PRESETS
from specgraft.methods import METHODS, MethodOptions
from specgraft.methods.graft import GraftOptions, build_graft_method, check_calibration_budget

from tests.helpers.calibration import make_calibration
from tests.helpers.models import tiny_llama
from tests.helpers.stubs import Vocab
from specgraft.methods.graft import GRAFT_BEHAVIOUR

VARIANTS = tuple(GRAFT_BEHAVIOUR)


@pytest.fixture(scope="module")
def draft():
    return tiny_llama()


@pytest.fixture()
def calibration(tmp_path) -> str:
    """A cpu-preset calibration (depth 4, top-k 2, budget 8)."""
    return str(save_calibration(make_calibration(), tmp_path / "c.json"))


@pytest.mark.parametrize(
    "override, message",
    [
        (dict(depth=3), r"made for depth 4, but this run \(preset 'cpu'\) uses depth 3"),
        (dict(top_k=5), "made for top_k 2, but this run .* uses top_k 5"),
        (dict(preset="gpu"), "made for checkpoints \\(0, 1, 2\\), depth 4, top_k 2, but .* uses checkpoints \\(0, 1, 5\\), depth 8, top_k 10"),
    ],
)
def test_thresholds_for_other_draft_settings_are_refused(calibration, draft, override, message):
    options = GraftOptions(calibration=calibration, **override)
    for variant in ("graft", "graft-prune"):
        with pytest.raises(ValueError, match=message):
            build_graft_method(variant, Vocab(96), options, draft_model=draft)
        # and before any model is loaded
        with pytest.raises(ValueError, match=message):
            METHODS[variant].check(MethodOptions(graft=options), draft_model=draft)
    # the variants that only read the file's matrix, and explicit thresholds, are fine
    for variant in ("graft-fixed", "graft-root", "graft-tail"):
        build_graft_method(variant, Vocab(96), options, draft_model=draft)
    drafters, _ = build_graft_method("graft", Vocab(96), dataclasses.replace(options, thresholds=(0.3, 0.2, 0.1)), draft_model=draft)
    assert drafters[0].config.thresholds == (0.3, 0.2, 0.1)


def test_thresholds_for_another_budget_are_refused(calibration):
    options = GraftOptions(calibration=calibration)
    check_calibration_budget("graft", options, PRESETS["cpu"].budget)
    with pytest.raises(ValueError, match="made for budget 8, but this run .* uses budget 16"):
        check_calibration_budget("graft", options, 16)
    with pytest.raises(ValueError, match="made for budget 8"):
        check_calibration_budget("graft-prune", options, 4)
    # no thresholds read from the file: nothing to refuse
    check_calibration_budget("graft-fixed", options, 16)
    check_calibration_budget("graft", dataclasses.replace(options, thresholds=(0.3, 0.2, 0.1)), 16)
    check_calibration_budget("graft", GraftOptions(), 16)


def test_uncalibrated_gated_variants_warn_once_in_one_line(capsys, calibration, draft):
    for variant in VARIANTS:
        build_graft_method(variant, Vocab(96), GraftOptions(), draft_model=draft)
        err = capsys.readouterr().err
        if variant in ("graft", "graft-prune"):
            assert err.count("\n") == 1 and err.startswith(f"warning: {variant} uses the cpu preset's uncalibrated thresholds")
        else:
            assert err == "", f"{variant} has no thresholds to warn about"
    for options in (GraftOptions(calibration=calibration), GraftOptions(thresholds=(0.3, 0.2, 0.1))):
        build_graft_method("graft", Vocab(96), options, draft_model=draft)
        assert capsys.readouterr().err == ""


def test_a_calibration_fitted_with_other_draft_numerics_warns_in_one_line(capsys, tmp_path, draft):
    cal = make_calibration()
    int8 = str(save_calibration(dataclasses.replace(cal, meta={**cal.meta, "draft_quant": "int8"}), tmp_path / "int8.json"))
    build_graft_method("graft-prune", Vocab(96), GraftOptions(calibration=int8), draft_model=draft)  # the tiny draft is float32
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fitted with an int8 draft, this run drafts in float32" in err
    assert "--draft-quant none" in err
    # the matrix-only variants read no thresholds; a file that matches says nothing
    build_graft_method("graft-fixed", Vocab(96), GraftOptions(calibration=int8), draft_model=draft)
    fp32 = str(save_calibration(dataclasses.replace(cal, meta={**cal.meta, "draft_quant": "none"}), tmp_path / "fp32.json"))
    build_graft_method("graft", Vocab(96), GraftOptions(calibration=fp32), draft_model=draft)
    assert capsys.readouterr().err == ""
