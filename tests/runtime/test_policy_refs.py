"""The up-front checks of policy references (policylink.evaluate.refs): a training run's folder given where its
checkpoint is meant is named, with the checkpoint folder it holds, before anything heavy is loaded."""

import pytest

from policylink.evaluate.refs import require_checkpoint_folder, require_policy_refs


def _run_folder(tmp_path):
    run = tmp_path / "runs" / "act"
    (run / "checkpoints" / "last").mkdir(parents=True)
    return run


def test_a_run_folder_given_for_its_checkpoint_names_checkpoints_last(tmp_path):
    run = _run_folder(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        require_policy_refs([("act", str(run))], ["push"], field="policies")
    assert str(err.value) == (
        f"policies: checkpoint folder not found: {run} (a training run: did you mean {run}/checkpoints/last?) "
        "(policylink train writes <output_dir>/checkpoints/last)"
    )
    with pytest.raises(FileNotFoundError, match=rf"^checkpoint: .*did you mean {run}/checkpoints/last\?"):
        require_checkpoint_folder(str(run), "checkpoint")


def test_a_checkpoint_folder_passes(tmp_path):
    run = _run_folder(tmp_path)
    last = run / "checkpoints" / "last"
    require_policy_refs([("act", str(last))], ["push"], field="policies")
    require_checkpoint_folder(str(last), "checkpoint")
    (run / "config.json").write_text("{}")  # a folder with its own config is a checkpoint, whatever it holds
    require_policy_refs([("act", str(run))], ["push"], field="policies")
