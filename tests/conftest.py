import pytest
import torch

# Fixture notebooks are inputs of tests/test_cli.py (one of them fails on purpose), not notebooks to validate.
collect_ignore = ["fixtures"]


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run where CUDA is present and are skipped (with the reason shown) elsewhere."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu); none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
