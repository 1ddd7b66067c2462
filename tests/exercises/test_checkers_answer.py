"""Every exercise checker answers, never raises: whatever the reader's function returns (None,
a NumPy array, a string, a tuple of the wrong length, a tensor of the wrong shape or dtype) or
raises, the checker returns a failed CheckResult whose message says what came back."""
import importlib
import inspect

import numpy as np
import pytest
import torch

from flashtut.exercises.checker import CheckResult

MODULES = [f"flashtut.exercises.ch{n:02d}" for n in range(1, 13)]


def _raises(*args, **kwargs):
    raise ValueError("boom in the reader's code")


BAD = {
    "raises": (_raises, "boom"),
    "None": (lambda *a, **k: None, None),
    "a NumPy array": (lambda *a, **k: np.zeros((2, 3)), None),
    "a string": (lambda *a, **k: "forty-two", None),
    "a tuple of five": (lambda *a, **k: (1, 2, 3, 4, 5), None),
    "a complex tensor": (lambda *a, **k: torch.zeros(3, 2, dtype=torch.complex64), None),
}


class _RaisingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *args):
        raise ValueError("boom in the reader's code")

    @staticmethod
    def backward(ctx, *grads):
        raise ValueError("boom in the reader's code")


def _checkers():
    for mod_name in MODULES:
        mod = importlib.import_module(mod_name)
        for name, fn in sorted(vars(mod).items()):
            if name.startswith("check_") and inspect.isfunction(fn) and fn.__module__ == mod_name:
                yield pytest.param(fn, id=f"{mod_name.rsplit('.', 1)[1]}.{name}")


def _call(check, candidate):
    params = [p for p in inspect.signature(check).parameters.values()
              if p.default is inspect.Parameter.empty]
    if check.__name__ == "check_flash_function" and candidate is not None:
        return check(candidate)
    return check(*([candidate] * len(params)))


@pytest.mark.parametrize("check", list(_checkers()))
@pytest.mark.parametrize("bad", list(BAD))
def test_checker_answers_a_wrong_kind_of_answer(check, bad):
    fn, phrase = BAD[bad]
    res = _call(check, fn)
    assert isinstance(res, CheckResult) and not res.ok, res
    assert res.message.strip(), "a failed check must say why"
    if phrase and check.__name__ != "check_flash_function":   # it asks for a class first
        assert phrase in res.message, res.message


@pytest.mark.parametrize("check", [c for c in _checkers() if c.id.endswith("check_flash_function")])
def test_function_checker_answers_a_raising_function(check):
    res = check(_RaisingFunction)
    assert not res.ok and "boom" in res.message, res.message
