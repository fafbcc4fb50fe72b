"""policylink.train: the one trainer (:mod:`policylink.train.trainer`) and the objectives it drives."""
