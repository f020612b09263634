# Fixture notebooks are inputs of tests/test_cli.py (one of them fails on purpose), not notebooks to validate.
collect_ignore = ["fixtures"]
