import pytest
import torch as th

# Tests run in parallel processes (pytest-xdist) on few cores: one torch thread each avoids oversubscription
th.set_num_threads(1)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not th.cuda.is_available(), reason="CUDA not available"))]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Run the test on the CPU and, where one is available, on a CUDA GPU (whose kernels and checks differ)."""
    return request.param
