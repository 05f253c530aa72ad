import pytest

import specgguf


@pytest.fixture(params=specgguf.kernels())
def kernel(request):
    """Run a test once per kernel path this CPU can run (scalar, avx2/neon)."""
    before = specgguf.get_kernel()
    specgguf.set_kernel(request.param)
    yield request.param
    specgguf.set_kernel(before)
