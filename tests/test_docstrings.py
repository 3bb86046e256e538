"""The public API's docstrings are numpydoc contracts (issue 47).

Every public object (``asyncopt.__all__`` and ``asyncopt.deep.__all__``) and every
public method or property that asyncopt itself defines on a public class (inherited
scikit-learn and torch members are theirs to document) goes through
``numpydoc.validate.validate``; the checks in CHECKS must report nothing. An object
that cannot be validated is listed in EXEMPT with the reason; nothing else is skipped.
"""
import functools
import importlib
import importlib.util
import inspect

import pytest
from numpydoc.docscrape import get_doc_object
from numpydoc.validate import validate

# numpydoc error codes that must not occur, with what each one means
CHECKS = {
    "GL02": "closing quotes not on the line after the last text",
    "GL03": "double blank line in the docstring",
    "GL08": "no docstring",
    "SS01": "no one-line summary",
    "SS03": "summary does not end with a period",
    "SS06": "summary longer than one line",
    "PR01": "a parameter is not documented",
    "PR02": "a documented parameter does not exist",
    "PR07": "a parameter has no description",
    "RT01": "a function or method that returns a value has no Returns section",
}

# objects numpydoc cannot validate: name -> reason
EXEMPT = {
    "asyncopt.__version__": "a version string, documented by the package docstring",
    "asyncopt.deep.PARTITION_NAMES": "a tuple of partition names (no docstring of its "
                                     "own); make_partition documents them",
}

MEMBER_KINDS = (staticmethod, classmethod, property, functools.cached_property)


def _own_members(cls):
    """Public methods and properties that asyncopt modules define on ``cls`` or on its
    asyncopt bases (first definition in the MRO wins)."""
    names = {}
    for klass in cls.__mro__:
        if not klass.__module__.startswith("asyncopt"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in names:
                continue
            if inspect.isfunction(value) or isinstance(value, MEMBER_KINDS):
                names[name] = value
    return sorted(names)


def public_names(module_name):
    """Qualified names of the module's ``__all__`` objects and of their own members."""
    module = importlib.import_module(module_name)
    out = []
    for name in module.__all__:
        qualified = f"{module_name}.{name}"
        if qualified in EXEMPT:
            continue
        obj = getattr(module, name)
        assert inspect.isclass(obj) or inspect.isfunction(obj), (
            f"{qualified} is a {type(obj).__name__}: validate it or list it in EXEMPT")
        out.append(qualified)
        if inspect.isclass(obj):
            out += [f"{qualified}.{member}" for member in _own_members(obj)]
    return out


def docstring_errors(names):
    """[(object, code, message)] for the CHECKS codes numpydoc reports on ``names``
    (qualified names, or objects)."""
    return [(name, code, message) for name in names
            for code, message in validate(
                name if isinstance(name, str) else get_doc_object(name))["errors"]
            if code in CHECKS]


def _report(errors):
    lines = [f"  {name}: {code} {message}" for name, code, message in errors]
    return f"{len(errors)} docstring problems (numpydoc codes, see CHECKS):\n" + \
        "\n".join(lines)


def test_exemptions_name_real_objects():
    for qualified in EXEMPT:
        module_name, _, name = qualified.rpartition(".")
        if module_name == "asyncopt.deep" and importlib.util.find_spec("torch") is None:
            continue
        module = importlib.import_module(module_name)
        assert name in module.__all__, qualified
        assert not (inspect.isclass(getattr(module, name))
                    or inspect.isfunction(getattr(module, name))), (
            f"{qualified} can be validated: remove it from EXEMPT")


def test_core_public_api_docstrings():
    names = public_names("asyncopt")
    assert "asyncopt.Lasso.fit" in names and "asyncopt.Problem.lam_max" in names
    errors = docstring_errors(names)
    assert not errors, _report(errors)


def test_deep_public_api_docstrings():
    pytest.importorskip("torch")
    names = public_names("asyncopt.deep")
    assert "asyncopt.deep.ProxOptimizer.step" in names
    errors = docstring_errors(names)
    assert not errors, _report(errors)


def _undocumented_parameter(a, b):
    """Add two numbers.

    Parameters
    ----------
    a : float
        The first.

    Returns
    -------
    float
        a + b.
    """
    return a + b


def test_the_check_catches_an_undocumented_parameter():
    errors = docstring_errors([_undocumented_parameter])
    assert [code for _, code, _ in errors] == ["PR01"], errors
