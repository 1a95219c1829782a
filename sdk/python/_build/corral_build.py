"""A PEP 517 build backend on the standard library alone, for the corral
SDK: it packs the ``corral`` package into a pure-Python wheel (and an
sdist, and a PEP 660 editable wheel), reading name, version, description
and requires-python from pyproject.toml. It exists so that
``pip install ./sdk/python`` works offline: pip's isolated build would
otherwise fetch setuptools from an index."""

import base64
import hashlib
import io
import os
import tarfile
import time
import zipfile

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "corral"


def _project():
    path = os.path.join(ROOT, "pyproject.toml")
    if tomllib is not None:
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]
    # A [project] table of plain "key = 'string'" lines is all this file has.
    out, section = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]")
            elif section == "project" and "=" in line and not line.startswith("#"):
                k, v = line.split("=", 1)
                out[k.strip()] = v.strip().strip("\"'")
    return out


def _meta():
    p = _project()
    name, version = p["name"], p["version"]
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if p.get("description"):
        lines.append(f"Summary: {p['description']}")
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    return name, version, "\n".join(lines) + "\n"


def _files():
    """The package's .py files, as (path in the archive, path on disk)."""
    out = []
    for d, dirs, names in os.walk(os.path.join(ROOT, PACKAGE)):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for n in sorted(names):
            if n.endswith(".py") or n == "py.typed":
                full = os.path.join(d, n)
                out.append((os.path.relpath(full, ROOT).replace(os.sep, "/"), full))
    return out


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arc},sha256={digest},{len(data)}"


def _wheel(wheel_directory, entries):
    name, version, metadata = _meta()
    dist_info = f"{name}-{version}.dist-info"
    filename = f"{name}-{version}-py3-none-any.whl"
    entries = list(entries) + [
        (f"{dist_info}/METADATA", metadata.encode()),
        (f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: corral_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{dist_info}/top_level.txt", (PACKAGE + "\n").encode()),
    ]
    record = [_record_line(arc, data) for arc, data in entries] + [f"{dist_info}/RECORD,,"]
    entries.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries:
            info = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return filename


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = []
    for arc, full in _files():
        with open(full, "rb") as f:
            entries.append((arc, f.read()))
    return _wheel(wheel_directory, entries)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file puts the source tree on sys.path.
    return _wheel(wheel_directory, [(f"_{PACKAGE}_editable.pth", (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    name, version, metadata = _meta()
    base = f"{name}-{version}"
    filename = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        def add(arc, data):
            info = tarfile.TarInfo(f"{base}/{arc}")
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        add("PKG-INFO", metadata.encode())
        for rel in ["pyproject.toml", "_build/corral_build.py"]:
            with open(os.path.join(ROOT, rel), "rb") as f:
                add(rel, f.read())
        for arc, full in _files():
            with open(full, "rb") as f:
                add(arc, f.read())
        tests = os.path.join(ROOT, "tests")
        for n in sorted(os.listdir(tests)) if os.path.isdir(tests) else []:
            if n.endswith(".py"):
                with open(os.path.join(tests, n), "rb") as f:
                    add("tests/" + n, f.read())
    return filename
