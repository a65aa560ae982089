"""`make wheelhouse` (`python -m release.wheelhouse`): every wheel that dit-worker and its extras need
beyond the torch a node already has, for a named Python and platform, so that a node with no
internet (torch and CUDA only) installs with

    pip install --no-index --find-links wheelhouse 'dit-worker[fp8,tools]'

How it works, with pip alone:
1. dit-worker itself is built as a wheel into the wheelhouse.
2. pip resolves `dit-worker[extras]` for the target (`--python-version`, manylinux up to `--glibc`
   on `--arch`, binary wheels only) without installing anything (`--dry-run --report`). pip cannot be
   told that torch is already there, and would walk into torch's CUDA libraries (gigabytes, and a
   different set for each CUDA build). So it is given a stand-in torch: a metadata-only wheel of the
   given version with a local label (`2.11.0+wheelhouse`) that only a temporary folder holds, and a
   constraint that admits nothing else. Resolution stops at torch; whatever torch needs is the node's.
3. Packages the node already has (`--have`, a `pip freeze` of the node) are left out when their
   version satisfies every requirement on them in the resolved set; a bare name (version unknown)
   is trusted against version ranges, not against exact pins.
4. The resolved files are downloaded from the URLs the resolve chose, with their hashes checked
   (`--require-hashes`), wheels of other versions are removed, and `manifest.json` records the
   target, what is in and what was left out.

The stand-in never reaches the wheelhouse: on the node, pip finds the real torch installed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from urllib.parse import unquote

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
STAND_IN = "wheelhouse"  # the local version label that marks the stand-in torch
DEFAULT_EXTRAS = "fp8,tools"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m release.wheelhouse", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("wheelhouse"))
    p.add_argument("--python-version", default="3.12", help="the node's Python, e.g. 3.12")
    p.add_argument("--arch", default="x86_64", choices=("x86_64", "aarch64"))
    p.add_argument("--glibc", default="2.28", help="the node's glibc (ldd --version); manylinux wheels up to it")
    p.add_argument("--platform", action="append", default=[], metavar="TAG",
                   help="exact platform tags instead of the manylinux series (repeatable)")
    p.add_argument("--torch", default=_installed_torch(), required=_installed_torch() is None,
                   help="the torch version the node has (default: the one installed here)")
    p.add_argument("--extras", default=DEFAULT_EXTRAS, help="dit-worker extras, comma-separated ('' for none)")
    p.add_argument("--have", type=Path, help="`pip freeze` of the node: what it has is left out where it fits")
    p.add_argument("--project", type=Path, default=REPO, help="the dit-worker source tree")
    args = p.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        p.error(f"--python-version: expected 3.N, got {args.python_version!r}")
    target = Target(args.python_version, args.platform or manylinux_tags(args.arch, args.glibc), args.arch)
    manifest = build(args.out, target, args.torch, _extras(args.extras), args.project,
                     read_have(args.have) if args.have else {})
    size = sum(w["bytes"] for w in manifest["wheels"]) / 2**20
    print(f"{len(manifest['wheels'])} wheels, {size:.0f} MiB in {args.out} for cp{target.nodot} "
          f"{target.platforms[0]}.., torch {args.torch} left to the node"
          + (f"; {len(manifest['left_out'])} the node has left out" if manifest["left_out"] else ""))
    print(f"on the node:  pip install --no-index --find-links {args.out} '{manifest['install']}'")
    return 0


class Target:
    """The node's interpreter and platform, as pip's --python-version/--abi/--platform and as the
    environment that requirement markers are evaluated in."""

    def __init__(self, python_version: str, platforms: list[str], arch: str) -> None:
        self.python_version = python_version
        self.nodot = python_version.replace(".", "")
        self.platforms = platforms
        self.arch = arch

    def pip_args(self) -> list[str]:
        out = ["--only-binary=:all:", "--python-version", self.python_version, "--implementation", "cp",
               "--abi", f"cp{self.nodot}"]
        for tag in self.platforms:
            out += ["--platform", tag]
        return out

    def marker_env(self) -> dict[str, str]:
        env = default_environment()
        env.update(python_version=self.python_version, python_full_version=f"{self.python_version}.0",
                   implementation_name="cpython", implementation_version=f"{self.python_version}.0",
                   platform_python_implementation="CPython", sys_platform="linux", platform_system="Linux",
                   os_name="posix", platform_machine=self.arch)
        return env


def manylinux_tags(arch: str, glibc: str) -> list[str]:
    """Every manylinux tag a node with this glibc accepts, newest first (with the legacy aliases)."""
    major, minor = (int(v) for v in glibc.split("."))
    if major != 2 or minor < 17:
        raise SystemExit(f"--glibc: expected 2.17 or newer, got {glibc}")
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{arch}" for m, name in legacy.items() if m <= minor and (arch == "x86_64" or m == 17)]


def build(out: Path, target: Target, torch_version: str, extras: list[str], project: Path,
          have: dict[str, str | None]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    project_wheel = build_project(project, out)
    root = f"dit-worker[{','.join(extras)}]" if extras else "dit-worker"
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        tmp = Path(tmp)
        # By path: a same-named project on the index must never be taken for this one.
        report = resolve(f"{root} @ {project_wheel.resolve().as_uri()}", target, torch_version, out, tmp)
        items = [i for i in report["install"] if canonicalize_name(i["metadata"]["name"]) != "torch"]
        specs = requirements_on(items, extras, target.marker_env())
        left_out = {n: v for n, v in have.items() if n in specs and n != "torch" and fits(v, specs[n])}
        wanted = [i for i in items if canonicalize_name(i["metadata"]["name"]) not in left_out
                  and canonicalize_name(i["metadata"]["name"]) != "dit-worker"]
        download(wanted, target, out, tmp)
    files = {project_wheel.name, *(_filename(i) for i in wanted)}
    for stale in out.glob("*.whl"):  # other versions from an earlier run: one of each is enough
        if stale.name not in files:
            stale.unlink()
    manifest = {"python": target.python_version, "platforms": target.platforms, "torch": torch_version,
                "extras": extras, "install": root,
                "wheels": [{"file": f, "bytes": (out / f).stat().st_size} for f in sorted(files)],
                "left_out": {n: v or "any" for n, v in sorted(left_out.items())}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def build_project(project: Path, out: Path) -> Path:
    for old in out.glob("dit_worker-*.whl"):
        old.unlink()
    # setuptools reuses build/ and would ship modules deleted since its last run.
    shutil.rmtree(project / "build", ignore_errors=True)
    _pip("wheel", "--no-deps", "--wheel-dir", str(out), str(project))
    wheels = list(out.glob("dit_worker-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"building dit-worker gave {len(wheels)} wheels in {out}")
    return wheels[0]


def resolve(requirement: str, target: Target, torch_version: str, links: Path, tmp: Path) -> dict:
    stand_in = tmp / "stand-in"
    stand_in.mkdir()
    torch_wheel = stand_in_torch(torch_version, stand_in)
    constraints = tmp / "constraints.txt"
    constraints.write_text(f"torch=={torch_wheel}\n")
    report = tmp / "report.json"
    _pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
         "--target", str(tmp / "unused"), *target.pip_args(), "--find-links", str(links),
         "--find-links", str(stand_in), "--constraint", str(constraints), requirement)
    return json.loads(report.read_text())


def stand_in_torch(version: str, folder: Path) -> str:
    """A wheel that is only metadata: torch `version`+wheelhouse with no requirements."""
    local = f"{Version(version).public}+{STAND_IN}"
    info = f"torch-{local}.dist-info"
    with zipfile.ZipFile(folder / f"torch-{local}-py3-none-any.whl", "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {local}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: dit-worker\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return local


def requirements_on(items: list[dict], root_extras: list[str], env: dict[str, str]) -> dict[str, list[SpecifierSet]]:
    """For each resolved package, the version specifiers that the others (as resolved, with the
    extras they were asked for) place on it. Extras spread, so this runs to a fixed point."""
    extras = {"dit-worker": set(root_extras)}
    while True:
        specs: dict[str, list[SpecifierSet]] = {canonicalize_name(i["metadata"]["name"]): [] for i in items}
        grown = False
        for item in items:
            asked = extras.get(canonicalize_name(item["metadata"]["name"]), set())
            for text in item["metadata"].get("requires_dist", []):
                req = Requirement(text)
                if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in asked | {""}):
                    continue
                name = canonicalize_name(req.name)
                specs.setdefault(name, []).append(req.specifier)
                if not req.extras <= extras.setdefault(name, set()):
                    extras[name] |= req.extras
                    grown = True
        if not grown:
            return specs


def fits(version: str | None, specs: list[SpecifierSet]) -> bool:
    """Whether a package the node has at `version` (None: a bare name, version unknown) can stand
    for the resolved one. A bare name is trusted against ranges, never against an exact pin
    (alt-profanity-check pins scikit-learn and joblib): a wrong guess there would only show on the
    node, as an install that fails."""
    if version is None:
        return not any(s.operator in ("==", "===") and "*" not in s.version for spec in specs for s in spec)
    return all(s.contains(version, prereleases=True) for s in specs)


def read_have(path: Path) -> dict[str, str | None]:
    """`name==version` lines (pip freeze); a bare name means "present, any version"; the rest
    (comments, editable installs, URLs) is skipped."""
    have: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-") or "@" in line:
            continue
        name, _, version = line.partition("==")
        have[canonicalize_name(name.strip())] = version.strip() or None
    return have


def download(items: list[dict], target: Target, out: Path, tmp: Path) -> None:
    pinned = tmp / "requirements.txt"
    pinned.write_text("\n".join(pinned_requirements(items)) + "\n")
    _pip("download", "--no-deps", "--require-hashes", "--quiet", *target.pip_args(), "--dest", str(out),
         "--requirement", str(pinned))


def pinned_requirements(items: list[dict]) -> list[str]:
    """Each resolved file by its URL and sha256: pip fetches exactly what the resolve chose, without
    asking the indexes again for each name (that took two thirds of the download's time here)."""
    lines = []
    for item in items:
        digest = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        if digest is None:
            raise SystemExit(f"{item['metadata']['name']}: the index gave no sha256 to check the download against")
        lines.append(f"{item['metadata']['name']} @ {item['download_info']['url']} --hash=sha256:{digest}")
    return lines


def _filename(item: dict) -> str:
    return unquote(item["download_info"]["url"].rsplit("/", 1)[-1].split("#", 1)[0])


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        # pip's own message names the package that has no wheel for the target, or the conflict.
        errors = [l for l in proc.stderr.splitlines() if "is ignored" not in l]
        raise SystemExit(f"pip {args[0]} failed ({proc.returncode}):\n" + "\n".join(errors[-30:]))


def _extras(text: str) -> list[str]:
    return sorted({e.strip() for e in text.split(",") if e.strip()})


def _installed_torch() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return Version(version("torch")).public
    except PackageNotFoundError:  # then --torch is required
        return None


if __name__ == "__main__":
    sys.exit(main())
