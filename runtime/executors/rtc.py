"""Real-time chunking (Black, Galliker, Levine 2025, arXiv 2506.07339) as the executors use it: the prefix
weights and the guidance weight, re-exported from :mod:`policylink.policies.common.rtc` (numpy only), where the
policy-side correction (:func:`~policylink.policies.common.rtc.rtc_guidance`, an autograd guidance hook) lives."""

from __future__ import annotations

from policylink.policies.common.rtc import guidance_scale, inpaint_weights, rtc_weights

__all__ = ["guidance_scale", "inpaint_weights", "rtc_weights"]
