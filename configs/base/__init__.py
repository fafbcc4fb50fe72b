"""Base files the shipped train configs inherit from (``base:`` in a config, see
:func:`policylink.configs.load_config`)."""
