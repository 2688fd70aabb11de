"""Node packages the tests run (tests/interop: the official TypeScript MCP clients;
tests/conformance: the MCP conformance suite; each with its Node 22), installed at test time
from their lock file.

``npm_install(dir)`` runs ``npm ci`` in ``dir`` only when its ``package-lock.json`` or
``package.json`` changed since the last install there (a stamp in ``node_modules`` keeps their
hash), one install at a time however many test processes ask at once (a file lock next to them).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

STAMP = ".carmy-installed"  # in node_modules: npm ci empties it first, so a failed install leaves none
LOCK = ".npm-install.lock"  # next to package.json (git-ignored): node_modules is replaced by npm ci
INSTALL_TIMEOUT_S = 600.0


def npm_install(package_dir: Path) -> Path:
    """``package_dir``'s node_modules, installed by ``npm ci`` as its lock file says."""
    node_modules = package_dir / "node_modules"
    wanted = _fingerprint(package_dir)
    if _installed(node_modules) == wanted:
        return node_modules
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(f"npm is not installed: it installs {package_dir}'s packages for the tests")
    with _locked(package_dir / LOCK):
        if _installed(node_modules) != wanted:  # another process may have installed it meanwhile
            _run([npm, "ci", "--no-audit", "--no-fund"], package_dir)
            (node_modules / STAMP).write_text(wanted)
    return node_modules


def _fingerprint(package_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in ("package-lock.json", "package.json"):
        digest.update((package_dir / name).read_bytes())
    return digest.hexdigest()


def _installed(node_modules: Path) -> str | None:
    try:
        return (node_modules / STAMP).read_text()
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(args: list[str], cwd: Path) -> None:
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{' '.join(args)} in {cwd}: not done within {INSTALL_TIMEOUT_S:g} s") from exc
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} in {cwd} failed ({done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
