"""Checkpoints written by release 0.1.0 (commit f22f242: betas and momentum as
Python floats, LARS with a dead ``step`` state) load into the current optimizers
and training continues on the trajectory that release took.
``fixtures/make_checkpoints.py`` wrote the fixture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from checkpoint_cases import CASES, make_model, run_steps

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoints_v0.1.pt"


@pytest.mark.parametrize("name", list(CASES))
def test_old_checkpoint_resumes_on_the_same_trajectory(name):
    saved = torch.load(FIXTURE, weights_only=True)["cases"][name]
    model, opt, sched = make_model(name)
    model.load_state_dict(saved["checkpoint"]["model"])
    opt.load_state_dict(saved["checkpoint"]["opt"])
    sched.load_state_dict(saved["checkpoint"]["sched"])
    if name == "lars":
        assert all("step" not in s for s in opt.state.values())  # the dead state is dropped
    for group, saved_group in zip(opt.param_groups, saved["checkpoint"]["opt"]["param_groups"]):
        assert group["lr"] == saved_group["lr"] and group.get("betas") == saved_group.get("betas")  # (as saved)
    run_steps(name, model, opt, sched, range(3, 6))
    for key, value in model.state_dict().items():
        # betas are float32 tensors now (0.1.0 used them as doubles in the bias
        # corrections): the trajectories agree to float32 rounding
        torch.testing.assert_close(value.float(), saved["after"][key].float(), rtol=2e-5, atol=2e-6, msg=key)
