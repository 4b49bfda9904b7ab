"""What the images install (`pip install .`, not editable) holds every file the packages read at run time: the UI's
templates and static files, the kernel catalogue, the CRDs. A missing one only shows in a pod, so build the wheel.
Every folder lands under the one import namespace, `sits` (control_plane/ as sits/control_plane/, ...), and nothing
at the top level that another package could claim (Hugging Face's `kernels`); sits/'s own subpackages (sits.wire) are
in it too."""
import shutil
import subprocess
import sys
import zipfile

from tests.helm.support import ROOT

PACKAGES = ("engine", "kernels", "control_plane", "dashboards")   # each lands as sits/<folder>/


def test_the_wheel_holds_every_tracked_file_of_the_packages(tmp_path):
    tracked = subprocess.run(["git", "ls-files", *PACKAGES], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    wanted = {p for p in tracked if not p.endswith(".py")}
    assert {"control_plane/web/templates/base.html", "control_plane/adapters/kernel_catalog.json", "kernels/catalog.json",
            "control_plane/adapters/deploy/kubernetes/crds/httproute.yaml"} <= wanted
    own = subprocess.run(["git", "ls-files", "sits"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()   # sits/ itself: the namespace and its own subpackages
    assert "sits/__init__.py" in own and "sits/wire/metrics.py" in own
    src = tmp_path / "src"   # setuptools writes build/ into the tree it builds: build a copy of the tracked files
    for p in tracked + own + ["pyproject.toml", "setup.py", "README.md"]:
        (src / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / p, src / p)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(src)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("sits-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert sorted(({f"sits/{p}" for p in tracked} | set(own)) - names) == []
    assert {n.split("/")[0] for n in names if not n.startswith("sits-")} == {"sits"}
