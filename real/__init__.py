"""policylink.real."""
