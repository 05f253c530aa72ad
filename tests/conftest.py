"""Shared fixtures and statistics helpers.

Every test runs with its state (calibration, learned evidence, trust records,
file identities) in a temporary folder: the suite never reads or writes the
user's ``~/.cache/specgguf/state``. Models are read from the user's model
cache (scripts/setup.sh fetched them), never written there.
"""

import os

import numpy as np
import pytest
from scipy import stats

import specgguf

ALPHA = 1e-3  # significance of the chi-square tests (each at a fixed seed)

# Under qemu (scripts/test_aarch64.sh sets it) Python and numpy run about 20x
# slower. The NEON kernels are checked bit for bit against scalar there by
# cpp/test_kernels (every path, no Python); these tests then check the
# extension works on ARM, with fewer generated examples.
EMULATED = os.environ.get("SPECGGUF_EMULATED") == "1"


def examples(n):
    """Hypothesis examples for a test: ``n``, a quarter under emulation."""
    return max(25, n // 4) if EMULATED else n

# On CI (CI=true) every test must run: a missing dependency (llama_cpp,
# openai, the rpc-server binary) skips whole files, which would pass a broken
# set-up. Only these may skip there, each for a reason CI cannot change. An
# expected failure (pytest reports it as skipped) is not a skip: it ran, and is
# marked strict where it is used, so a pass fails the suite too.
CI_MAY_SKIP = {
    "tests/test_verify_exact.py::test_torch_tensors",  # torch is not installed: too large for CI
}
_CI_SKIPS: list = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail") and os.environ.get("CI") == "true":
        name = report.nodeid.split("[")[0]
        if name not in CI_MAY_SKIP:
            _CI_SKIPS.append(f"{report.nodeid}: {report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr}")


def pytest_sessionfinish(session, exitstatus):
    if _CI_SKIPS:
        print("\nconftest: on CI these tests skipped, and only CI_MAY_SKIP may:\n  " + "\n  ".join(_CI_SKIPS[:20]))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _snapshot(root):
    return {(str(p), p.stat().st_mtime_ns) for p in root.rglob("*")} if root.exists() else set()


@pytest.fixture(scope="session", autouse=True)
def session_state(tmp_path_factory):
    """State of session-wide fixtures (model loading) in a temporary folder;
    and a check, at the end, that the user's own state folder is untouched."""
    import os
    from specgguf.state import state_dir
    users = state_dir()
    seen = _snapshot(users)
    before = os.environ.get("SPECGGUF_STATE")
    os.environ["SPECGGUF_STATE"] = str(tmp_path_factory.mktemp("session-state"))
    yield
    if before is None:
        os.environ.pop("SPECGGUF_STATE", None)
    else:
        os.environ["SPECGGUF_STATE"] = before
    changed = _snapshot(users) ^ seen
    assert not changed, f"the test suite wrote the user's state folder {users}: {sorted(changed)[:5]}"


@pytest.fixture(autouse=True)
def private_state(tmp_path_factory, monkeypatch):
    """Point every state location at a fresh temporary folder, per test."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("SPECGGUF_STATE", str(state))
    return state


@pytest.fixture(params=specgguf.kernels())
def kernel(request):
    """Run a test once per kernel path this CPU can run (scalar, and avx2, avx512 or neon)."""
    before = specgguf.get_kernel()
    specgguf.set_kernel(request.param)
    yield request.param
    specgguf.set_kernel(before)


def chi2_pvalue(counts, probs):
    """Chi-square p-value, pooling bins whose expected count is below 5."""
    if np.any((probs == 0) & (counts > 0)):
        return 0.0  # an outcome the law forbids
    n = counts.sum()
    exp = probs * n
    order = np.argsort(exp)
    obs_b, exp_b, acc_o, acc_e = [], [], 0.0, 0.0
    for i in order:
        acc_o += counts[i]
        acc_e += exp[i]
        if acc_e >= 5:
            obs_b.append(acc_o)
            exp_b.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0 and exp_b:
        obs_b[-1] += acc_o
        exp_b[-1] += acc_e
    if len(obs_b) < 2:  # a test that cannot fail is a defect: ask for more draws
        raise ValueError(f"{n:.0f} draws leave fewer than two bins with an expected count of 5: "
                         "too few for a chi-square test")
    exp_b = np.array(exp_b) * (n / np.sum(exp_b))  # float rounding of the law
    return stats.chisquare(obs_b, exp_b).pvalue


def sample_counts(draw, n, size):
    """Counts of ``n`` draws of ``draw()`` over ``range(size)``."""
    counts = np.zeros(size)
    for _ in range(n):
        counts[draw()] += 1
    return counts


# ---- the real SmolLM2 pair from models.lock (fetched by scripts/setup.sh) ----

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle stays upright while moving.",
    "Write a detailed essay about the history of the printing press.",
]


def msgs(prompt):
    return [{"role": "user", "content": prompt}]


def load_model(name, n_ctx=1024):
    import llama_cpp
    from specgguf.llama import models
    return llama_cpp.Llama(str(models.fetch(name)), n_ctx=n_ctx, n_threads=2, n_threads_batch=2, verbose=False)


@pytest.fixture(scope="session")
def target():
    pytest.importorskip("llama_cpp")
    return load_model("smollm2-135m-f32")


@pytest.fixture(scope="session")
def draft():
    pytest.importorskip("llama_cpp")
    return load_model("smollm2-135m-q4_1")


@pytest.fixture(scope="session")
def poor_draft():
    pytest.importorskip("llama_cpp")
    return load_model("smollm2-135m-q2_k")


def plain_greedy(llm, ids, n):
    """Target-only greedy decoding through llama-cpp-python's own loop."""
    from specgguf.llama.model import plain_greedy as reference
    return reference(llm, ids, n)
