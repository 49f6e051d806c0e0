"""``blis-simpy fit``: coefficients of a latency backend fitted to measured runs."""

from blis_simpy.fit.fit import FitResult, fit
from blis_simpy.fit.objective import Case, Objective
from blis_simpy.fit.space import Space, space_for

__all__ = ["Case", "FitResult", "Objective", "Space", "fit", "space_for"]
