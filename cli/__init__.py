"""policylink.cli: the `policylink` command: parse, then call the library (nothing imports it)."""
