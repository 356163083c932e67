"""Recipe loading: every problem reported at once, with its key, a fix and where it came from."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from verl.config.errors import ConfigError, ConfigProblem
from verl.config.loader import load_config, parse_overrides, to_yaml
from verl.config.schema import ParallelConfig, VerlConfig

MINIMAL = """\
model: {path: /tmp/m}
data: {train_files: [a.parquet], train_batch_size: 8}
actor: {ppo_mini_batch_size: 4}
"""


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(path: Path, overrides=()) -> list[ConfigProblem]:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return info.value.problems


def by_key(problems: list[ConfigProblem]) -> dict[str, ConfigProblem]:
    return {p.key: p for p in problems}


# --------------------------------------------------------------------------- valid recipes


def test_minimal_recipe_loads_into_typed_config(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL))
    assert isinstance(cfg, DictConfig)
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, VerlConfig)
    assert obj.model.path == "/tmp/m"
    assert obj.data.train_files == ["a.parquet"]
    assert obj.data.train_batch_size == 8
    assert obj.actor.ppo_mini_batch_size == 4
    assert obj.actor.ppo_epochs == 1  # schema default kept
    assert obj.placement.pools[0].name == "hybrid"


def test_omegaconf_conversion_rules_apply(tmp_path):
    recipe = MINIMAL + "trainer: {seed: '7'}\nrollout: {temperature: 1, n: '4'}\n"
    cfg = load_config(write(tmp_path, recipe))
    assert cfg.trainer.seed == 7 and isinstance(cfg.trainer.seed, int)
    assert cfg.rollout.n == 4
    assert cfg.rollout.temperature == 1.0 and isinstance(cfg.rollout.temperature, float)


def test_scientific_floats_and_nested_sections(tmp_path):
    recipe = MINIMAL.replace(
        "actor: {ppo_mini_batch_size: 4}",
        "actor: {ppo_mini_batch_size: 4, optim: {lr: 1e-5, betas: [0.8, 0.9]}, parallel: {tp: 2}}",
    )
    recipe += "ref: {parallel: {tp: 4}}\n"
    cfg = load_config(write(tmp_path, recipe))
    assert cfg.actor.optim.lr == pytest.approx(1e-5)
    assert list(cfg.actor.optim.betas) == [0.8, 0.9]
    assert cfg.actor.parallel.tp == 2
    obj = OmegaConf.to_object(cfg)
    assert obj.ref.parallel == ParallelConfig(tp=4)  # Optional[ParallelConfig] filled from None


def test_free_form_fields_accept_anything(tmp_path):
    recipe = MINIMAL + textwrap.dedent(
        """\
        reward:
          fn: {_target_: math.pow, anything: [1, {deep: true}]}
          model: {_target_: pkg.Model, size: 7}
        """
    )
    recipe = recipe.replace("model: {path: /tmp/m}", "model: {path: /tmp/m, override_config: {rope: {theta: 1}}}")
    cfg = load_config(write(tmp_path, recipe))
    assert cfg.reward.fn.anything[1].deep is True
    assert cfg.reward.model.size == 7
    assert cfg.model.override_config.rope.theta == 1


def test_pool_list_elements_are_typed(tmp_path):
    recipe = MINIMAL + textwrap.dedent(
        """\
        placement:
          pools:
            - {name: train, roles: [actor, ref], devices: "2"}
            - {name: gen, roles: [rollout]}
        """
    )
    obj = OmegaConf.to_object(load_config(write(tmp_path, recipe)))
    assert [p.name for p in obj.placement.pools] == ["train", "gen"]
    assert obj.placement.pools[0].devices == 2
    assert obj.placement.pools[1].devices is None


# --------------------------------------------------------------------------- problems in the file


def test_three_problems_reported_together(tmp_path):
    path = write(
        tmp_path,
        """\
        model: {path: /tmp/m}
        data:
          train_files: [a.parquet]
        actor:
          ppo_epochs: two
          ppo_mini_bach_size: 4
        """,
    )
    problems = problems_of(path)
    found = by_key(problems)
    assert set(found) == {"actor.ppo_mini_bach_size", "actor.ppo_epochs", "data.train_batch_size"}

    typo = found["actor.ppo_mini_bach_size"]
    assert "did you mean 'ppo_mini_batch_size'?" in typo.message
    assert typo.location == f"{path}:6:3"
    assert "actor.ppo_mini_batch_size" in typo.fix

    wrong = found["actor.ppo_epochs"]
    assert "expected int" in wrong.message and "str 'two'" in wrong.message
    assert wrong.location == f"{path}:5:3"

    missing = found["data.train_batch_size"]
    assert missing.fix == "set data.train_batch_size in the recipe or pass data.train_batch_size=VALUE"
    assert all(p.severity == "error" for p in problems)


def test_error_message_lists_every_problem(tmp_path):
    path = write(tmp_path, "model: {pth: /tmp/m}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    for key in ("model.pth", "model.path", "data.train_files", "data.train_batch_size", "actor.ppo_mini_batch_size"):
        assert key in text
    assert "did you mean 'path'?" in text


def test_all_missing_required_values(tmp_path):
    found = by_key(problems_of(write(tmp_path, "{}\n")))
    assert set(found) == {"model.path", "data.train_files", "data.train_batch_size", "actor.ppo_mini_batch_size"}
    assert found["model.path"].fix == "set model.path in the recipe or pass model.path=VALUE"


def test_unknown_keys_at_every_depth(tmp_path):
    path = write(
        tmp_path,
        MINIMAL
        + textwrap.dedent(
            """\
            trainerr: {seed: 1}
            algorithm:
              kl_ctrl: {kl_coeff: 0.1}
            ref:
              parallel: {tpp: 2}
            placement:
              pools:
                - {name: a, roles: [actor], device: 1}
            zzz: 1
            """
        ),
    )
    found = by_key(problems_of(path))
    assert set(found) == {
        "trainerr",
        "algorithm.kl_ctrl.kl_coeff",
        "ref.parallel.tpp",
        "placement.pools.0.device",
        "zzz",
    }
    assert "did you mean 'trainer'?" in found["trainerr"].message
    assert "did you mean 'kl_coef'?" in found["algorithm.kl_ctrl.kl_coeff"].message
    assert "did you mean 'tp'?" in found["ref.parallel.tpp"].message
    assert "did you mean 'devices'?" in found["placement.pools.0.device"].message
    assert found["placement.pools.0.device"].location == f"{path}:11:33"
    assert "did you mean" not in found["zzz"].message and "trainer" in found["zzz"].fix
    assert found["zzz"].location == f"{path}:12:1"


def test_wrong_types_each_reported(tmp_path):
    path = write(
        tmp_path,
        MINIMAL
        + textwrap.dedent(
            """\
            rollout: {n: many, temperature: hot}
            trainer: {seed: null}
            placement:
              pools: [hybrid]
            tracking: {loggers: console}
            checkpoint: 3
            """
        ),
    )
    found = by_key(problems_of(path))
    assert set(found) == {
        "rollout.n",
        "rollout.temperature",
        "trainer.seed",
        "placement.pools.0",
        "tracking.loggers",
        "checkpoint",
    }
    assert "expected float, got str 'hot'" in found["rollout.temperature"].message
    assert "expected int, got null" in found["trainer.seed"].message
    assert "PoolConfig" in found["placement.pools.0"].message
    assert "list of str" in found["tracking.loggers"].message
    assert "CheckpointConfig" in found["checkpoint"].message
    assert found["rollout.n"].location == f"{path}:4:11"


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    path = write(tmp_path, "model: {path: /tmp/m}\ndata: train_batch_size: 8\n")
    (problem,) = problems_of(path)
    assert problem.location == f"{path}:2:23"
    assert "mapping values are not allowed" in problem.message


def test_unclosed_flow_mapping(tmp_path):
    path = write(tmp_path, "model: {path: /tmp/m\ndata: {}\n")
    (problem,) = problems_of(path)
    assert problem.location is not None and problem.location.startswith(f"{path}:")
    assert "invalid YAML" in problem.message


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.yaml"
    (problem,) = problems_of(missing)
    assert str(missing) in problem.message


def test_top_level_must_be_a_mapping(tmp_path):
    (problem,) = problems_of(write(tmp_path, "- a\n- b\n"))
    assert "top level must be a mapping" in problem.message


def test_duplicate_keys_are_reported(tmp_path):
    path = write(tmp_path, MINIMAL + "trainer:\n  seed: 1\n  seed: 2\n")
    (problem,) = problems_of(path)
    assert problem.key == "trainer.seed" and "duplicate" in problem.message
    assert problem.location == f"{path}:6:3"


def test_typo_in_file_and_override_and_syntax_in_override_all_reported(tmp_path):
    path = write(tmp_path, MINIMAL.replace("ppo_mini_batch_size", "ppo_mini_batchsize"))
    found = by_key(problems_of(path, ["rollout.temprature=0.5", "noequals"]))
    assert "actor.ppo_mini_batchsize" in found
    assert "rollout.temprature" in found
    assert "" in found and "noequals" in found[""].message
    # the typo's suggestion covers the missing value: no separate "missing" problem for it
    assert "actor.ppo_mini_batch_size" not in found


# --------------------------------------------------------------------------- overrides


def test_overrides_parse_values_as_yaml(tmp_path):
    cfg = load_config(
        write(tmp_path, MINIMAL),
        [
            "actor.ppo_epochs=3",
            "data.train_files=[x.parquet,y.parquet]",
            "data.val_batch_size=null",
            "actor.optim.lr=1e-5",
            "actor.parallel.tp=2",
            "model.override_config.rope={theta: 10}",
            "data.prompt_key=",
        ],
    )
    assert cfg.actor.ppo_epochs == 3
    assert list(cfg.data.train_files) == ["x.parquet", "y.parquet"]
    assert cfg.data.val_batch_size is None
    assert cfg.actor.optim.lr == pytest.approx(1e-5)
    assert cfg.actor.parallel.tp == 2
    assert cfg.model.override_config.rope.theta == 10
    assert cfg.data.prompt_key == ""


def test_overrides_win_over_the_file_and_fill_required(tmp_path):
    path = write(tmp_path, "model: {path: /tmp/m}\ndata: {train_files: [a]}\n")
    cfg = load_config(path, ["data.train_batch_size=16", "actor.ppo_mini_batch_size=8", "model.path=/other"])
    assert cfg.data.train_batch_size == 16 and cfg.model.path == "/other"


def test_override_into_list_elements(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL), ["placement.pools.0.devices=4", "data.train_files.0=b.parquet"])
    assert cfg.placement.pools[0].devices == 4
    assert list(cfg.data.train_files) == ["b.parquet"]


def test_override_merges_into_free_form_mapping(tmp_path):
    path = write(tmp_path, MINIMAL + "reward: {fn: {_target_: math.pow, x: 1}}\n")
    cfg = load_config(path, ["reward.fn.y=2"])
    assert OmegaConf.to_container(cfg.reward.fn) == {"_target_": "math.pow", "x": 1, "y": 2}


def test_override_problems(tmp_path):
    found = by_key(
        problems_of(
            write(tmp_path, MINIMAL),
            [
                "actor.ppo_mini_bach_size=4",
                "actor.ppo_epochs=two",
                "placement.pools.3.devices=1",
                "+actor.new_key=1",
                "data.train_files=[a,",
            ],
        )
    )
    typo = found["actor.ppo_mini_bach_size"]
    assert "did you mean 'ppo_mini_batch_size'?" in typo.message
    assert typo.location == "override 'actor.ppo_mini_bach_size=4'"
    assert "expected int" in found["actor.ppo_epochs"].message
    assert found["actor.ppo_epochs"].location == "override 'actor.ppo_epochs=two'"
    assert "out of range" in found["placement.pools.3"].message
    assert "not supported" in found["actor.new_key"].message
    assert "cannot parse value" in found["data.train_files"].message


def test_malformed_override_is_named(tmp_path):
    (problem,) = problems_of(write(tmp_path, MINIMAL), ["actor.ppo_epochs"])
    assert "actor.ppo_epochs" in problem.message and problem.location == "override 'actor.ppo_epochs'"


def test_parse_overrides_builds_nested_dict():
    nested, problems = parse_overrides(["a.b=1", "a.c=[x, y]", "d=null", "e.0.f=true", "bad", "g.=1"])
    assert nested == {"a": {"b": 1, "c": ["x", "y"]}, "d": None, "e": {"0": {"f": True}}}
    assert len(problems) == 2
    assert all(p.location and p.location.startswith("override ") for p in problems)


# --------------------------------------------------------------------------- interpolation


def test_interpolations_resolve_in_to_yaml(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL + "tracking: {project: demo, experiment: e1}\n"))
    text = to_yaml(cfg)
    assert "output_dir: outputs/demo/e1" in text
    assert "${" in to_yaml(cfg, resolve=False)


def test_user_interpolation_between_keys(tmp_path):
    recipe = MINIMAL + "critic: {ppo_mini_batch_size: '${actor.ppo_mini_batch_size}'}\n"
    cfg = load_config(write(tmp_path, recipe), ["actor.ppo_mini_batch_size=6"])
    assert cfg.critic.ppo_mini_batch_size == 6
    assert OmegaConf.to_object(cfg).critic.ppo_mini_batch_size == 6


def test_broken_interpolation_names_the_key(tmp_path):
    path = write(
        tmp_path, MINIMAL + "tracking: {log_dir: '${trainer.nope}/logs'}\ntrainer: {seed: '${tracking.project}'}\n"
    )
    found = by_key(problems_of(path))
    assert set(found) == {"tracking.log_dir", "trainer.seed"}
    assert "trainer.nope" in found["tracking.log_dir"].message
    assert found["tracking.log_dir"].location == f"{path}:4:12"


def test_interpolated_section_then_override(tmp_path):
    path = write(tmp_path, MINIMAL + "ref: {parallel: '${actor.parallel}'}\n")
    cfg = load_config(path, ["actor.parallel.pp=2", "ref.parallel.tp=4"])
    assert (cfg.ref.parallel.tp, cfg.ref.parallel.pp) == (4, 2)  # the actor's layout, with tp changed
    assert cfg.actor.parallel.tp == 1  # the actor's own section is untouched


# --------------------------------------------------------------------------- removed keys, plain dicts


@pytest.mark.parametrize(
    "key, replacement",
    [
        ("rollout.log_prob_micro_batch_size_per_device", "actor.log_prob_micro_batch_size_per_device"),
        ("model.trust_remote_code", "transformers' own classes"),
    ],
)
def test_removed_keys_say_what_replaces_them(tmp_path, key, replacement):
    p = by_key(problems_of(write(tmp_path, MINIMAL), [f"{key}=true"]))[key]
    assert "was removed" in p.message and replacement in p.fix


def test_a_plain_dict_is_checked_like_a_file():
    data = {"model": {"path": "/tmp/m"}, "data": {"train_files": ["a.parquet"], "train_batch_size": 8}}
    cfg = load_config({**data, "actor": {"ppo_mini_batch_size": 4}}, ["rollout.n=2"])
    assert cfg.rollout.n == 2 and cfg.actor.ppo_mini_batch_size == 4
    with pytest.raises(ConfigError) as info:
        load_config({**data, "actor": {"ppo_mini_bach_size": 4}})
    found = by_key(info.value.problems)
    assert "did you mean 'ppo_mini_batch_size'?" in found["actor.ppo_mini_bach_size"].message
