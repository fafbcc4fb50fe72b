"""policylink's MuJoCo tasks (``reach``, ``push``, ``pick_place``, ``insert``, ``multitask``): a position-actuated
gantry with real contact physics on the objects, 10 Hz control, state and image observations."""
