"""policylink.adapters."""
