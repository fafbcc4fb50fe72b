"""policylink's tasks on genesis-world (optional ``genesis`` extra, CPU backend): ``genesis_reach`` and
``genesis_pick_place``, same EnvSpec and scripted experts as the MuJoCo ``reach`` and ``pick_place``."""
