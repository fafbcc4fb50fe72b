"""``policylink bench`` finds benchmark scripts and runs one with its arguments."""

from policylink.cli import bench


def test_lists_and_runs_a_benchmark(tmp_path, monkeypatch, capsys):
    (tmp_path / "echo_args.py").write_text("import sys\nprint('ARGS', sys.argv[1:])\nraise SystemExit(3)\n")
    (tmp_path / "_private.py").write_text("")
    monkeypatch.setattr(bench, "BENCHMARKS_DIR", tmp_path)
    assert bench.available_benchmarks(tmp_path) == ["echo_args"]
    assert bench.main(["echo_args", "--n", "5"]) == 3
    assert "ARGS ['--n', '5']" in capsys.readouterr().out
    assert bench.main(["nope"]) == 2
    assert capsys.readouterr().err == "policylink bench: benchmark: expected one of ['echo_args'], received 'nope'\n"
    assert bench.main(["echo_arg"]) == 2
    assert capsys.readouterr().err.endswith("received 'echo_arg'; did you mean 'echo_args'?\n")
