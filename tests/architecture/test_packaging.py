"""What the wheel ships beside the code: the license it declares, the typing marker, and the
version, written once (pyproject.toml) and read back from the installed metadata."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import dpone_native_transfer

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_the_license_file_is_the_license_pyproject_declares():
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_every_package_ships_py_typed():
    for package in ("dpone_native_transfer", "dpone_target_commit_guard", "dpone_airflow"):
        folder = ROOT / ("src" if package == "dpone_native_transfer" else "plugins") / package
        assert (folder / "py.typed").is_file(), package


def test_the_installed_distribution_declares_the_license():
    assert metadata.metadata("dpone-native-transfer")["License-Expression"] == "Apache-2.0"


def test_the_version_is_pyprojects_as_installed():
    """A stale install (pyproject changed, venv not rebuilt) or a second source both fail."""
    assert dpone_native_transfer.__version__ == PROJECT["version"]
    assert metadata.version("dpone-native-transfer") == PROJECT["version"]


def test_no_module_writes_the_version_a_second_time():
    literal = re.compile(rf"""["']{re.escape(PROJECT["version"])}["']""")
    written = [
        str(path.relative_to(ROOT))
        for folder in ("src", "plugins")
        for path in (ROOT / folder).rglob("*.py")
        if literal.search(path.read_text(encoding="utf-8"))
    ]
    assert written == []


def test_the_readme_installs_the_wheel_python_m_build_names_for_this_version():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = re.findall(r"dist/(dpone_native_transfer-[^-]+-py3-none-any\.whl)", readme)
    assert named == [f"dpone_native_transfer-{PROJECT['version']}-py3-none-any.whl"]
