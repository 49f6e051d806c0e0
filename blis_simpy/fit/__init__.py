"""``blis-simpy fit``: coefficients of a latency backend fitted to measured runs."""

from blis_simpy.fit.fit import FitResult, fit
from blis_simpy.fit.objective import AggregateCase, Case, Objective, case_for
from blis_simpy.fit.space import Space, space_for

__all__ = ["AggregateCase", "Case", "FitResult", "Objective", "Space", "case_for", "fit", "space_for"]
