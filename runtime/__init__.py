"""policylink.runtime."""
