"""``dp`` is bounded: each rank is a simulated engine core, so a huge value must be refused
with a located error instead of building millions of instances."""

import pytest
from pydantic import ValidationError

from blis_simpy.config.scenario import MAX_DP, Scenario


def test_dp_accepts_the_bound_and_refuses_past_it():
    assert Scenario(dp=MAX_DP).dp == 1024
    for bad in (0, -1, MAX_DP + 1, 2**70):
        with pytest.raises(ValidationError, match="dp"):
            Scenario(dp=bad)
