"""The wheel the image installs corral from (scripts/build_image.py) carries every file of `corral/` and
`services/` the repository tracks: a service that reads a file beside its modules (the web UI its templates
and static files, the driver its price list) finds it in the pod as it does in a checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.helm.chart import REPO


def test_the_wheel_carries_every_tracked_file_of_the_packages(tmp_path: Path) -> None:
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "corral", "services"], check=True,
                             capture_output=True, text=True).stdout.split()
    assert any(path.startswith("services/web/templates/") for path in tracked)
    # Built as scripts/build_image.py builds it, from a copy: a checkout's build/ may hold files an earlier
    # build copied there, which setuptools would put in this wheel too.
    source = tmp_path / "source"
    for path in [*tracked, "pyproject.toml", "README.md"]:
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / path, source / path)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    [wheel] = (tmp_path / "dist").glob("corral-*.whl")
    carried = set(zipfile.ZipFile(wheel).namelist())
    assert [path for path in tracked if path not in carried] == []
