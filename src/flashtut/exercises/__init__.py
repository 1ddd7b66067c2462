"""Exercise checkers. ``checker`` holds the comparison every chapter uses; each chapter's
exercises live in ``chNN`` modules (``from flashtut.exercises import ch04``)."""
from .checker import CheckResult, compare, run_trials

__all__ = ["CheckResult", "compare", "run_trials"]
