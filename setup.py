"""Maps each top-level source folder to a subpackage of the ``policylink`` namespace.

``adapters/`` is ``policylink.adapters``, ``policies/diffusion/`` is ``policylink.policies.diffusion``,
and so on. Everything else lives in pyproject.toml.
"""

from setuptools import find_packages, setup

PARTS = ("adapters", "policies", "sim", "real", "data", "runtime", "train")

packages = []
package_dir = {}
for part in PARTS:
    package_dir[f"policylink.{part}"] = part
    packages.append(f"policylink.{part}")
    packages += [f"policylink.{part}.{sub}" for sub in find_packages(where=part)]

setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"policylink.sim": ["**/*.xml", "**/*.png", "**/*.stl"]},
    include_package_data=True,
)
