"""Every example runs as written (the README points newcomers at them)."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("llama_cpp")

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def run(name, *args, stdin=None):
    r = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                       input=stdin, timeout=300)
    return r


@pytest.mark.parametrize("name, args, stdin, expect", [
    ("basic_generation.py", (), None, "acceptance"),
    ("custom_callbacks.py", (), None, "P(next | 0)"),
    ("llama_draft_model.py", (), None, "acceptance_rate"),
    ("streaming_chat.py", (), "Name a colour.\n", ""),
    ("compare_speed.py", ("-n", "8", "--turns", "1"), None, "recommended"),
])
def test_example_runs(name, args, stdin, expect):
    r = run(name, *args, stdin=stdin)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() and expect in r.stdout


def test_the_llama_cpp_server_example_says_what_to_install():
    if importlib.util.find_spec("fastapi") is not None:
        pytest.skip("fastapi is installed: the example would start llama-cpp-python's server")
    r = run("llama_cpp_server_with_draft.py")
    assert r.returncode == 1 and "pip install fastapi" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_readmes_python_runs_as_written(tmp_path):
    """The README's Python blocks, in order, in one fresh process."""
    import re
    readme = (EXAMPLES.parent / "README.md").read_text()
    code = "\n".join(re.findall(r"```python\n(.*?)```", readme, re.S))
    script = tmp_path / "readme.py"
    script.write_text(code + "\nprint('README-DONE', r.finish_reason, len(r.sources) == len(r.tokens))\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "README-DONE" in r.stdout and r.stdout.rstrip().endswith("True")
    assert "predicted" in r.stdout  # the why line
