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


def test_ci_runs_the_readme_commands(repo):
    main_job, tests = readme_commands(repo)
    cpu = (repo / "ci" / "cpu.sh").read_text()
    live = [ln.strip() for ln in cpu.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert tests in live, "ci/cpu.sh must run the README test command verbatim"
    assert "exit 1" in cpu and "-eq 5" in cpu  # zero collected tests fails the job
    # The main job runs from the test command's install: its part after `pip install . && `, verbatim.
    install, _, job = main_job.partition(" && ")
    assert install == "pip install ." and job in live, main_job
    assert live.index(job) > live.index(tests)
    run = (repo / ".ci" / "run").read_text()
    assert "bash ci/cpu.sh" in run


def test_ci_installs_without_a_cuda_compiler(repo):
    # ci/cpu.sh hides what CMake's CUDA detection looks at (CUDACXX, nvcc on PATH, CUDA_PATH), then fails unless
    # the install is the host-only build.
    cpu = (repo / "ci" / "cpu.sh").read_text()
    for var in ("CUDACXX", "CUDA_PATH", "CMAKE_ARGS"):
        assert re.search(rf"^unset .*\b{var}\b", cpu, flags=re.M), var
    assert "command -v nvcc" in cpu and "python -m nccl_tide" in cpu and "CUDA build: no" in cpu


def test_readme_states_build_times_and_the_switch(repo):
    setup = (repo / "README.md").read_text().split("## Set-up", 1)[1].split("\n## ", 1)[0]
    assert "TIDE_BUILD_CUDA=OFF" in setup and "python -m nccl_tide" in setup
    assert re.search(r"test command takes about \d+ minutes", setup), setup
