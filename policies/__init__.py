"""policylink.policies."""
