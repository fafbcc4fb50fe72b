"""policylink.sim."""
