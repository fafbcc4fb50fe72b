"""policylink.serve: policies served to clients over the wire (ZeroMQ, openpi websocket)."""
