"""config_field: the library configs' fields carry their help (what the Dagster resources show)."""

from __future__ import annotations

import dataclasses

import pytest

from tentalis_pipelines.config_fields import config_field
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.skills.library import SkillSettings
from tentalis_pipelines.training.trainer import GRPOConfig


def test_a_field_keeps_its_default_and_help():
    @dataclasses.dataclass(frozen=True)
    class C:
        n: int = config_field(3, "how many")
        names: tuple[str, ...] = config_field(("a", "b"), "which")

    f = {f.name: f for f in dataclasses.fields(C)}
    assert f["n"].default == 3 and f["n"].metadata["help"] == "how many"
    assert f["names"].default is dataclasses.MISSING and f["names"].default_factory() == ("a", "b")
    assert C() == C(3, ("a", "b")) and f["names"].metadata["help"] == "which"


@pytest.mark.parametrize("config_cls", [PolicySettings, GRPOConfig, SkillSettings])
def test_every_library_config_field_explains_itself(config_cls):
    missing = [f.name for f in dataclasses.fields(config_cls) if not f.metadata.get("help", "").strip()]
    assert not missing, f"{config_cls.__name__} fields without help: {missing}"
