"""The README's 'bring your own environment / policy' snippets run as written and succeed."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _byo_code() -> str:
    text = README.read_text()
    blocks = re.findall(r"<!-- example: byo -->\s*```python\n(.*?)```\s*<!-- end: byo -->", text, re.S)
    assert len(blocks) == 2, "README must hold the two 'byo' examples"
    return "\n".join(blocks)


def test_readme_byo_examples_run_and_succeed(capsys):
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(_byo_code(), str(README), "exec"), namespace)
    assert namespace["info"]["is_success"] is True
    # seed 0 starts at x = 0.27392..., so 3 steps of 0.1 m (capped) reach |x| < 0.05
    assert namespace["t"] == 2
    assert "success: True" in capsys.readouterr().out
