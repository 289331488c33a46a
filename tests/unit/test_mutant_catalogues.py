"""Every `make mutants` catalogue still applies to the code: each planted bug's `find` text occurs exactly once
in its file, and every test it names exists. A refactor that moves the guarded line otherwise leaves the
mutant unappliable, and the whole `make mutants` run stops on it (four did after the launchers refactor)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import tools.mutants.catalog as catalogues

ROOT = Path(__file__).resolve().parents[2]
MUTANTS = [(info.name, m) for info in pkgutil.iter_modules(catalogues.__path__)
           for m in importlib.import_module(f"tools.mutants.catalog.{info.name}").MUTANTS]


def test_there_are_catalogues():
    assert len({name for name, _ in MUTANTS}) >= 20 and len(MUTANTS) >= 400


@pytest.mark.parametrize("catalogue, mutant", MUTANTS, ids=[f"{c}:{m['id']}" for c, m in MUTANTS])
def test_each_mutant_applies_once_and_names_real_tests(catalogue, mutant):
    text = (ROOT / mutant["file"]).read_text()
    assert text.count(mutant["find"]) == 1, f"{catalogue}:{mutant['id']}: `find` occurs {text.count(mutant['find'])} times in {mutant['file']}"
    assert mutant["replace"] != mutant["find"]
    for test in mutant["tests"]:
        assert (ROOT / test.split("::")[0]).is_file(), f"{catalogue}:{mutant['id']} names a missing test file {test}"


def test_mutant_ids_are_unique():
    ids = [m["id"] for _, m in MUTANTS]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
