"""The contract between srt-agent and vLLM: every seam declared in ``srt_agent.backends.vllm.seams`` holds in
the published sources of the vLLM releases below (read with ast from PyPI's sdists, cached after the first
run), and in the vLLM installed here. A release that renames a hooked method, changes its parameters or drops
an attribute fails here by name, before an engine starts on it."""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import shutil
import sys
import tarfile
from pathlib import Path

import httpx
import pytest
from helpers import vllm_sources as fetch
from helpers.vllm_sources import SourcesUnavailable, vllm_sources

from srt_agent.backends.vllm import seams
from srt_agent.backends.vllm.seams import SEAMS, Seam, installed_problems, source_problems

VERSIONS = ("0.24.0", "0.31.0", "0.33.0")
RUNNER = "vllm/v1/worker/gpu_model_runner.py"
BATCH = "vllm/v1/worker/gpu_input_batch.py"


@functools.cache
def sources(version: str) -> Path:
    try:
        return vllm_sources(version)
    except SourcesUnavailable as exc:  # CI reaches PyPI: a download that fails is a failure, not a skip
        pytest.fail(str(exc), pytrace=False)


def _edit(root: Path, relative: str, old: str, new: str, after: str = "") -> None:
    """Replace the first `old` past `after` (which must occur once) in a copied file."""
    path = root / relative
    text = path.read_text()
    assert text.count(after or old) == 1, f"{after or old!r} occurs {text.count(after or old)} times in {relative}"
    at = text.index(old, text.index(after))
    path.write_text(text[:at] + new + text[at + len(old) :])


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_published_sources_keep_every_seam(version):
    assert source_problems(sources(version)) == []


@pytest.mark.slow
def test_a_moved_seam_is_named(tmp_path):
    """Rename ``_sample``, a parameter of ``propose_draft_token_ids`` and an InputBatch array in a copy of
    a release: exactly those seams are reported, each with what srt-agent needs it for."""
    root = sources(VERSIONS[-1])
    for module in {seam.module for seam in SEAMS if not seam.optional}:
        base = Path(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if (root / candidate).is_file():
                (tmp_path / candidate).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(root / candidate, tmp_path / candidate)
    assert source_problems(tmp_path) == []  # the copy holds every module the seams live in

    _edit(tmp_path, RUNNER, "    def _sample(\n", "    def _sample_v2(\n")
    _edit(tmp_path, RUNNER, "common_attn_metadata:", "attn_metadata:", after="    def propose_draft_token_ids(\n")
    _edit(tmp_path, BATCH, "self.token_ids_cpu = ", "self.token_ids_np = ")
    problems = source_problems(tmp_path)

    runner, batch = "vllm.v1.worker.gpu_model_runner.GPUModelRunner", "vllm.v1.worker.gpu_input_batch.InputBatch"
    named = {line.split(":")[0] for line in problems}
    assert named == {f"{runner}._sample", f"{runner}.propose_draft_token_ids", f"{batch}.token_ids_cpu"}, problems
    by_name = {line.split(":")[0]: line for line in problems}
    assert "not found" in by_name[f"{runner}._sample"] and "exact sampling" in by_name[f"{runner}._sample"]
    assert "'attn_metadata'" in by_name[f"{runner}.propose_draft_token_ids"]
    assert "SRTProposer" in by_name[f"{batch}.token_ids_cpu"]


def test_the_checks_read_attributes_parameters_and_text(tmp_path, monkeypatch):
    """The rules on a small made-up package: attributes from __init__, annotations and properties count,
    parameters must match (a last "..." allows more), text must appear in order, optional seams are left to
    installed_problems; the imported module is unwrapped before its signature is read."""
    package = tmp_path / "fakevllm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "runner.py").write_text(
        "import functools\n"
        "\n"
        "class Runner:\n"
        "    field: int = 0\n"
        "\n"
        "    def __init__(self, config):\n"
        "        self.batch = config\n"
        "\n"
        "    @property\n"
        "    def ids(self):\n"
        "        return []\n"
        "\n"
        "    def step(self, logits, spec, extra=None):\n"
        "        if self.batch == 'custom':\n"
        "            return self.batch.propose(logits)\n"
    )
    declared = (
        Seam("fakevllm.runner", "Runner.batch", why="w"),
        Seam("fakevllm.runner", "Runner.field", why="w"),
        Seam("fakevllm.runner", "Runner.ids", why="w"),
        Seam("fakevllm.runner", "Runner.step", ("self", "logits", "..."), contains=("'custom'", ".propose("), why="w"),
        Seam("fakevllm.absent", "kernel", ("x",), why="w", optional=True),
    )
    monkeypatch.setattr(seams, "SEAMS", declared)
    assert source_problems(tmp_path) == []

    wrong = (
        Seam("fakevllm.runner", "Runner.missing", why="w"),
        Seam("fakevllm.runner", "Runner.step", ("self", "logits", "spec"), why="w"),
        Seam("fakevllm.runner", "Runner.step", contains=(".propose(", "'custom'"), why="w"),
        Seam("fakevllm.runner", "Runner.batch", ("self",), why="w"),
        Seam("fakevllm.gone", "thing", why="w"),
    )
    monkeypatch.setattr(seams, "SEAMS", wrong)
    problems = source_problems(tmp_path)
    expected = [
        "Runner.missing: not found; srt-agent needs it: w",
        "Runner.step: takes ('self', 'logits', 'spec', 'extra'), expected ('self', 'logits', 'spec')",
        "Runner.step: no longer contains \"'custom'\"",
        "Runner.batch: is not a function",
        "fakevllm.gone.thing: module fakevllm.gone not found",
    ]
    assert len(problems) == len(expected) and all(e in line for e, line in zip(expected, problems)), problems

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(seams, "SEAMS", declared)
    import fakevllm.runner as runner

    original = runner.Runner.step

    @functools.wraps(original)
    def step(self, *args, **kwargs):  # as srt-agent's plugin wraps vLLM's methods
        return original(self, *args, **kwargs)

    monkeypatch.setattr(runner.Runner, "step", step)
    try:
        assert installed_problems() == []
        monkeypatch.setattr(seams, "SEAMS", wrong[:4])
        assert len(installed_problems()) == 4
    finally:
        for name in ("fakevllm.runner", "fakevllm"):
            sys.modules.pop(name, None)


