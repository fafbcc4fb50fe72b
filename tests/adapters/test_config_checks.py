"""adapters.config_checks: integer intervals (ports) and the interval form shared with require_within."""

from types import SimpleNamespace

import pytest

from policylink.adapters.config_checks import require_integers_within, require_within


@pytest.mark.parametrize("value", [70000, 0, -1, True, 80.0, "80"])
def test_integers_outside_the_interval_or_not_integers_are_named(value):
    with pytest.raises(ValueError) as e:
        require_integers_within(SimpleNamespace(port=value), port="[1, 65535]")
    assert str(e.value) == f"port: expected an integer in [1, 65535], received {value!r}"


def test_integers_inside_pass_and_require_within_keeps_its_message():
    require_integers_within(SimpleNamespace(port=1, other=65535), port="[1, 65535]", other="[1, 65535]")
    with pytest.raises(ValueError, match=r"^critic.gamma: expected a value in \(0, 1\], received 1.5$"):
        require_within(SimpleNamespace(gamma=1.5), prefix="critic.", gamma="(0, 1]")
    require_within(SimpleNamespace(gamma=1.0), gamma="(0, 1]")


@pytest.mark.parametrize("value", ["x", None, [1.0]])
def test_require_within_names_a_value_that_is_no_number(value):
    """A text-only source (``inspect-robots -E jitter_ms=x``) hands over a string: named, not a TypeError."""
    with pytest.raises(ValueError) as e:
        require_within(SimpleNamespace(jitter_ms=value), jitter_ms="[0, inf)")
    assert str(e.value) == f"jitter_ms: expected a value in [0, inf), received {value!r}"
