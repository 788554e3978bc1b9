"""Every example in examples/ runs on CPU, in seconds, without error and without a torchmx
warning."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
CPU_LIMIT_S = 180
# The training examples take a step count: a few steps run every line of them (the default
# counts are for a reader who wants a trained model).
ARGS = {"qat.py": ["--steps", "20"], "qat_distill_minilm.py": ["--steps", "2"]}


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {"quickstart.py", "mx_tensor_basics.py"}


# One interpreter imports torch and torchmx (~8 s of CPU) once, and torch._dynamo (~3 s, which
# torch.compile and torch.optim import) after them, then runs each example in a fork of itself:
# each starts from the state `python3 example.py` has after those imports, and none sees what
# another did. Every warning torchmx raises (from its own modules or, through
# stacklevel, attributed to the example's line), at import too, is an error: examples show none.
RUN_FORKED_WITHOUT_TORCHMX_WARNINGS = """
import json, os, resource, runpy, sys, traceback, warnings
warnings.filterwarnings('error', module=r'(torchmx|__main__)($|\\.)')
import torch, torchmx
import torch._dynamo
for request in sys.stdin:
    path, args, stdout, stderr, cwd = json.loads(request)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd, name in ((1, stdout), (2, stderr)):
            os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        os.chdir(cwd)
        resource.setrlimit(resource.RLIMIT_CPU, (%d, %d))  # CPU time: a busy machine is no failure
        sys.argv = [path, *args]  # the example's own argv, as `python3 example.py ...` gives it
        code = 0
        try:
            runpy.run_path(path, run_name='__main__')
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
""" % (CPU_LIMIT_S, CPU_LIMIT_S)


@pytest.fixture(scope="module")
def run_example():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(  # this checkout's torchmx, not an installed one
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    parent = subprocess.Popen([sys.executable, "-c", RUN_FORKED_WITHOUT_TORCHMX_WARNINGS],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def run(path, tmp_path):
        """(exit code, stdout, stderr) of the example run in tmp_path."""
        out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        request = [str(path), ARGS.get(path.name, []), str(out), str(err), str(tmp_path)]
        parent.stdin.write(json.dumps(request) + "\n")
        parent.stdin.flush()
        answer = parent.stdout.readline()
        assert answer, "the interpreter that runs the examples died (it printed why above)"
        read = lambda p: p.read_text() if p.exists() else ""  # noqa: E731
        return int(answer), read(out), read(err)

    yield run
    parent.stdin.close()
    parent.wait(timeout=60)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path, tmp_path, run_example):
    returncode, stdout, stderr = run_example(path, tmp_path)
    assert returncode == 0, stderr[-3000:]
    assert stdout.strip(), "an example should show what it did"
