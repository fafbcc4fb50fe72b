"""policylink.data."""
