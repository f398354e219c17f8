"""`pip install .` (not editable) gives a working tuner: every package and every search space.

Builds a wheel from a copy of the project's sources (so the checkout stays clean and nothing
outside the listed sources can leak in), installs it into a fresh virtualenv (`--no-deps`: nothing
is fetched) and, from a folder outside the repository, imports the packages from the virtualenv
and loads every family's search space for every backend through importlib.resources.

The dependencies (torch, triton, PyYAML, ijson, ...) come from the interpreter running the test:
the virtualenv gets a .pth file naming that interpreter's sys.path directories, whatever they are
(the system's site-packages, a user's virtualenv, a PYTHONPATH folder). `--system-site-packages`
would see the base interpreter's packages only, not those of a virtualenv the suite runs in.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "tuner", "tuner_kernels", "search_spaces")

CHECK = r"""
import json, sys
import tuner_kernels as kernels, search_spaces, tuner, tuner.cli, tuner.harvest, tuner.runtime, tuner.search
from tuner import spaces
out = {"files": {m.__name__: m.__file__ for m in (kernels, search_spaces, tuner)}, "spaces": {}}
for family in spaces.family_names():
    for backend in spaces.BACKENDS:
        space = spaces.space_for(family, backend)
        out["spaces"][f"{family}/{backend}"] = space.size()
print(json.dumps(out))
"""


def run(cmd, **kwargs):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def dependency_dirs() -> list[str]:
    """The folders this interpreter imports from, less the checkout: where the dependencies are,
    whether in the system's site-packages, a virtualenv or a PYTHONPATH folder."""
    root = ROOT.resolve()
    out = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if not path.is_dir() or path == root or root in path.parents or str(path) in out:
            continue
        out.append(str(path))
    return out


def see_this_interpreters_packages(python: Path) -> None:
    """Append this interpreter's import folders to the virtualenv's sys.path (after its own
    site-packages, so the installed wheel comes first). Plain folder lines: the .pth files in those
    folders (an editable install of this project among them) are not run."""
    proc = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               env={"PATH": "/usr/bin:/bin"})
    site_packages = Path(proc.stdout.strip())
    site_packages.mkdir(parents=True, exist_ok=True)
    (site_packages / "_parent_interpreter.pth").write_text("\n".join(dependency_dirs()) + "\n")


def test_the_wheel_carries_every_package_and_search_space(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", dist, source])
    (wheel,) = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    yaml_files = sorted(p.name for p in (ROOT / "search_spaces").glob("*.yaml"))
    assert len(yaml_files) >= 3
    for name in yaml_files:
        assert f"search_spaces/{name}" in names, sorted(names)
    for package in ("tuner", "tuner_kernels", "search_spaces", *sorted(
            str(p.parent.relative_to(ROOT)).replace("/", ".")
            for p in (ROOT / "tuner").glob("*/__init__.py"))):
        assert f"{package.replace('.', '/')}/__init__.py" in names, (package, sorted(names))
    assert not any(n.startswith("tests/") for n in names)

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    see_this_interpreters_packages(python)
    # --ignore-installed: this environment may hold the project installed editable; the wheel
    # goes into the virtualenv beside it, which comes first on the virtualenv's sys.path.
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
         "--ignore-installed", wheel])

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = run([python, "-c", CHECK], cwd=elsewhere, env=env)
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    site = str(venv.resolve())
    for module, path in found["files"].items():
        assert str(Path(path).resolve()).startswith(site), (module, path)
    families = [p.removesuffix(".yaml") for p in yaml_files]
    assert sorted(found["spaces"]) == sorted(f"{f}/{b}" for f in families
                                            for b in ("cuda", "hip", "dcu"))
    assert all(size > 1 for size in found["spaces"].values()), found["spaces"]
    print(f"wheel {wheel.name}: {len(names)} files; spaces loaded outside the repo: "
          f"{found['spaces']}")

    # The console script works from there too.
    proc = run([venv / "bin" / "tuner", "estimate", "--saving-us", "3.1", "--calls-per-step", "48",
                "--step-ms", "44"], cwd=elsewhere, env=env)
    assert "saving per token: 148.8 us" in proc.stdout


def test_no_other_installed_distribution_ships_our_top_level_packages():
    """A top-level package name that another installed distribution ships too shadows ours for
    whichever comes first on sys.path: Hugging Face's `kernels` (a dependency of transformers
    from 5.25) once shadowed this project's kernel package of that name, and the `tuner` console
    script died on import. Here every name we ship is ours alone."""
    import importlib.metadata

    shipped = importlib.metadata.packages_distributions()
    for name in ("tuner", "tuner_kernels", "search_spaces"):
        others = sorted(set(shipped.get(name, [])) - {"kernel-tuner-service"})
        assert not others, f"the top-level package {name!r} is also shipped by {others}"
