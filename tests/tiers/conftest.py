import pytest

# conformance.py is not a test_*.py module: without this its failed asserts show no values.
pytest.register_assert_rewrite("tests.tiers.conformance")
