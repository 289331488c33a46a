"""The resources mirror the library's configs: same names, defaults and help; every field reaches it."""

from __future__ import annotations

import dataclasses

import pytest

from assets.resources import PolicyResource, TrainerResource
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.training.trainer import GRPOConfig

# Set from the policy that sampled, not by the trainer resource.
FROM_POLICY = {"temperature", "max_completion_length"}


def _defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        value = f.default_factory() if f.default is dataclasses.MISSING else f.default
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


@pytest.mark.parametrize("config_cls, resource_cls, skip", [
    (GRPOConfig, TrainerResource, FROM_POLICY),
    (PolicySettings, PolicyResource, {"model"}),  # model: unset means $TENTALIS_MODEL, read when used
])
def test_every_config_field_is_on_its_resource_with_the_same_default_and_help(config_cls, resource_cls, skip):
    fields = resource_cls.model_fields
    for f in dataclasses.fields(config_cls):
        if f.name in skip:
            continue
        assert f.name in fields, f"{resource_cls.__name__} lacks {f.name}: unreachable from Dagster"
        assert fields[f.name].default == _defaults(config_cls)[f.name], f.name
        assert fields[f.name].description == f.metadata["help"], f.name


def test_the_resource_default_is_the_library_default_and_learns_the_measured_recipe():
    assert TrainerResource().config() == GRPOConfig()
    cfg = GRPOConfig()
    assert (cfg.loss_type, cfg.beta, cfg.learning_rate) == ("dapo", 0.0, 2e-4)  # the README's learning curve


def test_each_trainer_field_set_on_the_resource_reaches_the_config():
    changed = {"loss_type": "gspo", "beta": 0.1, "epsilon": 0.1, "epsilon_high": 0.3, "importance_sampling_level": "token",
               "num_iterations": 2, "old_logprobs": "sampling", "learning_rate": 1e-3, "lr_scheduler_type": "cosine",
               "warmup_ratio": 0.1, "warmup_steps": 3, "max_steps": 9, "weight_decay": 0.01, "max_grad_norm": 0.5,
               "per_step_rows": 8, "micro_batch_tokens": 512, "shuffle": False, "share_prompt_prefix": False,
               "gradient_checkpointing": True, "lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.1,
               "lora_target_modules": ["q_proj"], "seed": 7, "device": "cpu", "dtype": "float32",
               "scale_rewards": "none", "dynamic_sampling": False, "overlong_buffer": 5, "advantage_mode": "process",
               "w_rl": 0.5, "w_opd": 2.0, "opd_teacher": "/models/teacher", "opd_teacher_model": "big-teacher", "opd_clip": 0.5, "opd_min_effect": 0.1,
               "guide": True, "guide_generations": 3, "guide_importance": "shaping", "guide_shaping_gamma": 0.5,
               "guide_with_hint": False, "guide_answer_format": "tagged", "guide_rescue": "both", "guide_prefix_max_fraction": 0.8,
               "guide_prefix_threshold": 0.3, "episode_format_weight": 0.1,
               "max_policy_lag": 2, "grounding_policy": "penalize", "grounding_penalty": 0.5}
    assert set(changed) == {f.name for f in dataclasses.fields(GRPOConfig)} - FROM_POLICY
    cfg = TrainerResource(**changed).config(max_completion_length=77)
    for name, value in changed.items():
        got = getattr(cfg, name)
        assert (list(got) if isinstance(got, tuple) else got) == value, name
    assert cfg.max_completion_length == 77


def test_trajectory_settings_follow_the_algorithm():
    assert TrainerResource().trajectory_settings(96) == {
        "scale_rewards": "group", "dynamic_sampling": True, "overlong_buffer": 24, "max_completion_length": 96,
        "advantage_mode": "outcome", "w_rl": 1.0, "w_opd": 0.0, "guide_answer_format": "lenient", "episode_format_weight": 0.0}
    assert TrainerResource(guide_answer_format="tagged").trajectory_settings(96)["guide_answer_format"] == "tagged"
    assert TrainerResource(episode_format_weight=0.25).trajectory_settings(96)["episode_format_weight"] == 0.25
    dr = TrainerResource(loss_type="dr_grpo").trajectory_settings(96)
    assert (dr["scale_rewards"], dr["dynamic_sampling"], dr["overlong_buffer"]) == ("none", False, 0)
    assert TrainerResource(loss_type="grpo", overlong_buffer=10).trajectory_settings(96)["overlong_buffer"] == 10


@pytest.mark.parametrize("field, value, needle", [
    ("loss_type", "ppo", "loss_type must be one of"),
    ("learning_rate", 0.0, "learning_rate must be above 0"),
    ("beta", -1.0, "beta must be >= 0"),
    ("scale_rewards", "batch", "scale_rewards must be one of"),
    ("advantage_mode", "token", "advantage_mode must be one of"),
])
def test_bad_trainer_settings_are_refused_by_the_config(field, value, needle):
    with pytest.raises(ValueError, match=needle):
        TrainerResource(**{field: value}).config()


def test_policy_resource_reads_the_model_from_the_environment_when_unset(monkeypatch, tmp_path):
    monkeypatch.setenv("TENTALIS_MODEL", str(tmp_path))
    assert PolicyResource().settings().model == str(tmp_path)
    assert PolicyResource(model="embedded").settings().model == "embedded"
    assert PolicyResource(worked_example=False, max_batch_tokens=1024).settings().worked_example is False
    with pytest.raises(ValueError, match="backend must be one of"):
        PolicyResource(backend="llama").settings()
