"""Packaging glue that pyproject.toml cannot express: the repository's top-level folders are installed as one import
namespace, `sits` (control_plane/ is `sits.control_plane`, engine/ `sits.engine`, kernels/ `sits.kernels`,
dashboards/ `sits.dashboards`). Bare `kernels`, `engine` and `dashboards` are names other packages claim (Hugging
Face's `kernels`, which transformers requires), so the folders are never importable under their own names from an
install, editable or not. Packages inside sits/ itself (sits.wire, the contract both sides import) are ordinary
subpackages. Everything else (metadata, dependencies, package data) is in pyproject.toml.
"""
from setuptools import find_packages, setup

FOLDERS = ("control_plane", "engine", "kernels", "dashboards")

packages, package_dir = ["sits", *(f"sits.{sub}" for sub in find_packages("sits"))], {"sits": "sits"}
for folder in FOLDERS:
    name = f"sits.{folder}"
    packages.append(name)
    package_dir[name] = folder
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir)
