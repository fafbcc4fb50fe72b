"""policylink.evaluate: N policies x M environments, one-policy runs, resume, reports."""
