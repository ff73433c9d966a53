"""The published sources of a vLLM release, for the contract test (tests/test_vllm_contract.py).

``vllm_sources(version)`` downloads the sdist ``vllm-<version>.tar.gz`` from PyPI once (its URL and sha256
from PyPI's JSON simple API), keeps only ``vllm/**/*.py`` in ``<user cache>/srt-agent/vllm-sources/<version>/``
and returns that folder (it holds the ``vllm`` package). The folder appears whole or not at all: the files go
to a temporary folder beside it, which is then renamed. A failed download raises :class:`SourcesUnavailable`.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

import httpx
import platformdirs

SIMPLE_URL = "https://pypi.org/simple/vllm/"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"  # PEP 691
TIMEOUT = httpx.Timeout(60.0, connect=20.0)


class SourcesUnavailable(RuntimeError):
    """The sdist could not be listed, downloaded or verified."""


def cache_root() -> Path:
    return Path(platformdirs.user_cache_dir("srt-agent")) / "vllm-sources"


def sdist_file(version: str, client: httpx.Client) -> tuple[str, str]:
    """(url, sha256) of ``vllm-<version>.tar.gz`` in PyPI's listing."""
    name = f"vllm-{version}.tar.gz"
    response = client.get(SIMPLE_URL, headers={"Accept": SIMPLE_JSON})
    response.raise_for_status()
    for entry in response.json().get("files", []):
        if entry.get("filename") == name:
            sha256 = entry.get("hashes", {}).get("sha256")
            if not sha256:
                raise SourcesUnavailable(f"PyPI lists {name} without a sha256")
            return entry["url"], sha256
    raise SourcesUnavailable(f"PyPI lists no {name} at {SIMPLE_URL}")


def download(url: str, sha256: str, into: Path, client: httpx.Client) -> Path:
    """Stream `url` into the folder `into`; the file, once its sha256 is checked."""
    path, digest = into / PurePosixPath(url.split("#")[0]).name, hashlib.sha256()
    with client.stream("GET", url) as response, path.open("wb") as out:
        response.raise_for_status()
        for chunk in response.iter_bytes(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise SourcesUnavailable(f"{url}: sha256 {digest.hexdigest()} is not PyPI's {sha256}")
    return path


def extract_python(sdist: Path, version: str, into: Path) -> int:
    """Write the sdist's ``vllm/**/*.py`` under `into` (``into/vllm/...``); how many files."""
    prefix, count = PurePosixPath(f"vllm-{version}"), 0
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            path = PurePosixPath(member.name)
            if not member.isfile() or path.suffix != ".py" or ".." in path.parts or len(path.parts) < 3:
                continue
            if path.parts[0] != prefix.name or path.parts[1] != "vllm":
                continue
            target = into.joinpath(*path.parts[1:])
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            if source is not None:
                with source, target.open("wb") as out:
                    shutil.copyfileobj(source, out)
                count += 1
    return count


def vllm_sources(version: str) -> Path:
    """The folder holding vLLM `version`'s ``vllm`` package sources (fetched on first use)."""
    target = cache_root() / version
    if (target / "vllm" / "__init__.py").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{version}-") as tmp:
        work = Path(tmp)
        try:
            with httpx.Client(timeout=TIMEOUT, follow_redirects=True) as client:
                url, sha256 = sdist_file(version, client)
                sdist = download(url, sha256, work, client)
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise SourcesUnavailable(f"could not fetch vllm {version}'s sdist from PyPI: {exc!r}") from exc
        tree = work / "tree"
        if extract_python(sdist, version, tree) == 0 or not (tree / "vllm" / "__init__.py").is_file():
            raise SourcesUnavailable(f"{sdist.name} holds no vllm package sources")
        try:
            tree.rename(target)
        except OSError:  # another process put it there first
            if not (target / "vllm" / "__init__.py").is_file():
                raise
    return target
