"""Maps each top-level source folder to a subpackage of the ``policylink`` namespace.

``adapters/`` is ``policylink.adapters``, ``policies/diffusion/`` is ``policylink.policies.diffusion``,
and so on; ``configs/`` is ``policylink.configs`` (the shipped YAML configs, package data). Everything else lives
in pyproject.toml.
"""

from setuptools import find_packages, setup

PARTS = (
    "adapters",
    "policies",
    "sim",
    "real",
    "data",
    "runtime",
    "train",
    "evaluate",
    "serve",
    "plugins",
    "cli",
    "configs",
)
# Files a wheel must carry besides the code: each folder of them is a (data) package of its own, so setuptools
# neither warns that it is "absent from the packages configuration" nor drops it. A test builds the wheel.
PACKAGE_DATA = {
    "policylink.sim.mujoco.assets": ["*.xml"],  # MJCF of the MuJoCo tasks
    "policylink.sim.mujoco.gaps": ["*.yaml"],  # reality-gap presets (--gap NAME)
    "policylink.sim.genesis.assets": ["*.xml"],
    "policylink.configs.train": ["*.yaml", "*.json"],  # `policylink demo`, `--config <name>` from an install
    "policylink.configs.eval": ["*.yaml"],
    "policylink.configs.base": ["*.yaml"],  # the files the train configs inherit from (base:)
}

packages = []
package_dir = {}
for part in PARTS:
    package_dir[f"policylink.{part}"] = part
    packages.append(f"policylink.{part}")
    packages += [f"policylink.{part}.{sub}" for sub in find_packages(where=part)]
packages += [name for name in PACKAGE_DATA if name not in packages]

setup(
    packages=packages,
    package_dir=package_dir,
    package_data=PACKAGE_DATA,
    include_package_data=True,
)
