"""README's two set-up commands, and that CI runs exactly the README's test command."""

import re


def readme_commands(repo):
    text = (repo / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    return [b.strip() for b in blocks]


def test_readme_has_exactly_two_setup_commands(repo):
    cmds = readme_commands(repo)
    assert len(cmds) == 2 and all("\n" not in c for c in cmds), cmds
    main_job, tests = cmds
    assert main_job.startswith("pip install . && tide-perf all_gather --backend host")
    assert "-c 1" in main_job
    assert tests.startswith('pip install ".[test]" && python -m pytest')


def test_ci_runs_the_readme_test_command(repo):
    tests = readme_commands(repo)[1]
    cpu = (repo / "ci" / "cpu.sh").read_text()
    live = [ln.strip() for ln in cpu.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert tests in live, "ci/cpu.sh must run the README test command verbatim"
    assert "exit 1" in cpu and "-eq 5" in cpu  # zero collected tests fails the job
    run = (repo / ".ci" / "run").read_text()
    assert "bash ci/cpu.sh" in run
