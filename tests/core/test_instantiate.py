"""`_target_` instantiation: stdlib targets keep the imports independent of how tests are collected."""

from __future__ import annotations

import collections
import functools
import math
import os
import textwrap
from fractions import Fraction

import pytest
from omegaconf import OmegaConf

from verl.config.errors import ConfigError, ConfigProblem
from verl.config.instantiate import instantiate, resolve_target


def only_problem(info: pytest.ExceptionInfo) -> ConfigProblem:
    (problem,) = info.value.problems
    return problem


# --------------------------------------------------------------------------- building


def test_calls_target_with_kwargs():
    assert instantiate({"_target_": "fractions.Fraction", "numerator": 3, "denominator": 4}) == Fraction(3, 4)


def test_positional_only_target_takes_args():
    assert instantiate({"_target_": "math.pow", "_args_": [2, 3]}) == 8.0
    with pytest.raises(ConfigError) as info:
        instantiate({"_target_": "math.pow", "x": 2, "y": 3}, key="reward.fn")
    assert "positional only" in only_problem(info).message


def test_positional_and_call_site_kwargs():
    spec = {"_target_": "textwrap.indent", "prefix": "> "}
    assert instantiate(spec, "a\nb\n") == "> a\n> b\n"
    # the caller's kwargs win over the recipe's
    assert instantiate(spec, "a\n", prefix="# ") == "# a\n"


def test_class_target():
    obj = instantiate({"_target_": "collections.OrderedDict", "a": 1})
    assert isinstance(obj, collections.OrderedDict) and obj == {"a": 1}


def test_dictconfig_spec_is_resolved_to_plain_values():
    cfg = OmegaConf.create(
        {"base": 3, "fn": {"_target_": "fractions.Fraction", "numerator": "${base}", "denominator": 4}}
    )
    assert instantiate(cfg.fn, key="reward.fn") == Fraction(3, 4)


def test_partial_returns_functools_partial():
    fn = instantiate({"_target_": "textwrap.indent", "_partial_": True, "prefix": "> "})
    assert isinstance(fn, functools.partial)
    assert fn("a\n") == "> a\n"


def test_args_and_nested_targets():
    spec = {
        "_target_": "os.path.join",
        "_args_": ["root", {"_target_": "os.path.join", "_args_": ["a", "b"]}],
    }
    assert instantiate(spec) == os.path.join("root", "a", "b")


def test_recursive_false_passes_nested_specs_through():
    spec = {"_target_": "collections.OrderedDict", "_recursive_": False, "inner": {"_target_": "math.pow"}}
    assert instantiate(spec)["inner"] == {"_target_": "math.pow"}


def test_user_module_target(tmp_path, monkeypatch):
    (tmp_path / "verl_test_component.py").write_text("def make(a, b=2):\n    return (a, b)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert instantiate({"_target_": "verl_test_component.make", "a": 1}) == (1, 2)
    assert instantiate({"_target_": "verl_test_component:make", "a": 1, "b": 5}) == (1, 5)


# --------------------------------------------------------------------------- resolve_target


def test_resolve_target_forms():
    assert resolve_target("math.pow") is math.pow
    assert resolve_target("os.path:join") is os.path.join
    assert resolve_target("os.path.join") is os.path.join
    # a class attribute: the longest importable module is 'collections', the rest are attributes
    assert resolve_target("collections.OrderedDict.fromkeys") == collections.OrderedDict.fromkeys
    assert resolve_target("textwrap") is textwrap


def test_resolve_target_bad_module():
    with pytest.raises(ConfigError) as info:
        resolve_target("verl_no_such_pkg.bar.name", key="reward.fn._target_")
    problem = only_problem(info)
    assert problem.key == "reward.fn._target_"
    assert "cannot import module 'verl_no_such_pkg.bar' (ModuleNotFoundError:" in problem.message
    assert str(info.value).startswith("1 configuration error")


def test_resolve_target_rejects_empty():
    with pytest.raises(ConfigError):
        resolve_target("")


# --------------------------------------------------------------------------- errors name the key


def test_missing_target():
    with pytest.raises(ConfigError) as info:
        instantiate({"x": 1}, key="reward.fn")
    problem = only_problem(info)
    assert problem.key == "reward.fn" and "'_target_' missing" in problem.message


def test_spec_not_a_mapping():
    with pytest.raises(ConfigError) as info:
        instantiate("math.pow", key="data.dataset")
    assert only_problem(info).key == "data.dataset"


def test_unimportable_module_names_key_and_module():
    with pytest.raises(ConfigError) as info:
        instantiate({"_target_": "verl_no_such_pkg.bar.fn"}, key="reward.fn")
    problem = only_problem(info)
    assert problem.key == "reward.fn._target_"
    assert "cannot import module 'verl_no_such_pkg.bar'" in problem.message
    assert "reward.fn._target_: cannot import module" in str(info.value)


def test_module_with_broken_dependency_is_reported_as_is(tmp_path, monkeypatch):
    (tmp_path / "verl_test_broken.py").write_text("import verl_no_such_dependency\n\ndef fn():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        instantiate({"_target_": "verl_test_broken.fn"}, key="reward.fn")
    message = only_problem(info).message
    assert "cannot import module 'verl_test_broken'" in message
    assert "verl_no_such_dependency" in message


def test_missing_attribute():
    with pytest.raises(ConfigError) as info:
        instantiate({"_target_": "math.nope"}, key="reward.fn")
    problem = only_problem(info)
    assert problem.key == "reward.fn._target_"
    assert "'math' has no attribute 'nope'" in problem.message


def test_target_not_callable():
    with pytest.raises(ConfigError) as info:
        instantiate({"_target_": "math.pi"}, key="reward.fn")
    assert "not callable" in only_problem(info).message


def test_bad_kwarg_is_a_type_error_naming_the_key():
    with pytest.raises(ConfigError) as info:
        instantiate({"_target_": "textwrap.indent", "text": "a", "prefix": "-", "bogus": 1}, key="reward.fn")
    problem = only_problem(info)
    assert problem.key == "reward.fn"
    assert "TypeError" in problem.message and "bogus" in problem.message
    assert "textwrap.indent(text, prefix, predicate=None)" in problem.fix


def test_bad_kwarg_with_partial():
    with pytest.raises(ConfigError) as info:
        instantiate({"_target_": "textwrap.indent", "_partial_": True, "bogus": 1}, key="reward.fn")
    assert "bogus" in only_problem(info).message


def test_nested_errors_carry_the_nested_key():
    spec = {"_target_": "collections.OrderedDict", "inner": {"_target_": "math.nope"}}
    with pytest.raises(ConfigError) as info:
        instantiate(spec, key="reward.model")
    assert only_problem(info).key == "reward.model.inner._target_"


def test_error_inside_target_keeps_its_type_and_names_the_key():
    with pytest.raises(ValueError) as info:
        instantiate({"_target_": "math.sqrt", "_args_": [-1]}, key="reward.fn")
    assert any("reward.fn" in note for note in getattr(info.value, "__notes__", []))


def test_broken_interpolation_in_spec_names_the_key():
    cfg = OmegaConf.create({"fn": {"_target_": "math.pow", "x": "${nope}"}})
    with pytest.raises(ConfigError) as info:
        instantiate(cfg.fn, key="reward.fn")
    assert only_problem(info).key == "reward.fn"


def test_args_must_be_a_list():
    with pytest.raises(ConfigError) as info:
        instantiate({"_target_": "math.pow", "_args_": "12"}, key="reward.fn")
    assert only_problem(info).key == "reward.fn._args_"
