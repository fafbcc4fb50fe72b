"""The README's robot-driver example runs as written: a one-class driver behind the safety layer."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_robot_driver_example_runs(capsys):
    text = README.read_text()
    (block,) = re.findall(
        r"<!-- example: robot-driver -->\s*```python\n(.*?)```\s*<!-- end: robot-driver -->", text, re.S
    )
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(block, str(README), "exec"), namespace)
    assert capsys.readouterr().out.strip() == "[0.2] [0.2]"
    arm = namespace["arm"]
    assert arm.safety.counts == {"limit": 1, "step": 1, "invalid": 1}
    arm.disconnect()