@pytest.mark.slow
def test_installed_vllm_keeps_every_seam():
    pytest.importorskip("vllm")
    assert installed_problems() == []


def test_seams_module_imports_the_standard_library_only():
    """The engine checks the installed vLLM with it before importing vLLM itself."""
    tree = ast.parse(Path(seams.__file__).read_text())
    imported = {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    assert {name.split(".")[0] for name in imported} - {"__future__"} <= sys.stdlib_module_names


def test_fetching_checks_the_listing_and_the_hash_and_keeps_python_only(tmp_path, monkeypatch):
    """Without the network: the sdist is picked by name from a PEP 691 listing, a wrong sha256 or an
    unreachable PyPI raises SourcesUnavailable, and only vllm/**/*.py is extracted, whole or not at all."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in {
            "vllm-9.9.9/vllm/__init__.py": b"",
            "vllm-9.9.9/vllm/v1/runner.py": b"x = 1\n",
            "vllm-9.9.9/vllm/kernel.cu": b"",
            "vllm-9.9.9/setup.py": b"",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    sdist = buffer.getvalue()
    good, bad = hashlib.sha256(sdist).hexdigest(), "0" * 64
    sha, downloads = {"value": good}, []

    def pypi(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/simple/vllm/":
            assert request.headers["accept"] == fetch.SIMPLE_JSON
            url = "https://files.example/vllm-{}.tar.gz"
            files = [
                {"filename": f"vllm-{v}.tar.gz", "url": url.format(v), "hashes": {"sha256": sha["value"]}}
                for v in ("9.9.8", "9.9.9")
            ]
            return httpx.Response(200, json={"files": files})
        assert request.url.path == "/vllm-9.9.9.tar.gz"
        downloads.append(request.url)
        return httpx.Response(200, content=sdist)

    real_client = httpx.Client
    monkeypatch.setattr(fetch.httpx, "Client", lambda **kw: real_client(transport=httpx.MockTransport(pypi), **kw))
    monkeypatch.setattr(fetch, "cache_root", lambda: tmp_path / "cache")
    with pytest.raises(SourcesUnavailable, match="lists no vllm-1.0.0.tar.gz"):
        vllm_sources("1.0.0")
    sha["value"] = bad
    with pytest.raises(SourcesUnavailable, match="sha256"):
        vllm_sources("9.9.9")
    assert not (tmp_path / "cache" / "9.9.9").exists() and not list((tmp_path / "cache").iterdir())
    sha["value"] = good
    root = vllm_sources("9.9.9")
    assert root == tmp_path / "cache" / "9.9.9"
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == [
        "vllm/__init__.py",
        "vllm/v1/runner.py",
    ]
    assert vllm_sources("9.9.9") == root and len(downloads) == 2  # the bad one and the good one: then cached

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("no route to pypi.org", request=request)

    monkeypatch.setattr(
        fetch.httpx, "Client", lambda **kw: real_client(transport=httpx.MockTransport(unreachable), **kw)
    )
    with pytest.raises(SourcesUnavailable, match="could not fetch vllm 9.9.7"):
        vllm_sources("9.9.7")
